"""Wire shapes of training jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from feature_party.jobs.status import Status
from feature_party.training.config import TrainingConfig
from shared.protocol import Id


class JobCreate(TrainingConfig):
    """``POST /v1/jobs``: what to train on, plus the training configuration."""

    feature_set_id: Id
    labels_id: Id = Field(description="id of a received release (POST /v1/received-labels)")

    def training(self) -> TrainingConfig:
        return TrainingConfig.model_validate(
            self.model_dump(exclude={"feature_set_id", "labels_id"})
        )


class JobAccepted(BaseModel):
    id: str
    status: Status


class JobRead(BaseModel):
    id: str
    status: Status
    feature_set_id: str
    labels_id: str
    config: dict[str, Any]
    progress: dict[str, Any] | None = Field(
        description="epoch, epochs, step, steps_per_epoch, loss, eta_seconds, examples_per_second"
    )
    metrics: dict[str, Any] | None
    model_id: str | None
    error: str | None
    attempts: int = Field(description="claims by workers; one that died or stalled counts")
    gpus: int = Field(
        description="GPUs a worker must have to claim it (its device: 1 for cuda, N for N; "
        "0 for auto and cpu); queued, it waits for such a worker"
    )
    lease_expires_at: datetime | None = Field(
        description="while running: when the worker's lease lapses unless it renews it"
    )
    stalled: bool = Field(
        description="running, but the worker let its lease lapse (it died, hung or lost the "
        "database): the next worker to claim the job resumes it from its last checkpoint"
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
