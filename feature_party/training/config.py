"""Hyper-parameters of a training job (the body of ``POST /v1/jobs`` minus ids)."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from feature_party.training.losses import CLASSIFICATION_LOSSES, LossName
from shared.protocol import Id

#: Most GPUs a job may ask for (as many as ``processes``). Unbounded, 2⁶³ was a 500
#: where the job's ``gpus`` column is written, and 2³² a job no worker could claim
#: (helper-86); an LP-MST run paid its first stage before failing on it.
MAX_GPUS = 64
#: A number of GPUs is a JSON integer ≥ 1 (strict: ``true`` and ``"2"`` are refused).
Device = Literal["auto", "cpu", "cuda"] | Annotated[StrictInt, Field(ge=1, le=MAX_GPUS)]


def gpus_needed(device: object) -> int:
    """GPUs a ``device`` setting asks for (as stored in a job's configuration)."""
    if device == "cuda":
        return 1
    return device if isinstance(device, int) and not isinstance(device, bool) else 0


#: The most classes a classifier may have: its output layer stays within memory
#: (a billion classes asked the worker for 768 GB).
MAX_CLASSES = 100_000

#: The widest hidden layer a job may ask for (two such layers: 2²⁸ weights, 1 GiB).
MAX_WIDTH = 16_384
#: The most weights between hidden layers (2²⁸: 1 GiB of float32, 4 with the
#: optimizer's state and gradients); sixteen layers of the widest would be 16 GiB.
MAX_HIDDEN_WEIGHTS = 2**28


class TrainingConfig(BaseModel):
    """Model, loss, optimizer and schedule. Defaults follow the papers' appendices
    (RMSProp, learning rate 1e-3 with cosine decay, batch 8192, embedding dim 8,
    L2 1e-4; Appendix E of ``rr-on-bins-regression.txt``).

    Strict: a value of the wrong JSON type (``"epochs": "2"``, ``"dropout": true``)
    is refused, not coerced into a job nobody asked for (integers still pass as
    numbers); LP-MST trains on releases paid for, with this configuration."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    task: Literal["regression", "classification"] = "regression"
    loss: LossName = "squared"
    num_classes: int | None = Field(
        default=None,
        ge=2,
        le=MAX_CLASSES,
        description="default: the release's number of outputs",
    )
    epochs: int = Field(default=10, ge=1, le=10_000)
    batch_size: int = Field(default=8192, ge=1, le=1_000_000)
    learning_rate: float = Field(default=1e-3, gt=0, le=10)
    optimizer: Literal["rmsprop", "adam", "sgd"] = "rmsprop"
    momentum: float = Field(default=0.9, ge=0, lt=1, description="SGD only")
    weight_decay: float = Field(default=1e-4, ge=0, le=1)
    schedule: Literal["cosine", "constant"] = "cosine"
    architecture: Literal["mlp", "cnn"] = Field(
        default="mlp",
        description="'mlp': embeddings + fully connected layers; 'cnn': the small CNN of "
        "labeldp-pro.txt Table 10a over images stored row-major in the numeric columns",
    )
    image_shape: list[int] = Field(
        default_factory=lambda: [1, 28, 28],
        min_length=3,
        max_length=3,
        description="cnn only: channels, height, width",
    )
    init_model_id: Id | None = Field(
        default=None,
        description="start from this model's weights and preprocessing (multi-stage "
        "training); its architecture and outputs must match",
    )
    embedding_dim: int = Field(default=8, ge=1, le=1024)
    hidden: list[int] = Field(default_factory=lambda: [128, 64], max_length=16)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    # Bounded where the worker's Arrow and torch calls take them (int64), so an
    # absurd value is a 422 here, not a job that fails with a TypeError.
    max_vocab: int = Field(
        default=100_000, ge=1, le=2**31 - 1, description="per categorical column"
    )
    min_count: int = Field(
        default=1, ge=1, le=2**31 - 1, description="rarer values go to the OOV bucket"
    )
    validation_fraction: float = Field(default=0.1, ge=0, lt=1)
    early_stopping_patience: int | None = Field(default=5, ge=1)
    mixup_alpha: float = Field(default=0.0, ge=0, description="classification only; 0 = off")
    seed: int = Field(
        default=0,
        ge=0,
        le=2**32 - 1,
        description="the initial weights, the validation split, the batches, mixup and "
        "dropout: the same job gives the same model on the CPU (GPU kernels may differ "
        "in the last bits)",
    )
    device: Device = Field(
        default="auto",
        description="'auto' (CUDA when present), 'cpu', 'cuda' (one GPU) or a number of GPUs",
    )
    processes: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="DistributedDataParallel processes; default: the number of GPUs "
        "(several CPU processes use the gloo backend)",
    )

    @model_validator(mode="before")
    @classmethod
    def _loss_follows_task(cls, data: object) -> object:
        """A loss left out is the task's, and a task left out is the loss's:
        ``{"task": "classification"}`` alone was refused for the regression default
        ``squared`` (helper-82), which ``cross-entropy`` alone also met."""
        if isinstance(data, dict):
            if "loss" not in data and data.get("task") == "classification":
                return {**data, "loss": "cross-entropy"}
            if "task" not in data and data.get("loss") in CLASSIFICATION_LOSSES:
                return {**data, "task": "classification"}
        return data

    @model_validator(mode="after")
    def _check(self) -> Self:
        classification = self.loss in CLASSIFICATION_LOSSES
        if classification != (self.task == "classification"):
            raise ValueError(f"loss {self.loss!r} does not fit task {self.task!r}")
        if self.mixup_alpha > 0 and not classification:
            raise ValueError("mixup is for classification")
        if isinstance(self.device, int) and self.device < 1:
            raise ValueError("device: the number of GPUs must be at least 1")
        if any(d < 1 for d in self.image_shape):
            raise ValueError("image_shape: channels, height and width must be positive")
        if any(not 1 <= h <= MAX_WIDTH for h in self.hidden):
            raise ValueError(f"hidden layer widths must be between 1 and {MAX_WIDTH}")
        weights = sum(a * b for a, b in zip(self.hidden, self.hidden[1:], strict=False))
        if weights > MAX_HIDDEN_WEIGHTS:
            raise ValueError(
                f"hidden layers {self.hidden} hold {weights:,} weights between them; at most "
                f"{MAX_HIDDEN_WEIGHTS:,} (fewer or narrower layers)"
            )
        return self

    def input_problem(self, numeric: int, categorical: int) -> str | None:
        """Why this model cannot read ``numeric`` + ``categorical`` columns, or None.
        Checked when a job is submitted and again when the model is built."""
        if self.architecture != "cnn":
            return None
        channels, height, width = self.image_shape
        pixels = channels * height * width
        if categorical or numeric != pixels:
            return (
                f"the cnn reads {channels}×{height}×{width} = {pixels} numeric pixel columns "
                f"and no categorical ones; the feature set gives {numeric} numeric and "
                f"{categorical} categorical"
            )
        return None

    @property
    def gpus(self) -> int:
        """GPUs a worker must have to take the job: 0 for ``auto`` and ``cpu``."""
        return gpus_needed(self.device)

    @property
    def world_size(self) -> int:
        """How many training processes the job runs."""
        if self.processes is not None:
            return self.processes
        return self.device if isinstance(self.device, int) else 1
