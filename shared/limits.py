"""Request bodies are bounded, and only a caller the service knows may send one.

FastAPI reads and parses a body before it resolves the authentication dependency,
so without this an anonymous caller could make a service hold, or spool to disk,
any body up to the upload limit before hearing 401. The middleware runs first:

* a request that carries a body (POST, PUT, PATCH) is answered 401 before one byte
  of it is read unless ``authorized`` accepts its credentials (a known token, not
  merely a token);
* a multipart upload *to an operation that takes uploads* (:func:`upload_operations`) may
  reach ``max_upload_bytes``: a declared ``Content-Length`` above it is 413 before
  reading, a chunked one is counted as it streams and refused as soon as it
  passes, so it never fills the disk beyond;
* any other body may reach ``max_json_bytes``, a much smaller bound, since it is
  parsed whole in memory: it is read here, 413 above the bound, and handed on.
  That includes a body that calls itself multipart on a JSON route, which FastAPI
  would otherwise read whole into memory up to the upload limit. A JSON body that
  names a key twice in one object is 422 here (:mod:`shared.strict_json`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.errors import ServiceError, error_response
from shared.strict_json import duplicate_key

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: Bodies parsed for duplicate keys on the event loop; larger ones on a thread.
INLINE_PARSE_BYTES = 1 << 20


def is_multipart(content_type: str | None) -> bool:
    """Whether a request is a multipart upload (media types are case-insensitive)."""
    return (content_type or "").split(";")[0].strip().lower() == "multipart/form-data"


#: Why a caller may not send a body (the 401's message), or None when it may.
Authorizer = Callable[[Headers], Awaitable[str | None]]


def upload_operations(app: Any) -> list[tuple[str, re.Pattern[str]]]:
    """(method, path pattern) of each operation whose body may be a multipart upload,
    as the application's OpenAPI schema declares it: form or file parameters, or
    the body an endpoint that reads its form itself declares."""
    operations = []
    for path, methods in app.openapi().get("paths", {}).items():
        for method, operation in methods.items():
            content = (operation.get("requestBody") or {}).get("content") or {}
            if "multipart/form-data" in content:
                operations.append((method.upper(), compile_path(path)[0]))
    return operations


class BodyLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_upload_bytes: int,
        max_json_bytes: int,
        too_large: type[ServiceError],
        authorized: Authorizer,
    ) -> None:
        self.app = app
        self.max_upload_bytes = max_upload_bytes
        self.max_json_bytes = max_json_bytes
        self.too_large = too_large
        self.authorized = authorized
        self.uploads: list[tuple[str, re.Pattern[str]]] | None = None  # on the first body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = await self.authorized(headers)
        if refusal is not None:
            await error_response(401, "unauthorized", refusal)(scope, receive, send)
            return
        upload = is_multipart(headers.get("content-type")) and self._takes_uploads(scope)
        limit = self.max_upload_bytes if upload else self.max_json_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await self._refuse(limit, upload)(scope, receive, send)
            return
        if upload:
            await self._streamed(scope, receive, send, limit)
            return
        body = await _read_at_most(receive, limit)
        if body is None:
            await self._refuse(limit, upload)(scope, receive, send)
            return
        key = await _duplicate_key(body)
        if key is not None:
            message = f"the request body names the key {key!r} twice in one object"
            detail = [{"loc": ["body"], "msg": message, "type": "duplicate_key"}]
            await error_response(422, "invalid_request", message, detail)(scope, receive, send)
            return
        await self.app(scope, _replaying(body, receive), send)

    def _takes_uploads(self, scope: Scope) -> bool:
        """Whether the request goes to an operation that takes uploads (``scope["app"]``
        is the application; its routes are all included by the first request)."""
        if self.uploads is None:
            self.uploads = upload_operations(scope["app"])
        path, root = scope["path"], scope.get("root_path", "")
        path = path[len(root) :] if root and path.startswith(root) else path  # as routing does
        method = scope["method"]
        return any(m == method and pattern.match(path) for m, pattern in self.uploads)

    def _refuse(self, limit: int, upload: bool) -> JSONResponse:
        kind = "uploads" if upload else "non-upload request bodies"
        return error_response(
            413, self.too_large.code, f"{kind} are limited to {limit} bytes", {"limit": limit}
        )

    async def _streamed(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Hand the upload on as it streams, counting; past ``limit`` the read fails and
        whatever the app answers to that (FastAPI turns a failed form read into
        400) is replaced by the 413."""
        seen, refused, answered = 0, False, False

        async def counting_receive() -> Message:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    refused = True
                    raise self.too_large(f"uploads are limited to {limit} bytes", {"limit": limit})
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal answered
            if not refused:
                await send(message)
            elif not answered:
                answered = True
                await self._refuse(limit, True)(scope, receive, send)

        await self.app(scope, counting_receive, guarded_send)


async def _duplicate_key(body: bytes) -> str | None:
    """The key a JSON body names twice in one object, if it does. Every body is
    tried, whatever its content type says (FastAPI reads one without a type as
    JSON) and however it opens: ``json.loads`` reads UTF-8 after a byte-order mark,
    and UTF-16 and UTF-32, as FastAPI does, and a gate on a leading ``{`` let
    those through (helper-81). What is not JSON fails at its first bytes."""
    if not body:
        return None
    if len(body) <= INLINE_PARSE_BYTES:
        return duplicate_key(body)
    return await anyio.to_thread.run_sync(duplicate_key, body)


async def _read_at_most(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it passes ``limit`` bytes."""
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then the original's
    messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
