"""Request ids and the access log, for both services' ASGI apps.

Each request gets an id (``X-Request-ID`` in, when printable and at most 100
characters, else a new one), stamped on every log line written while it runs
(:data:`shared.logging.request_id_var`) and returned in ``X-Request-ID``. Each
request then logs one line: method, route template (``/v1/jobs/{job_id}``, never the
raw path), status and seconds. Probes log at DEBUG: a health check every few seconds
would bury the requests that matter.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.logging import request_id_var

#: Routes polled by orchestrators and scrapers.
PROBES = frozenset({"/healthz", "/readyz", "/metrics"})

#: Called with (method, route template, status, seconds) after each request.
Observer = Callable[[str, str, int, float], None]


class RequestLogMiddleware:
    def __init__(self, app: ASGIApp, *, logger: str, observe: Observer | None = None) -> None:
        self.app = app
        self.log = logging.getLogger(logger)
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming if 0 < len(incoming) <= 100 and incoming.isprintable() else ""
        request_id = request_id or uuid.uuid4().hex
        token = request_id_var.set(request_id)
        status = 500
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - start
            route = getattr(scope.get("route"), "path", "unmatched")
            if self.observe is not None:
                self.observe(scope["method"], route, status, elapsed)
            fields = {"method": scope["method"], "route": route, "status": status,
                      "seconds": round(elapsed, 4)}  # fmt: skip
            level = logging.DEBUG if route in PROBES and status < 400 else logging.INFO
            self.log.log(level, "request", extra={"fields": fields})
            request_id_var.reset(token)
