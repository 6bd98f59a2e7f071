"""Wire shapes of feature sets."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["numeric", "categorical", "ignored"]


class SchemaDeclaration(BaseModel):
    """The optional ``schema`` form field: column roles; other columns are ignored.
    Without it, roles are inferred (numbers → numeric, strings and booleans →
    categorical, anything else → ignored)."""

    model_config = ConfigDict(extra="forbid")

    numeric: list[str] = Field(default_factory=list)
    categorical: list[str] = Field(default_factory=list)


class ColumnInfo(BaseModel):
    name: str
    role: Role
    type: str = Field(description="the Arrow type as read from the file")


class FeatureSetRead(BaseModel):
    id: str
    name: str | None = None
    num_rows: int
    columns: list[ColumnInfo]
    created_at: datetime
