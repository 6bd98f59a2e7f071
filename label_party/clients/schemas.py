from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from shared.protocol import Name


class ClientCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    role: Literal["client", "auditor"] = "client"


class ClientCreated(BaseModel):
    """The token is shown once, here; only its hash is stored."""

    id: str
    name: str
    role: str
    token: str


class ClientRead(BaseModel):
    id: str
    name: str
    role: str
    created_at: datetime
    revoked_at: datetime | None = None


class GrantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    client_id: str


class GrantRead(BaseModel):
    dataset_id: str
    client_id: str
    created_at: datetime
