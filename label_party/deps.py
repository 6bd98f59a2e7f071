"""``Annotated`` dependency aliases shared by the routers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers

from label_party.auth import Principal, Role, authenticate, require, visible_dataset
from label_party.config import Settings
from label_party.db import Database, transaction
from label_party.exceptions import InvalidRequestError, UnauthorizedError
from label_party.trainings.schemas import TrainingSpec
from shared.limits import Authorizer
from shared.protocol import ReleaseCreate
from shared.spending import merged_key

T = TypeVar("T")
# The requests that spend budget and so take an idempotency key.
Spending = TypeVar("Spending", ReleaseCreate, TrainingSpec)


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """One transaction per request; writers (non-GET) serialize on SQLite."""
    db: Database = request.app.state.db
    write = request.method not in ("GET", "HEAD", "OPTIONS")
    with transaction(db.writer if write else db.reader) as session:
        yield session


async def in_worker_thread(work: Callable[[], T]) -> T:
    """Run an endpoint's whole database work in one worker-thread call.

    Write endpoints are ``async`` and call this once: a transaction that holds a
    lock (SQLite's write lock, a Postgres row lock) must never wait for a second
    worker thread — with every worker blocked on that lock, it would never get one.
    The request session commits afterwards without a worker token (FastAPI runs
    the exit of a dependency on its own limiter).
    """
    return await run_in_threadpool(work)


async def in_dataset_queue(request: Request, dataset_id: str, work: Callable[[], T]) -> T:
    """:func:`in_worker_thread` for a release, which locks the dataset's row to
    spend its budget: one release of this process a dataset at a time. The others
    wait in the event loop, holding neither a worker thread nor a pooled
    connection: 90 releases queued on one dataset's ``FOR UPDATE`` each held a
    connection, until the pool's 70 were gone and every other dataset's requests,
    authentication included, waited 19–26 s or were answered 503 (helper-85).
    Other processes are still serialized by the row lock itself."""
    async with request.app.state.dataset_queues.hold(dataset_id):
        return await in_worker_thread(work)


SettingsDep = Annotated[Settings, Depends(get_settings)]
# scope="function": commit before the response is sent, so a client that reads
# right after a 201 sees what it created.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


_bearer = HTTPBearer(auto_error=False, description="admin token or a client token")


def get_principal(
    request: Request,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """Authenticate in a short read transaction of its own (see :mod:`label_party.db`)."""
    token = credentials.credentials if credentials is not None else None
    db: Database = request.app.state.db
    with transaction(db.reader) as session:
        return authenticate(session, token, settings.admin_token_value)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def allowed(*roles: Role) -> Callable[[Principal], Principal]:
    """A dependency: the caller if its role is one of ``roles``, else 403.

    As a dependency it runs before FastAPI validates the JSON body, so a caller
    whose role may not use a route gets 403 for any body, never a 422 that tells
    it what the route would accept."""

    def dependency(principal: PrincipalDep) -> Principal:
        require(principal, *roles)
        return principal

    return dependency


AdminDep = Annotated[Principal, Depends(allowed("admin"))]
WriterDep = Annotated[Principal, Depends(allowed("admin", "client"))]


async def visible_before_upload(request: Request, principal: Principal, dataset_id: str) -> None:
    """404 before an upload's body is read when the caller may not see the dataset:
    a client granted another dataset made the service read and spool up to
    ``LABELDP_MAX_UPLOAD_BYTES`` for a 404 (helper-79). Its own short read
    transaction, as :func:`get_principal`: the request's session is left unbegun."""

    def check() -> None:
        with transaction(request.app.state.db.reader) as session:
            visible_dataset(session, principal, dataset_id)

    await run_in_threadpool(check)


def known_caller(app: FastAPI) -> Authorizer:
    """For :class:`shared.limits.BodyLimitMiddleware`: a body only from a caller whose
    token authenticates (the admin's, or a client's or auditor's not revoked), so an
    unknown token cannot make the service read, or spool to disk, an upload."""

    def refusal(token: str) -> str | None:
        settings: Settings = app.state.settings
        try:
            with transaction(app.state.db.reader) as session:
                authenticate(session, token, settings.admin_token_value)
        except UnauthorizedError as exc:
            return exc.message
        return None

    async def check(headers: Headers) -> str | None:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        return await run_in_threadpool(refusal, token)

    return check


def with_idempotency_key(request: Spending, header_key: str | None) -> Spending:
    """``request`` carrying the ``Idempotency-Key`` header's key as its own
    (:func:`shared.spending.merged_key`)."""
    try:
        key = merged_key(request.idempotency_key, header_key)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    return request.model_copy(update={"idempotency_key": key})
