from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.protocol import Name, PrivacyAmount, Task


class DatasetCreate(BaseModel):
    """``label_domain`` is ``{"min", "max", "clip"?, "step"? | "grid_size"?}`` for
    regression and ``{"num_classes"}`` or ``{"classes": [...]}`` for classification."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    task: Task
    label_domain: dict[str, Any]
    epsilon_budget: PrivacyAmount = Field(gt=0)
    delta_budget: PrivacyAmount = Field(default=Decimal(0), ge=0, le=1)


class DatasetRead(BaseModel):
    id: str
    name: str
    task: Task
    label_domain: dict[str, Any]
    epsilon_budget: PrivacyAmount
    delta_budget: PrivacyAmount
    num_labels: int | None
    parts: list[str] | None = None
    created_at: datetime
