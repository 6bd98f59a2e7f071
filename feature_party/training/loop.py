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
from feature_party.training.data import Preprocessing, Tensors
from feature_party.training.dataset import TrainingData
from feature_party.training.losses import Loss
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


def available_gpus() -> int:
    """The CUDA devices this process can use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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


def model_config(
    pre: Preprocessing, config: TrainingConfig, outputs: int
) -> TabularMLPConfig | ImageCNNConfig:
    """The shape of the model a job trains: its columns and vocabularies (``pre``),
    its configuration and its number of outputs."""
    if config.architecture == "cnn":
        channels, height, width = config.image_shape
        return ImageCNNConfig(channels=channels, height=height, width=width, outputs=outputs)
    return TabularMLPConfig(
        num_numeric=len(pre.numeric),
        vocab_sizes=pre.vocab_sizes,
        embedding_dim=config.embedding_dim,
        hidden=tuple(config.hidden),
        outputs=outputs,
        dropout=config.dropout,
    )


def build_model(data: TrainingData, config: TrainingConfig) -> TabularMLP | ImageCNN:
    pre = data.preprocessing
    shape = model_config(pre, config, data.loss.outputs)
    if isinstance(shape, ImageCNNConfig):
        problem = config.input_problem(len(pre.numeric), len(pre.categorical))
        if problem:
            raise ValueError(problem)
        return ImageCNN(shape)
    model = TabularMLP(shape)
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


@dataclass
class _Optimization:
    """The optimizers (one for a lazily updated embedding table, one for the rest)
    and their learning-rate schedules, stepped together."""

    mode: Literal["lazy", "dense"]
    optimizers: list[torch.optim.Optimizer]
    schedulers: list[torch.optim.lr_scheduler.LRScheduler]

    @classmethod
    def build(
        cls,
        model: TabularMLP | ImageCNN,
        config: TrainingConfig,
        mode: Literal["lazy", "dense"],
        total_steps: int,
    ) -> _Optimization:
        lazy = mode == "lazy" and model.embedding is not None
        model.sparse_gradients = lazy
        table = model.embedding.weight if lazy and model.embedding is not None else None
        optimizers = build_optimizers(model, config, lazy=[table] if table is not None else None)
        schedulers: list[torch.optim.lr_scheduler.LRScheduler] = [
            torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
            if config.schedule == "cosine"
            else torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
            for optimizer in optimizers
        ]
        return cls(mode, optimizers, schedulers)

    def step(self, loss: torch.Tensor) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        for optimizer in self.optimizers:
            optimizer.step()
        for scheduler in self.schedulers:
            scheduler.step()

    def state(self) -> dict[str, Any]:
        return {
            "optimizer": [optimizer.state_dict() for optimizer in self.optimizers],
            "scheduler": [scheduler.state_dict() for scheduler in self.schedulers],
            "embedding_updates": self.mode,
        }

    def load(self, checkpoint: dict[str, Any]) -> None:
        saved_optimizers, saved_schedulers = checkpoint["optimizer"], checkpoint["scheduler"]
        if isinstance(saved_optimizers, dict):  # written before lazy embedding updates
            saved_optimizers, saved_schedulers = [saved_optimizers], [saved_schedulers]
        for optimizer, state in zip(self.optimizers, saved_optimizers, strict=True):
            optimizer.load_state_dict(state)
        for scheduler, state in zip(self.schedulers, saved_schedulers, strict=True):
            scheduler.load_state_dict(state)


@dataclass
class _Record:
    """What carries from epoch to epoch, and through a checkpoint: the history and
    the best model so far on the noisy validation loss."""

    start_epoch: int = 0
    best_loss: float = math.inf
    bad_epochs: int = 0
    best_state: dict[str, torch.Tensor] | None = None
    history: list[dict[str, float]] = field(default_factory=list)

    @classmethod
    def resumed(cls, checkpoint: dict[str, Any]) -> _Record:
        return cls(
            checkpoint["epoch"],
            checkpoint["best_loss"],
            checkpoint["bad_epochs"],
            checkpoint["best_state"],
            checkpoint["history"],
        )

    def add(self, record: dict[str, float], validation: dict[str, float], model: nn.Module) -> None:
        self.history.append(record)
        if not validation:
            return
        if validation["loss"] < self.best_loss:
            self.best_loss, self.bad_epochs = validation["loss"], 0
            self.best_state = copy.deepcopy(model.state_dict())
        else:
            self.bad_epochs += 1

    def checkpoint(
        self, epoch: int, model: nn.Module, optimization: _Optimization
    ) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "model": model.state_dict(),
            **optimization.state(),
            "best_loss": self.best_loss,
            "bad_epochs": self.bad_epochs,
            "best_state": self.best_state,
            "history": self.history,
        }


@dataclass(frozen=True)
class _Shape:
    """How a run divides: this rank's share of each epoch, its batches, its steps."""

    epochs: int
    n_local: int
    per_rank_batch: int
    steps_per_epoch: int
    world_size: int

    @classmethod
    def of(cls, n: int, config: TrainingConfig, world_size: int) -> _Shape:
        n_local = n // world_size
        per_rank_batch = max(1, config.batch_size // world_size)
        steps = max(1, math.ceil(n_local / per_rank_batch))
        return cls(config.epochs, n_local, per_rank_batch, steps, world_size)

    def examples_per_second(self, epoch_seconds: float) -> float:
        return self.n_local * self.world_size / max(epoch_seconds, 1e-9)


@dataclass
class _Pace:
    """Steps taken since the run (or its resumption) started: examples/s and the ETA."""

    shape: _Shape
    started: float = field(default_factory=time.perf_counter)
    steps: int = 0

    def progress(self, epoch: int, step: int, loss: float, now: float) -> Progress:
        """Mid-epoch progress after ``step`` (0-based) of ``epoch`` (0-based)."""
        shape, per_step = self.shape, (now - self.started) / self.steps
        return Progress(
            epoch=epoch + 1,
            epochs=shape.epochs,
            step=step + 1,
            steps_per_epoch=shape.steps_per_epoch,
            loss=loss,
            eta_seconds=per_step * ((shape.epochs - epoch) * shape.steps_per_epoch - step - 1),
            examples_per_second=self.steps
            * shape.per_rank_batch
            * shape.world_size
            / (now - self.started),
        )

    def after_epoch(self, epoch: int, loss: float, seconds: float) -> Progress:
        """Progress at the end of ``epoch`` (0-based), which took ``seconds``."""
        shape = self.shape
        return Progress(
            epoch=epoch + 1,
            epochs=shape.epochs,
            step=shape.steps_per_epoch,
            steps_per_epoch=shape.steps_per_epoch,
            loss=loss,
            eta_seconds=seconds * (shape.epochs - epoch - 1),
            examples_per_second=shape.examples_per_second(seconds),
        )


def _initial_model(
    data: TrainingData,
    config: TrainingConfig,
    device: torch.device,
    init_state: dict[str, torch.Tensor] | None,
) -> TabularMLP | ImageCNN:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)  # the same initial weights on every rank and run
        model = build_model(data, config).to(device)
    if init_state is not None:
        try:
            model.load_state_dict(init_state)
        except RuntimeError as exc:
            raise ValueError(f"init_model_id: the model does not fit this job: {exc}") from None
    return model


@dataclass
class _Epochs:
    """Runs one epoch at a time over the training set (on the device), with what is
    the same for every epoch of the run."""

    net: nn.Module
    loss: Loss
    train_set: tuple[torch.Tensor, ...]  # numeric, categorical, targets
    optimization: _Optimization
    pace: _Pace
    seed: int
    rank: int
    beta: torch.distributions.Beta | None
    report: Reporter | None
    report_every: float

    def run(self, epoch: int) -> float:
        """Epoch ``epoch`` (0-based) over this rank's stride of a permutation seeded by
        the epoch, so every rank and every resumption agree; its mean training loss.
        Mixup's λ and dropout draw from the global generators, seeded by the epoch
        too: torch seeds them afresh in each process, so a job with either gave
        another model on every run, and a resumed one never a straight run's."""
        epoch_seed = self.seed * 1_000_003 + epoch
        device = self.train_set[0].device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(epoch_seed)
            return self._steps(epoch, torch.Generator().manual_seed(epoch_seed))

    def _steps(self, epoch: int, gen: torch.Generator) -> float:
        shape, device = self.pace.shape, self.train_set[0].device
        perm = torch.randperm(len(self.train_set[0]), generator=gen)[self.rank :: shape.world_size]
        # One gather per epoch, then every batch is a contiguous view.
        perm = perm[: shape.n_local].to(device)
        numeric, categorical, targets = (tensor[perm] for tensor in self.train_set)
        running = torch.zeros((), device=device)
        last_report = time.perf_counter()
        for step in range(shape.steps_per_epoch):
            rows = slice(step * shape.per_rank_batch, (step + 1) * shape.per_rank_batch)
            loss = self._batch_loss(numeric[rows], categorical[rows], targets[rows], gen)
            self.optimization.step(loss)
            running += loss.detach()
            self.pace.steps += 1
            now = time.perf_counter()
            if self.report is not None and now - last_report >= self.report_every:
                last_report = now
                self.report(self.pace.progress(epoch, step, float(running) / (step + 1), now))
        return float(running) / shape.steps_per_epoch

    def _batch_loss(
        self,
        numeric: torch.Tensor,
        categorical: torch.Tensor,
        y: torch.Tensor,
        gen: torch.Generator,
    ) -> torch.Tensor:
        """The batch's mean loss; with mixup, of the batch mixed with a shuffle of itself."""
        if self.beta is None:
            return self.loss.per_example(self.net(numeric, categorical), y).mean()
        lam = float(self.beta.sample())
        shuffle = torch.randperm(len(y), generator=gen).to(y.device)
        raw = self.net(numeric, categorical, (shuffle, lam))
        per_example = self.loss.per_example
        return (lam * per_example(raw, y) + (1 - lam) * per_example(raw, y[shuffle])).mean()


class TrainingDivergedError(ValueError):
    """The weights stopped being finite before any epoch was best on validation:
    the job fails, saying so, instead of "succeeding" with a model that predicts
    NaN and a ``train_loss`` of null. (After one was, training stops and that
    epoch's weights are the model: ``metrics.diverged_in_epoch`` says when.)"""

    def __init__(self, epoch: int, train_loss: float) -> None:
        super().__init__(
            f"training diverged in epoch {epoch}: the model's weights are no longer finite "
            f"(mean training loss {train_loss:.4g}); lower learning_rate, or use a loss "
            "and labels of a smaller scale"
        )


def _diverged(model: nn.Module) -> bool:
    """Whether a weight is no longer finite. Under DDP every rank holds the same
    weights, so every rank stops at the same epoch and none is left waiting in a
    collective that its peers have quit (a rank's own loss would not agree)."""
    return not all(bool(torch.isfinite(p).all()) for p in model.parameters())


def _metrics(
    record: _Record,
    data: TrainingData,
    *,
    stopped_early: bool,
    device: torch.device,
    world_size: int,
    mode: str,
) -> dict[str, Any]:
    last = record.history[-1] if record.history else {}
    best = record.best_loss
    metrics: dict[str, Any] = {
        "epochs_run": len(record.history),
        "resumed_from_epoch": record.start_epoch,
        "stopped_early": stopped_early,
        "train_examples": len(data.train),
        "validation_examples": len(data.validation),
        "train_loss": last.get("train_loss"),
        "best_validation_loss": best if math.isfinite(best) else None,
        "examples_per_second": last.get("examples_per_second"),
        "world_size": world_size,
        "device": str(device),
        "embedding_updates": mode,
    }
    if data.loss.classification and record.history:
        metrics["validation_noisy_accuracy"] = max(
            (h.get("validation_noisy_accuracy", 0.0) for h in record.history), default=None
        )
    return metrics


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
    model = _initial_model(data, config, device, init_state)
    ckpt: dict[str, Any] | None = None
    if checkpoint_path is not None and checkpoint_path.exists():
        ckpt = torch.load(checkpoint_path, map_location=device, weights_only=True)
    mode = embedding_updates
    if mode == "auto":
        mode = auto_embedding_updates(device, wrapped=wrap is not None, checkpoint=ckpt)
    if wrap is not None and mode == "lazy":
        raise ValueError("lazy embedding updates need unwrapped (non-DDP) training")
    shape = _Shape.of(len(data.train), config, world_size)
    optimization = _Optimization.build(model, config, mode, shape.steps_per_epoch * config.epochs)
    net = wrap(model) if wrap else model
    record = _Record()
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimization.load(ckpt)
        record = _Record.resumed(ckpt)

    on_device = (
        t.to(device) for t in (data.train.numeric, data.train.categorical, data.train_targets)
    )
    alpha = config.mixup_alpha
    beta = torch.distributions.Beta(alpha, alpha) if alpha > 0 else None
    pace = _Pace(shape)
    epochs = _Epochs(
        net,
        data.loss,
        tuple(on_device),
        optimization,
        pace,
        config.seed,
        rank,
        beta,
        report,
        report_every_seconds,
    )
    stopped_early = False
    diverged_in_epoch: int | None = None
    for epoch in range(record.start_epoch, config.epochs):
        started = time.perf_counter()
        train_loss = epochs.run(epoch)
        if _diverged(model):
            if record.best_state is None:
                raise TrainingDivergedError(epoch + 1, train_loss)
            diverged_in_epoch = epoch + 1  # the best earlier weights are the model
            break
        seconds = time.perf_counter() - started
        val = _evaluate(model, data, data.validation, data.validation_targets, device)
        entry = {
            "epoch": float(epoch + 1),
            "train_loss": train_loss,
            "seconds": seconds,
            "examples_per_second": shape.examples_per_second(seconds),
            **{f"validation_{k}": v for k, v in val.items()},
        }
        record.add(entry, val, model)
        if checkpoint_path is not None and rank == 0:
            save_torch_file(checkpoint_path, record.checkpoint(epoch + 1, model, optimization))
        if report is not None:
            report(pace.after_epoch(epoch, train_loss, seconds))
        patience = config.early_stopping_patience
        if val and patience is not None and record.bad_epochs >= patience:
            stopped_early = True
            break

    if record.best_state is not None:
        model.load_state_dict(record.best_state)
    model.sparse_gradients = False  # the returned model is for inference or dense training
    metrics = _metrics(
        record, data, stopped_early=stopped_early, device=device, world_size=world_size, mode=mode
    )
    metrics["diverged_in_epoch"] = diverged_in_epoch
    return TrainResult(model=model.cpu(), metrics=metrics, history=record.history)
