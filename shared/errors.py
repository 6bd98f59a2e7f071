"""The error shape both services answer with (``shared.protocol.ErrorBody``).

Each party keeps its own exception tree (``label_party.exceptions``,
``feature_party.errors``) on :class:`ServiceError`; its exception handlers render
them with :func:`error_response`, so a status, a stable code, a message and a
detail leave either service the same way.
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from shared.protocol import ErrorBody

#: Stable codes for errors raised by the framework itself (routing, auth headers).
HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
}


class ServiceError(Exception):
    """A domain error: ``status_code`` and ``code`` per class, ``code`` overridable."""

    status_code: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, detail: Any = None, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        if code is not None:
            self.code = code


def error_response(status: int, code: str, message: str, detail: Any = None) -> JSONResponse:
    """One ``ErrorBody`` response; 401 answers carry the bearer challenge."""
    body = ErrorBody(error=code, message=message, detail=detail)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def validation_detail(exc: RequestValidationError) -> list[dict[str, Any]]:
    """Where and why a request failed validation — never the input itself (it may
    hold data; DESIGN.md §3.1)."""
    return [
        {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors()
    ]
