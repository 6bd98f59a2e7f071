"""Wire shapes of received releases."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Self

import httpx
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from shared.protocol import Id, ReleaseCreate
from shared.tokens import BearerToken


def _usable_url(value: str) -> str:
    """A URL the HTTP client can use: a bad host (``http://[::1``) is a 422 here, not a
    500 when the client is built."""
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as exc:
        raise ValueError(f"not a usable URL: {exc}") from None
    if not url.host:
        raise ValueError("the URL has no host")
    return value


#: The labels party's base URL, as the features party's requests give it.
LabelsPartyUrl = Annotated[
    str, Field(pattern=r"^https?://", max_length=500), AfterValidator(_usable_url)
]
#: A labels-party dataset id, as the rows that name it store it.
DatasetId = Id


class ReceivedLabelsCreate(BaseModel):
    """``POST /v1/received-labels``: ask the labels party for a new release
    (``release``, which spends budget) or fetch an existing one (``release_id``,
    free). ``token`` is the labels party's bearer token; it is used for this
    request only and never stored."""

    model_config = ConfigDict(extra="forbid")

    feature_set_id: Id
    labels_party_url: LabelsPartyUrl
    token: BearerToken
    dataset_id: DatasetId
    release: ReleaseCreate | None = None
    release_id: Id | None = None

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
