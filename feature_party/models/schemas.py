"""Wire shapes of trained models and predictions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ModelRead(BaseModel):
    id: str
    job_id: str
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
