"""No more requests in flight than worker threads, so none waits for a thread
while it holds a database connection.

FastAPI runs a sync endpoint in the thread pool and then checks its answer there
again, inside the request's session, which by then holds a connection. With more
requests in flight than threads (anyio's 40), every thread could be waiting for a
connection held by a request that waited for a thread: a storm of 100 GETs on
Postgres jammed a party for the pool's 30 s timeout and answered most of them 503
``database_unavailable`` while the database was idle (helper-72). A request takes
one thread at a time; with at most as many in flight as there are threads, none
waits for one, so every connection's holder finishes and gives it back.

Past the bound a request is answered at once, 503 ``overloaded`` with
``Retry-After``, before anything of it is read.
"""

from __future__ import annotations

import anyio.to_thread
from starlette.types import ASGIApp, Receive, Scope, Send

from shared.errors import error_response

#: Seconds an ``overloaded`` answer asks a client to wait.
RETRY_AFTER_SECONDS = 1

#: Answered whatever the load: an orchestrator restarts a process whose liveness
#: probe fails, which an overload is no reason for.
UNLIMITED = frozenset({"/healthz"})


class RequestLimitMiddleware:
    """At most ``max_requests`` HTTP requests in flight; the rest 503 at once."""

    def __init__(self, app: ASGIApp, *, max_requests: int) -> None:
        self.app = app
        self.max_requests = max_requests
        self.in_flight = 0  # one event loop: no await between the test and the count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in UNLIMITED:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_requests:
            answer = error_response(
                503,
                "overloaded",
                f"the service is answering {self.max_requests} requests already "
                "(LABELDP_MAX_CONCURRENT_REQUESTS); retry shortly",
            )
            answer.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
            await answer(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


def enough_threads(max_requests: int) -> None:
    """Give the running event loop's thread pool a thread per request in flight
    (call it from the app's lifespan: the pool is the loop's)."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = max(int(limiter.total_tokens), max_requests)
