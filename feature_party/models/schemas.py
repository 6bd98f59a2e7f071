"""Wire shapes of trained models and predictions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from feature_party.received_labels.schemas import LabelsPartyUrl
from shared.tokens import BearerToken


class ModelRead(BaseModel):
    id: str
    job_id: str | None = Field(description="the job that trained it; null for an imported model")
    source: str = Field(
        default="job", description="job | labels-party-training (a LabelDP-Pro release)"
    )
    training_id: str | None = None
    task: str
    loss: str
    metrics: dict[str, Any]
    created_at: datetime


class PredictRows(BaseModel):
    """JSON body of ``POST /v1/models/{id}/predict``: one object per row, with the
    training columns (``example_id`` optional: rows are numbered otherwise)."""

    model_config = ConfigDict(extra="forbid")

    rows: list[dict[str, Any]] = Field(min_length=1, max_length=1_000_000)


class Predictions(BaseModel):
    example_id: list[str]
    prediction: list[float] = Field(
        description="label units for regression (rate for Poisson), class index for classification"
    )


class ModelImport(BaseModel):
    """``POST /v1/models/import``: fetch a LabelDP-Pro model the labels party trained.
    ``token`` is the labels-party client token; it is used for this request only
    and never stored."""

    model_config = ConfigDict(extra="forbid")

    labels_party_url: LabelsPartyUrl
    token: BearerToken
    training_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_-]+$")
