"""FastAPI dependencies: the request session, settings and authentication."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.datastructures import Headers

from feature_party.config import Settings
from feature_party.db import Database
from shared.limits import Authorizer

_bearer = HTTPBearer(auto_error=False)


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """One unit of work per request: commit at the end, roll back on error."""
    database: Database = request.app.state.database
    with database.session() as session:
        yield session


UNAUTHORIZED = "missing or wrong bearer token"


def is_admin(authorization: str | None, admin_token: str) -> bool:
    """Whether an ``Authorization`` header carries the service's token (constant time)."""
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(
        token.strip().encode(), admin_token.encode()
    )


def admin_only(admin_token: str) -> Authorizer:
    """For :class:`shared.limits.BodyLimitMiddleware`: a body only with the token."""

    async def refusal(headers: Headers) -> str | None:
        return None if is_admin(headers.get("authorization"), admin_token) else UNAUTHORIZED

    return refusal


def require_admin(
    request: Request,
    # Declares the scheme in OpenAPI (the /docs "Authorize" button).
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    if not is_admin(request.headers.get("authorization"), request.app.state.admin_token):
        raise HTTPException(
            status_code=401, detail=UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"}
        )


# scope="function": commit before the response is sent, so a client that got a
# 201 can read what it created.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]
