"""Request body limit, enforced while the body streams in (413 above it).

A declared ``Content-Length`` over the limit is refused before anything is read;
a chunked body is counted as it arrives and refused as soon as it passes the
limit, so an upload never fills the disk beyond it.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from label_party.exceptions import PayloadTooLargeError
from shared.errors import error_response


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(
                413,
                PayloadTooLargeError.code,
                f"request bodies are limited to {self.max_bytes} bytes",
                {"limit": self.max_bytes},
            )
            await response(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise PayloadTooLargeError(
                        f"request bodies are limited to {self.max_bytes} bytes",
                        {"limit": self.max_bytes},
                    )
            return message

        await self.app(scope, counting_receive, send)
