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
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from feature_party.training.config import TrainingConfig
from feature_party.training.data import Tensors
from feature_party.training.dataset import TrainingData
from shared.torch_models import TabularMLP, TabularMLPConfig

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


@dataclass
class TrainResult:
    model: TabularMLP
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


def build_model(data: TrainingData, config: TrainingConfig) -> TabularMLP:
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


def _optimizer(model: nn.Module, config: TrainingConfig) -> torch.optim.Optimizer:
    params = model.parameters()
    lr, wd = config.learning_rate, config.weight_decay
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=wd)
    return torch.optim.RMSprop(params, lr=lr, weight_decay=wd)


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
    with torch.no_grad():
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


def _save_atomic(obj: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


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
) -> TrainResult:
    """Train and return the best model on the noisy validation loss (the last one
    without a validation split). ``wrap`` wraps the model (DDP); ``report`` is
    called about every ``report_every_seconds`` and after each epoch, and may
    raise :class:`Interrupted`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)  # the same initial weights on every rank and run
        model = build_model(data, config).to(device)
    net = wrap(model) if wrap else model
    optimizer = _optimizer(model, config)
    n_local = len(data.train) // world_size
    per_rank_batch = max(1, config.batch_size // world_size)
    steps_per_epoch = max(1, math.ceil(n_local / per_rank_batch))
    total_steps = steps_per_epoch * config.epochs
    scheduler: torch.optim.lr_scheduler.LRScheduler = (
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
        if config.schedule == "cosine"
        else torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    )

    start_epoch, best_loss, bad_epochs = 0, math.inf, 0
    best_state: dict[str, torch.Tensor] | None = None
    history: list[dict[str, float]] = []
    if checkpoint_path is not None and checkpoint_path.exists():
        ckpt = torch.load(checkpoint_path, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
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
            optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)
            optimizer.step()
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
            _save_atomic(
                {
                    "epoch": epoch + 1,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "best_loss": best_loss,
                    "bad_epochs": bad_epochs,
                    "best_state": best_state,
                    "history": history,
                },
                checkpoint_path,
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
    }
    if data.loss.classification and history:
        metrics["validation_noisy_accuracy"] = max(
            (h.get("validation_noisy_accuracy", 0.0) for h in history), default=None
        )
    return TrainResult(model=model.cpu(), metrics=metrics, history=history)
