"""Every error leaves the service as ``shared.protocol.ErrorBody``.

Handlers never echo request input: pydantic's ``input`` is dropped from
validation errors, and unexpected exceptions answer with a fixed message (their
text may quote data; DESIGN.md §3.1).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from label_party.exceptions import LabelPartyError
from label_party.mechanisms.base import MechanismError
from shared.protocol import ErrorBody

logger = logging.getLogger("label_party.errors")

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "invalid_request",
}


def error_response(status: int, code: str, message: str, detail: Any = None) -> JSONResponse:
    body = ErrorBody(error=code, message=message, detail=detail)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def _domain(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LabelPartyError)
    return error_response(exc.status_code, exc.code, exc.message, exc.detail)


def _mechanism(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(422, "invalid_mechanism", str(exc))


def _validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors()
    ]
    return error_response(422, "invalid_request", "the request is not valid", errors)


def _http(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "error")
    return error_response(exc.status_code, code, str(exc.detail))


def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    logger.error("unhandled error", exc_info=exc)
    return error_response(500, "internal_error", "internal error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(LabelPartyError, _domain)
    app.add_exception_handler(MechanismError, _mechanism)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for the error statuses an endpoint may answer."""
    descriptions = {
        401: "Missing or unknown bearer token",
        403: "The caller's role may not do this",
        404: "Unknown, or not visible to the caller",
        409: "State conflict (budget exceeded, labels frozen, idempotency key reused)",
        413: "Upload larger than the configured limit",
        422: "Invalid request",
    }
    return {s: {"model": ErrorBody, "description": descriptions[s]} for s in statuses}
