"""Every error leaves the service as ``shared.protocol.ErrorBody``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from feature_party.errors import FeaturePartyError
from shared.protocol import ErrorBody

#: For ``responses=`` in route declarations (OpenAPI).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "missing or wrong bearer token"},
    404: {"model": ErrorBody, "description": "unknown id"},
    422: {"model": ErrorBody, "description": "invalid input"},
}


def _body(status: int, code: str, message: str, detail: Any = None) -> JSONResponse:
    content = ErrorBody(error=code, message=message, detail=detail).model_dump(mode="json")
    return JSONResponse(status_code=status, content=content)


def install(app: FastAPI) -> None:
    @app.exception_handler(FeaturePartyError)
    async def _domain(_: Request, exc: FeaturePartyError) -> JSONResponse:
        return _body(exc.status_code, exc.code, exc.message, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")}
            for e in exc.errors()
        ]
        return _body(422, "invalid_input", "the request is invalid", detail)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}
        response = _body(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail))
        if exc.headers:
            response.headers.update(exc.headers)
        return response
