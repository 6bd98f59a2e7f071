"""Every error leaves the service as ``shared.protocol.ErrorBody``; an unexpected one
with a fixed message (its text may quote data), storage refusing writes as 507."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.errors import (
    ServiceError,
    http_error_response,
    validation_error_response,
)
from shared.protocol import ErrorBody

#: Where a bug's exception is logged (``shared.errors.UnexpectedErrorMiddleware``).
ERROR_LOGGER = "feature_party.errors"

#: For ``responses=`` in route declarations (OpenAPI).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "missing or wrong bearer token"},
    404: {"model": ErrorBody, "description": "unknown id"},
    422: {"model": ErrorBody, "description": "invalid input"},
}


def install(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)  # FeaturePartyError and shared ones
    async def _domain(_: Request, exc: ServiceError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return http_error_response(exc.status_code, str(exc.detail), exc.headers)
