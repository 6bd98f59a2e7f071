"""Every error leaves the service as ``shared.protocol.ErrorBody``.

Handlers never echo request input: pydantic's ``input`` is dropped from
validation errors, and unexpected exceptions answer with a fixed message (their
text may quote data; DESIGN.md §3.1).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from label_party.mechanisms.base import MechanismError
from shared.errors import (
    ServiceError,
    error_response,
    http_error_response,
    validation_error_response,
)
from shared.protocol import ErrorBody

#: Where a bug's exception is logged (``shared.errors.UnexpectedErrorMiddleware``).
ERROR_LOGGER = "label_party.errors"


def _domain(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return exc.response()


def _mechanism(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(422, "invalid_mechanism", str(exc))


def _validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_error_response(exc)


def _http(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return http_error_response(exc.status_code, str(exc.detail), exc.headers)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _domain)  # LabelPartyError and shared ones
    app.add_exception_handler(MechanismError, _mechanism)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for the error statuses an endpoint may answer."""
    descriptions = {
        401: "Missing or unknown bearer token",
        403: "The caller's role may not do this",
        404: "Unknown, or not visible to the caller",
        409: "State conflict (budget exceeded, labels frozen, idempotency key reused)",
        413: "Upload larger than the configured limit",
        422: "Invalid request",
        429: "busy: as much of this work as the service takes at once is running; see Retry-After",
        500: "file_missing: the stored file is gone from the data directory (restore a backup)",
        507: "The data directory has no room or cannot be written (nothing spent)",
    }
    return {s: {"model": ErrorBody, "description": descriptions[s]} for s in statuses}
