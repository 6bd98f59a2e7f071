"""Wire shapes of LabelDP-Pro trainings."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.lease_queue import Status
from shared.protocol import Name, PrivacyAmount

Denoiser = Literal["noop", "self-span", "self-conv", "alt-conv"]
Optimizer = Literal["sgd", "momentum", "adam", "rmsprop"]
#: An image dimension or a layer width: a model of more parameters than any labels
#: party allows is refused by count; this bound keeps the count computable.
Dim = Annotated[int, Field(ge=1, le=1_000_000)]

#: The spec fields only some denoisers (Table 1 of ``labeldp-pro.txt``) or
#: architectures read, and which: ``noop`` projects nothing, only ALTCONV draws
#: an alternative batch, only the convex hulls have §3.3's smoothing.
_READ_BY: dict[str, frozenset[str]] = {
    "alt_batch_size": frozenset({"alt-conv"}),
    "projection_steps": frozenset({"self-span", "self-conv", "alt-conv"}),
    "projection_backend": frozenset({"self-span", "self-conv", "alt-conv"}),
    "projection_method": frozenset({"self-conv", "alt-conv"}),
    "smoothing": frozenset({"self-conv", "alt-conv"}),
    "image_shape": frozenset({"cnn"}),
    "hidden": frozenset({"mlp"}),
}


def unread_fields(denoiser: str, architecture: str) -> list[str]:
    """The spec fields that ``denoiser`` and ``architecture`` do not read."""
    return [name for name, readers in _READ_BY.items() if not readers & {denoiser, architecture}]


class TrainingSpec(BaseModel):
    """The multipart ``spec`` field of ``POST /v1/datasets/{id}/trainings``.

    Everything here is public configuration. ``delta`` defaults to 1/n, n the
    number of labelled examples the features cover; ``expected_batch_size`` to
    min(1024, n); ``projection_steps`` and ``smoothing`` to the paper's values
    (Appendix D.4, §3.3), ``projection_method`` to the paper's plain PGD;
    ``fista`` converges in about half the steps (bench/README.md);
    ``projection_backend`` ``dense`` holds the per-class gradients in memory (up to
    1 GiB, else it applies them by autodiff as the default does): the same
    projection, 9–16× faster a step on the Table-10a CNN. ``architecture``
    ``cnn`` is ``labeldp-pro.txt`` Table 10a's CNN over ``image_shape`` (the numeric
    columns are the pixels, row-major); ``mlp`` a fully connected net with ``hidden``
    layers. A field the denoiser or architecture does not read is refused if given
    and null in the resolved spec; null there, it is taken back as absent (a spec
    copied from a training's resolved one is accepted as it is).

    Strict: a training spends its (ε, δ) for good, so a value of the wrong JSON type
    (``"epochs": true``, ``"smoothing": false``, ``"hidden": ["16"]``) is refused,
    not coerced into a training nobody asked for (integers still pass as numbers).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    epsilon: PrivacyAmount = Field(gt=0)
    delta: PrivacyAmount | None = Field(default=None, gt=0, lt=1)
    denoiser: Denoiser = "alt-conv"
    architecture: Literal["cnn", "mlp"] = "cnn"
    image_shape: tuple[Dim, Dim, Dim] | None = (1, 28, 28)
    hidden: list[Dim] | None = Field(default_factory=lambda: [128, 64], max_length=8)
    epochs: int = Field(default=5, ge=1, le=10_000)
    expected_batch_size: int | None = Field(default=None, ge=1)
    # Bounded so that the noise (σ·C) and the steps stay finite in float32.
    clip_norm: float = Field(default=1.0, gt=0, le=1e4)
    learning_rate: float = Field(default=0.1, gt=0, le=1e3)
    optimizer: Optimizer = "sgd"
    alt_batch_size: int | None = Field(default=64, ge=1)
    projection_steps: int | None = Field(default=None, ge=0, le=100_000)
    projection_method: Literal["pgd", "fista"] | None = None
    projection_backend: Literal["autodiff", "dense"] | None = None
    smoothing: float | None = Field(default=None, ge=0, le=1)
    idempotency_key: Name | None = None

    @model_validator(mode="after")
    def _all_read(self) -> Self:
        """A field set for a denoiser or architecture that ignores it is refused: a
        training spends its (ε, δ) for good, and ``"denoiser": "noop", "smoothing":
        0.5`` is a mistake to show before that, not a setting to echo back."""
        unread = unread_fields(self.denoiser, self.architecture)
        given = [f for f in unread if f in self.model_fields_set and getattr(self, f) is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)}: not read by denoiser {self.denoiser!r} with architecture "
                f"{self.architecture!r}; leave {'it' if len(given) == 1 else 'them'} out"
            )
        # Null is the resolved spec's word for "not read", so that it can be sent
        # back; for a field that is read, null means its default, as for the others.
        # Either way the spec is then the one without it (its fingerprint too).
        for name in ("image_shape", "hidden", "alt_batch_size"):
            if getattr(self, name) is None:
                setattr(
                    self, name, type(self).model_fields[name].get_default(call_default_factory=True)
                )
        return self


class TrainingRead(BaseModel):
    """A training. ``epsilon``/``delta`` were charged when it was accepted;
    ``spec`` is the spec with its defaults filled in plus ``plan``, the noise plan
    computed at acceptance (``noise_multiplier``, ``sampling_rate``, ``steps``,
    ``steps_per_epoch``, ``amplification``; :mod:`label_party.trainings.plan`);
    ``accounting`` (the accountant's record, which ran that plan) and ``sha256``
    (of the model artifact, ``GET /v1/trainings/{id}/model``) appear once it
    succeeded."""

    id: str
    dataset_id: str
    status: Status
    epsilon: PrivacyAmount
    delta: PrivacyAmount
    spec: dict[str, Any]
    num_examples: int
    features_sha256: str
    progress: dict[str, Any] | None = Field(
        default=None, description="epoch, step, total_steps, eta_seconds, elapsed_seconds"
    )
    accounting: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    sha256: str | None = None
    error: str | None = None
    attempts: int = Field(description="claims by workers; one that died or stalled counts")
    lease_expires_at: datetime | None = Field(
        default=None,
        description="while running: when the worker's lease lapses unless it renews it",
    )
    stalled: bool = Field(
        default=False,
        description="running, but the worker let its lease lapse (it died, hung or lost the "
        "database): the next worker to claim the training resumes it from its last checkpoint",
    )
    idempotency_key: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
