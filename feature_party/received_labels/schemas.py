"""Wire shapes of received releases."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.protocol import ReleaseCreate
from shared.tokens import BearerToken


class ReceivedLabelsCreate(BaseModel):
    """``POST /v1/received-labels``: ask the labels party for a new release
    (``release``, which spends budget) or fetch an existing one (``release_id``,
    free). ``token`` is the labels party's bearer token; it is used for this
    request only and never stored."""

    model_config = ConfigDict(extra="forbid")

    feature_set_id: str
    labels_party_url: str = Field(pattern=r"^https?://")
    token: BearerToken
    dataset_id: str
    release: ReleaseCreate | None = None
    release_id: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.release is None) == (self.release_id is None):
            raise ValueError("give exactly one of release (a new release) or release_id")
        return self


class ReceivedLabelsRead(BaseModel):
    id: str
    feature_set_id: str
    dataset_id: str
    release_id: str
    num_labels: int
    matched: int = Field(description="received labels whose example_id is in the feature set")
    unmatched: int = Field(description="received labels with no feature row")
    sha256: str
    manifest: dict[str, Any]
    created_at: datetime
