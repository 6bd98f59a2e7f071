"""The training loop: tensors in, a fitted model out.

Data stays in tensors for the whole run: each epoch draws one permutation,
gathers the data in that order once, and takes batches as contiguous views (no
DataLoader, no per-example Python work). Under
DistributedDataParallel each rank trains on its stride of the same permutation
(seeded per epoch, so every rank agrees) and DDP averages gradients; every rank
evaluates the same validation set, so early-stopping decisions agree without
extra communication.

Checkpoints are written after every epoch (atomically, rank 0 only) and the loop
resumes from one, so a job whose worker died continues from its last epoch.

Embedding updates. In a single process on a CPU the embedding table gets sparse
gradients and the configured optimizer is applied lazily to the rows each batch touched
(``feature_party.training.optim``; the TF/Keras behaviour for sparse gradients),
which saves the table-sized gradient and optimizer passes of every step on CPU
(``bench/bench_training.py`` measures both). Under
DistributedDataParallel (``wrap``) gradients stay dense, as DDP all-reduces them,
and every row gets the dense update; on a GPU the dense update is the faster
one, so it is the default there too (:func:`auto_embedding_updates`).
``embedding_updates`` forces either.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from feature_party.training.config import TrainingConfig
from feature_party.training.data import Tensors
from feature_party.training.dataset import TrainingData
from feature_party.training.optim import build_optimizers
from shared.torch_files import save_torch_file
from shared.torch_models import ImageCNN, ImageCNNConfig, TabularMLP, TabularMLPConfig

__all__ = [
    "Interrupted",
    "Progress",
    "TrainResult",
    "build_model",
    "resolve_device",
    "train",
]


class Interrupted(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a progress callback to stop training (job cancelled or lease lost)."""


@dataclass(frozen=True)
class Progress:
    epoch: int
    epochs: int
    step: int
    steps_per_epoch: int
    loss: float | None
    eta_seconds: float | None
    examples_per_second: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "epochs": self.epochs,
            "step": self.step,
            "steps_per_epoch": self.steps_per_epoch,
            "loss": self.loss,
            "eta_seconds": self.eta_seconds,
            "examples_per_second": self.examples_per_second,
        }


Reporter = Callable[[Progress], None]
EmbeddingUpdates = Literal["auto", "lazy", "dense"]


@dataclass
class TrainResult:
    model: TabularMLP | ImageCNN
    metrics: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)


def resolve_device(config: TrainingConfig, local_rank: int = 0) -> torch.device:
    """``auto`` → CUDA when present; a GPU count or ``cuda`` → this rank's GPU."""
    want = config.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("the job asks for CUDA but this worker has no GPU")
    count = want if isinstance(want, int) else 1
    if count > torch.cuda.device_count():
        raise ValueError(
            f"the job asks for {count} GPUs; this worker has {torch.cuda.device_count()}"
        )
    return torch.device("cuda", local_rank)


def _image_model(data: TrainingData, config: TrainingConfig) -> ImageCNN:
    pre = data.preprocessing
    channels, height, width = config.image_shape
    problem = config.input_problem(len(pre.numeric), len(pre.categorical))
    if problem:
        raise ValueError(problem)
    return ImageCNN(
        ImageCNNConfig(channels=channels, height=height, width=width, outputs=data.loss.outputs)
    )


def build_model(data: TrainingData, config: TrainingConfig) -> TabularMLP | ImageCNN:
    if config.architecture == "cnn":
        return _image_model(data, config)
    pre = data.preprocessing
    model = TabularMLP(
        TabularMLPConfig(
            num_numeric=len(pre.numeric),
            vocab_sizes=pre.vocab_sizes,
            embedding_dim=config.embedding_dim,
            hidden=tuple(config.hidden),
            outputs=data.loss.outputs,
            dropout=config.dropout,
        )
    )
    # Start the output at the noisy-label mean (log mean for Poisson): fewer epochs
    # spent learning an offset. Noisy labels are a DP release: post-processing.
    if not data.loss.classification and len(data.train_targets):
        mean = float(data.train_targets.mean())
        bias = math.log(max(mean, 1e-6)) if data.loss.name == "poisson" else mean
        with torch.no_grad():
            model.out.bias.fill_(bias)
    return model


def _evaluate(
    model: nn.Module,
    data: TrainingData,
    tensors: Tensors,
    targets: torch.Tensor,
    device: torch.device,
) -> dict[str, float]:
    if len(tensors) == 0:
        return {}
    model.eval()
    total, correct = 0.0, 0.0
    with torch.inference_mode():
        for start in range(0, len(tensors), 65536):
            sl = slice(start, start + 65536)
            raw = model(tensors.numeric[sl].to(device), tensors.categorical[sl].to(device))
            y = targets[sl].to(device)
            total += float(data.loss.per_example(raw, y).sum())
            if data.loss.classification:
                correct += float((data.loss.predict(raw) == y.long()).sum())
    model.train()
    out = {"loss": total / len(tensors)}
    if data.loss.classification:
        out["noisy_accuracy"] = correct / len(tensors)
    return out


def auto_embedding_updates(
    device: torch.device, *, wrapped: bool, checkpoint: dict[str, Any] | None
) -> Literal["lazy", "dense"]:
    """What ``embedding_updates="auto"`` means: dense under DDP (it all-reduces
    dense gradients); a resumed run's own choice; else lazy on a CPU, where it
    saves the table-sized passes of every step, and dense on a GPU, where those
    passes are cheap and the sparse bookkeeping's small kernels cost more (1.13–1.49×
    faster dense on an H100; bench/README.md, "On a GPU")."""
    if wrapped:
        return "dense"
    if checkpoint is not None:
        return "lazy" if checkpoint.get("embedding_updates") == "lazy" else "dense"
    return "lazy" if device.type == "cpu" else "dense"


def train(
    data: TrainingData,
    config: TrainingConfig,
    *,
    device: torch.device,
    report: Reporter | None = None,
    checkpoint_path: Path | None = None,
    rank: int = 0,
    world_size: int = 1,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
    report_every_seconds: float = 1.0,
    embedding_updates: EmbeddingUpdates = "auto",
    init_state: dict[str, torch.Tensor] | None = None,
) -> TrainResult:
    """Train and return the best model on the noisy validation loss (the last one
    without a validation split). ``wrap`` wraps the model (DDP); ``report`` is
    called about every ``report_every_seconds`` and after each epoch, and may
    raise :class:`Interrupted`. ``embedding_updates``: ``lazy`` (sparse gradients,
    touched rows only), ``dense``, or ``auto`` (:func:`auto_embedding_updates`).
    ``init_state`` (an earlier model's weights, same architecture) replaces the
    random initialization."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)  # the same initial weights on every rank and run
        model = build_model(data, config).to(device)
    if init_state is not None:
        try:
            model.load_state_dict(init_state)
        except RuntimeError as exc:
            raise ValueError(f"init_model_id: the model does not fit this job: {exc}") from None
    ckpt: dict[str, Any] | None = None
    if checkpoint_path is not None and checkpoint_path.exists():
        ckpt = torch.load(checkpoint_path, map_location=device, weights_only=True)
    mode = embedding_updates
    if mode == "auto":
        mode = auto_embedding_updates(device, wrapped=wrap is not None, checkpoint=ckpt)
    if wrap is not None and mode == "lazy":
        raise ValueError("lazy embedding updates need unwrapped (non-DDP) training")
    lazy = mode == "lazy" and model.embedding is not None
    model.sparse_gradients = lazy
    net = wrap(model) if wrap else model
    table = model.embedding.weight if lazy and model.embedding is not None else None
    optimizers = build_optimizers(model, config, lazy=[table] if table is not None else None)
    n_local = len(data.train) // world_size
    per_rank_batch = max(1, config.batch_size // world_size)
    steps_per_epoch = max(1, math.ceil(n_local / per_rank_batch))
    total_steps = steps_per_epoch * config.epochs
    schedulers: list[torch.optim.lr_scheduler.LRScheduler] = [
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
        if config.schedule == "cosine"
        else torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        for optimizer in optimizers
    ]

    start_epoch, best_loss, bad_epochs = 0, math.inf, 0
    best_state: dict[str, torch.Tensor] | None = None
    history: list[dict[str, float]] = []
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        saved_optimizers, saved_schedulers = ckpt["optimizer"], ckpt["scheduler"]
        if isinstance(saved_optimizers, dict):  # written before lazy embedding updates
            saved_optimizers, saved_schedulers = [saved_optimizers], [saved_schedulers]
        for optimizer, state in zip(optimizers, saved_optimizers, strict=True):
            optimizer.load_state_dict(state)
        for scheduler, state in zip(schedulers, saved_schedulers, strict=True):
            scheduler.load_state_dict(state)
        start_epoch, best_loss, bad_epochs = ckpt["epoch"], ckpt["best_loss"], ckpt["bad_epochs"]
        best_state, history = ckpt["best_state"], ckpt["history"]

    num = data.train.numeric.to(device)
    cat = data.train.categorical.to(device)
    tgt = data.train_targets.to(device)
    loss_fn = data.loss
    mixup = config.mixup_alpha > 0
    beta = torch.distributions.Beta(config.mixup_alpha, config.mixup_alpha) if mixup else None
    t_start = time.perf_counter()
    steps_done = 0
    stopped_early = False
    for epoch in range(start_epoch, config.epochs):
        gen = torch.Generator().manual_seed(config.seed * 1_000_003 + epoch)
        perm = torch.randperm(len(data.train), generator=gen)[rank::world_size][:n_local]
        epoch_start = last_report = time.perf_counter()
        # One gather per epoch, then every batch is a contiguous view.
        perm = perm.to(device)
        num_e, cat_e, tgt_e = num[perm], cat[perm], tgt[perm]
        running = torch.zeros((), device=device)
        for step in range(steps_per_epoch):
            batch = slice(step * per_rank_batch, (step + 1) * per_rank_batch)
            y = tgt_e[batch]
            if beta is not None:
                lam = float(beta.sample())
                shuffle = torch.randperm(len(y), generator=gen).to(device)
                raw = net(num_e[batch], cat_e[batch], (shuffle, lam))
                loss = (
                    lam * loss_fn.per_example(raw, y)
                    + (1 - lam) * loss_fn.per_example(raw, y[shuffle])
                ).mean()
            else:
                loss = loss_fn.per_example(net(num_e[batch], cat_e[batch]), y).mean()
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)
            for optimizer in optimizers:
                optimizer.step()
            for scheduler in schedulers:
                scheduler.step()
            running += loss.detach()
            steps_done += 1
            now = time.perf_counter()
            if report is not None and now - last_report >= report_every_seconds:
                last_report = now
                per_step = (now - t_start) / steps_done
                report(
                    Progress(
                        epoch=epoch + 1,
                        epochs=config.epochs,
                        step=step + 1,
                        steps_per_epoch=steps_per_epoch,
                        loss=float(running) / (step + 1),
                        eta_seconds=per_step
                        * ((config.epochs - epoch) * steps_per_epoch - step - 1),
                        examples_per_second=steps_done
                        * per_rank_batch
                        * world_size
                        / (now - t_start),
                    )
                )
        epoch_seconds = time.perf_counter() - epoch_start
        train_loss = float(running) / steps_per_epoch
        val = _evaluate(model, data, data.validation, data.validation_targets, device)
        record = {
            "epoch": float(epoch + 1),
            "train_loss": train_loss,
            "seconds": epoch_seconds,
            "examples_per_second": n_local * world_size / max(epoch_seconds, 1e-9),
            **{f"validation_{k}": v for k, v in val.items()},
        }
        history.append(record)
        if val:
            if val["loss"] < best_loss:
                best_loss, bad_epochs = val["loss"], 0
                best_state = copy.deepcopy(model.state_dict())
            else:
                bad_epochs += 1
        if checkpoint_path is not None and rank == 0:
            save_torch_file(
                checkpoint_path,
                {
                    "epoch": epoch + 1,
                    "model": model.state_dict(),
                    "optimizer": [optimizer.state_dict() for optimizer in optimizers],
                    "scheduler": [scheduler.state_dict() for scheduler in schedulers],
                    "embedding_updates": mode,
                    "best_loss": best_loss,
                    "bad_epochs": bad_epochs,
                    "best_state": best_state,
                    "history": history,
                },
            )
        if report is not None:
            report(
                Progress(
                    epoch=epoch + 1,
                    epochs=config.epochs,
                    step=steps_per_epoch,
                    steps_per_epoch=steps_per_epoch,
                    loss=train_loss,
                    eta_seconds=epoch_seconds * (config.epochs - epoch - 1),
                    examples_per_second=record["examples_per_second"],
                )
            )
        patience = config.early_stopping_patience
        if val and patience is not None and bad_epochs >= patience:
            stopped_early = True
            break

    if best_state is not None:
        model.load_state_dict(best_state)
    model.sparse_gradients = False  # the returned model is for inference or dense training
    last = history[-1] if history else {}
    metrics: dict[str, Any] = {
        "epochs_run": len(history),
        "resumed_from_epoch": start_epoch,
        "stopped_early": stopped_early,
        "train_examples": len(data.train),
        "validation_examples": len(data.validation),
        "train_loss": last.get("train_loss"),
        "best_validation_loss": best_loss if math.isfinite(best_loss) else None,
        "examples_per_second": last.get("examples_per_second"),
        "world_size": world_size,
        "device": str(device),
        "embedding_updates": mode,
    }
    if data.loss.classification and history:
        metrics["validation_noisy_accuracy"] = max(
            (h.get("validation_noisy_accuracy", 0.0) for h in history), default=None
        )
    return TrainResult(model=model.cpu(), metrics=metrics, history=history)
