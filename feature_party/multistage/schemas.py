"""Wire shapes of LP-MST runs (``/v1/multistage``)."""

from __future__ import annotations

import math
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from feature_party.received_labels.schemas import DatasetId, LabelsPartyUrl
from feature_party.training.config import TrainingConfig
from shared.protocol import EPSILON_SCALE, Id, ledger_units
from shared.tokens import BearerToken

#: The split of the examples over two stages in ``labeldp-pro.txt`` Appendix D.1.
TWO_STAGE_SPLIT = (0.4, 0.6)


class RunStatus(StrEnum):
    """``running`` → ``succeeded`` | ``failed``; ``interrupted`` when the service
    stopped mid-run (the token lived only in its memory): ``POST
    /v1/multistage/{id}/resume`` with the token continues where it stopped.
    ``DELETE /v1/multistage/{id}`` ends any but a succeeded run as ``cancelled``,
    for good."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"


def _classifier_defaults(cls: type, value: object) -> object:
    """LP-MST trains classifiers: a training without a task (or loss) is one, so
    what is refused is what was asked for, not the default regression task."""
    if isinstance(value, dict):
        return {"task": "classification", "loss": "cross-entropy", **value}
    return value


def _check_training(training: TrainingConfig) -> None:
    if training.task != "classification":
        raise ValueError("LP-MST trains classifiers: training.task must be classification")
    if training.init_model_id is not None:
        raise ValueError("training.init_model_id is set by each stage; leave it out")
    if training.loss == "rr-debiased-cross-entropy":
        # It undoes K-ary RR; stages ≥ 2 release RRTop-k (rr-with-prior), whose
        # flips that correction would get wrong.
        raise ValueError("LP-MST trains on RRTop-k labels: use loss cross-entropy")


class MultistageCreate(BaseModel):
    """``POST /v1/multistage``: train with LP-MST on ``feature_set_id`` and the labels
    of ``dataset_id``. ``token`` (the labels party's client token) is held in the
    service's memory while the run lasts and never stored. Strict, as its stages
    spend ε: ``"epsilon": "1"`` or ``"stages": true`` is refused, not coerced."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    feature_set_id: Id
    labels_party_url: LabelsPartyUrl
    token: BearerToken
    dataset_id: DatasetId
    epsilon: float = Field(gt=0, description="ε of every stage's release; each part pays it once")
    stages: int = Field(default=2, ge=1, le=10, description="T")
    fractions: list[float] | None = Field(
        default=None,
        description="share of the examples in each stage; default 40/60 for two stages "
        "(labeldp-pro.txt D.1), equal shares otherwise",
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        description="seed of the random, label-independent partition; default: a "
        "fresh random one (recorded in the run)",
    )
    part_prefix: str = Field(
        default="lpmst", pattern=r"^[A-Za-z0-9_.-]{1,100}$", description="parts are PREFIX-1 …"
    )
    temperature: float = Field(
        default=1.0, gt=0, le=100, description="softmax temperature of the stage priors"
    )
    filter_top_k: bool = Field(
        default=True,
        description="drop an earlier stage's label when it is outside the current "
        "model's top-k* classes for its example (supplement, Appendix B)",
    )
    training: TrainingConfig = Field(
        default_factory=lambda: TrainingConfig(task="classification", loss="cross-entropy")
    )

    _classifier_by_default = field_validator("training", mode="before")(_classifier_defaults)

    @field_validator("epsilon")
    @classmethod
    def _ledger_holds(cls, value: float) -> float:
        """Refused here, not by stage 1's release once the partition plan, which
        cannot be replaced, is registered at the labels party."""
        ledger_units(Decimal(str(value)), EPSILON_SCALE, "epsilon")
        return value

    @model_validator(mode="after")
    def _check(self) -> Self:
        _check_training(self.training)
        if self.fractions is not None:
            if len(self.fractions) != self.stages:
                raise ValueError("fractions needs one share per stage")
            if any(f <= 0 for f in self.fractions) or not math.isclose(
                sum(self.fractions), 1.0, abs_tol=1e-9
            ):
                raise ValueError("fractions must be positive and sum to 1")
        return self

    def shares(self) -> list[float]:
        if self.fractions is not None:
            return list(self.fractions)
        if self.stages == 2:
            return list(TWO_STAGE_SPLIT)
        return [1.0 / self.stages] * self.stages

    def public_config(self, seed: int) -> dict[str, Any]:
        """What the run row stores: everything but the token, with the seed fixed."""
        data = self.model_dump(mode="json", exclude={"token", "feature_set_id", "dataset_id"})
        data.update(seed=seed, fractions=self.shares())
        return data


class MultistageResume(BaseModel):
    """``POST /v1/multistage/{id}/resume``. ``training``, if given, replaces the
    run's training configuration for every stage not yet trained (a failed stage's
    included): the fix for a training that failed for its configuration (a device
    the workers lack, a model too large), since the releases are paid for."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    token: BearerToken
    training: TrainingConfig | None = None

    _classifier_by_default = field_validator("training", mode="before")(_classifier_defaults)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.training is not None:
            _check_training(self.training)
        return self


class StageRead(BaseModel):
    """One stage: its part, the prior set and release it used, the labels it trained
    on and the model it produced (fields appear as the stage progresses)."""

    stage: int
    part: str
    num_examples: int
    prior_set_id: str | None = None
    release_id: str | None = None
    received_labels_id: str | None = None
    mean_k_star: float | None = Field(
        default=None, description="mean RRTop-k set size of the release (stages ≥ 2)"
    )
    training_labels_id: str | None = None
    num_training_labels: int | None = None
    num_filtered: int | None = Field(
        default=None, description="earlier-stage labels dropped by the top-k filter"
    )
    job_id: str | None = None
    failed_jobs: list[str] = Field(
        default_factory=list,
        description="earlier jobs of this stage that failed; a resume trained it again",
    )
    job_status: str | None = None
    job_progress: dict[str, Any] | None = None
    model_id: str | None = None
    metrics: dict[str, Any] | None = None


class MultistageRead(BaseModel):
    id: str
    status: RunStatus
    feature_set_id: str
    dataset_id: str
    labels_party_url: str
    config: dict[str, Any]
    partition_plan_id: str | None
    stages: list[StageRead]
    model_id: str | None = Field(description="the last stage's model, once the run succeeded")
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
