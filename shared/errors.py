"""The error shape both services answer with (``shared.protocol.ErrorBody``).

Each party keeps its own exception tree (``label_party.exceptions``,
``feature_party.errors``) on :class:`ServiceError`; its exception handlers render
them with :func:`error_response`, so a status, a stable code, a message and a
detail leave either service the same way.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.protocol import ErrorBody

#: Stable codes for errors raised by the framework itself (routing, auth headers).
HTTP_CODES = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "invalid_request",
}


class ServiceError(Exception):
    """A domain error: ``status_code`` and ``code`` per class, ``code`` overridable."""

    status_code: int = 500
    code: str = "internal_error"
    #: Seconds the answer's ``Retry-After`` asks a client to wait, if it should retry.
    retry_after: int | None = None

    def __init__(self, message: str, detail: Any = None, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        if code is not None:
            self.code = code

    def response(self) -> JSONResponse:
        """This error as its ``ErrorBody`` answer."""
        answer = error_response(self.status_code, self.code, self.message, self.detail)
        if self.retry_after is not None:
            answer.headers["Retry-After"] = str(self.retry_after)
        return answer


def error_response(status: int, code: str, message: str, detail: Any = None) -> JSONResponse:
    """One ``ErrorBody`` response; 401 answers carry the bearer challenge."""
    body = ErrorBody(error=code, message=message, detail=detail)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def validation_error_response(exc: RequestValidationError) -> JSONResponse:
    """A request the framework could not parse: 422 ``invalid_request``, as each
    service's own refusals of invalid input."""
    return error_response(
        422, "invalid_request", "the request is not valid", validation_detail(exc)
    )


def http_error_response(status: int, detail: str, headers: Any = None) -> JSONResponse:
    """An error the framework raised (routing, methods, auth headers). Its 400s (a
    body that is not JSON, or not UTF-8; a multipart body without its boundary)
    are 422 ``invalid_request``, as every other body the services cannot accept."""
    if status == 400:
        status = 422
    response = error_response(status, HTTP_CODES.get(status, "http_error"), detail)
    if headers:
        response.headers.update(headers)
    return response


def validation_detail(exc: RequestValidationError) -> list[dict[str, Any]]:
    """Where and why a request failed validation — never the input itself (it may
    hold data; DESIGN.md §3.1)."""
    return [
        {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors()
    ]


#: OS errors that say the service's storage refuses writes: the operator's to fix,
#: not a bug, so they are 507 ``storage_unavailable`` rather than a bare 500.
#: (EFBIG: a file-size limit, ``ulimit -f`` or the filesystem's.)
STORAGE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}
)


#: Of those, the ones that say the disk had no room for what was written, so
#: whether they happen depends on how much was written.
CAPACITY_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


#: The database's own words for a full disk or a read-only file: SQLite's result
#: codes (its file is in the data directory) and Postgres's SQLSTATE 53100.
DATABASE_STORAGE_ERRORS = frozenset(
    {"SQLITE_FULL", "SQLITE_IOERR_WRITE", "SQLITE_IOERR_SHMSIZE", "SQLITE_READONLY"}
)


def storage_problem(exc: BaseException) -> str | None:
    """What refused a write, if ``exc`` is storage refusing one: the errno's name
    (``ENOSPC``…), SQLite's result code (``SQLITE_FULL``…) or Postgres's SQLSTATE
    (``53100``, disk full); else None."""
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        return errno.errorcode[exc.errno]
    if isinstance(exc, DBAPIError):
        orig = exc.orig
        name = getattr(orig, "sqlite_errorname", None)
        if name in DATABASE_STORAGE_ERRORS:
            return str(name)
        if getattr(orig, "sqlstate", None) == "53100":  # disk_full
            return "53100"
    return None


#: Of the storage problems, those that freeing space mends (a full disk, a quota, a
#: full database): work refused for them is retried for as long as they last; for
#: the others (permissions, a read-only mount, a file-size limit) it has its
#: attempts, as any failure.
DISK_FULL = frozenset({"ENOSPC", "EDQUOT", "SQLITE_FULL", "53100"})


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the database on it) has no room left."""
    return storage_problem(exc) in DISK_FULL


def storage_message(problem: str) -> str:
    """What a 507 ``storage_unavailable`` says (``problem``: the errno's name)."""
    return (
        f"the service could not write to its storage ({problem}): its operator must free "
        "space, raise a limit or fix permissions; retry afterwards"
    )


#: Seconds a 503 ``database_unavailable`` asks a client to wait (``Retry-After``):
#: about what a Postgres restart or failover takes.
DATABASE_RETRY_AFTER_SECONDS = 5


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database is not answering now (down, restarting,
    failing over, out of connections, locked by a writer) rather than that the
    request or the code is wrong: the driver's operational and interface errors,
    a connection the pool found dead, and the pool's own timeout."""
    if isinstance(exc, PoolTimeoutError):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    return exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError)


def unexpected_error_response(logger: logging.Logger, exc: BaseException) -> JSONResponse:
    """An exception no handler knows: 507 when storage refused a write (the errno,
    never a path or the text), 422 for a value the database cannot hold (its
    ``DataError``), 503 when the database is not answering (a client retries,
    with its idempotency key where it spends: a commit cut off may have landed),
    else 500 with a fixed message; logged either way."""
    logger.error("unhandled error", exc_info=exc)
    problem = storage_problem(exc)
    if problem is not None:
        return error_response(
            507, "storage_unavailable", storage_message(problem), {"errno": problem}
        )
    if isinstance(exc, UnicodeEncodeError) or isinstance(
        getattr(exc, "orig", None), UnicodeEncodeError
    ):
        # Text JSON lets through that no encoding holds: a lone surrogate ("\ud800")
        # reached the database driver as a 500 (helper-70).
        return error_response(
            422,
            "invalid_request",
            "a text in the request is not valid Unicode (a lone surrogate)",
        )
    if isinstance(exc, DataError):
        # A value the request carried that the database cannot hold or compare: a
        # NUL character (Postgres text cannot), or one longer than its column.
        return error_response(
            422,
            "invalid_request",
            "a value in the request cannot be stored by the database (a NUL character, "
            "or longer than the service keeps)",
        )
    if isinstance(exc, PoolTimeoutError):
        # The database answers; this process's connections are all in use.
        response = error_response(
            503,
            "database_busy",
            "every database connection of the service is in use; retry shortly",
        )
        response.headers["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
        return response
    if database_unavailable(exc):
        response = error_response(
            503,
            "database_unavailable",
            "the service's database is not answering; retry shortly",
        )
        response.headers["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
        return response
    return error_response(500, "internal_error", "internal error")


class UnexpectedErrorMiddleware:
    """Answers an exception no handler took (a bug) with :func:`unexpected_error_response`,
    inside the middleware stack.

    Starlette answers those in its outermost layer and then re-raises, so the
    access log and metrics saw an exception rather than the 500 (or 507) the client
    got, the answer lacked its request id, and uvicorn closed the keep-alive
    connection. An exception after the response started is re-raised: closing the
    connection is the only way left to tell the client its body is cut short.
    """

    def __init__(self, app: ASGIApp, *, logger: str) -> None:
        self.app = app
        self.log = logging.getLogger(logger)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def noting_start(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, noting_start)
        except Exception as exc:
            if started:
                raise
            await unexpected_error_response(self.log, exc)(scope, receive, send)
