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
``Retry-After``, before anything of it is read (so a retry is always safe).
"""

from __future__ import annotations

import asyncio

import anyio.to_thread
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.errors import error_response

#: Seconds an ``overloaded`` answer asks a client to wait.
RETRY_AFTER_SECONDS = 1

#: Answered whatever the load: an orchestrator restarts a process whose liveness
#: probe fails, which an overload is no reason for. ``/readyz`` stays limited on
#: purpose: it runs a query on a thread, so unlimited it could be the request past
#: the thread pool's bound, and a saturated replica is rightly not ready.
UNLIMITED = frozenset({"/healthz"})


class RequestLimitMiddleware:
    """At most ``max_requests`` HTTP requests at work at once; beyond, 503 at once.

    A request is at work from its arrival to the start of its answer, except while
    it waits for its client to send more of its body: then it holds no thread and
    no connection (FastAPI reads a body before it resolves the session), and a
    client that sent its headers and stalled kept a place for as long as it liked:
    50 such sockets with an auditor's token locked the labels party out (helper-75).
    Back from the wait, it takes a place again, waiting for one if need be (a wait
    that holds nothing). From the start of its answer it holds no connection (the
    session committed before), so a slow reader of a download keeps no place.
    """

    def __init__(self, app: ASGIApp, *, max_requests: int) -> None:
        self.app = app
        self.max_requests = max_requests
        self._places: asyncio.Semaphore | None = None  # made in the serving loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in UNLIMITED:
            await self.app(scope, receive, send)
            return
        if self._places is None:
            self._places = asyncio.Semaphore(self.max_requests)
        places = self._places
        if places.locked():
            await _overloaded(self.max_requests)(scope, receive, send)
            return
        await places.acquire()
        held = True

        async def counted_receive() -> Message:
            nonlocal held
            if not held:  # answering already: a disconnect is waited for, not work
                return await receive()
            places.release()
            held = False
            try:
                return await receive()
            finally:
                await places.acquire()
                held = True

        async def counted_send(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and held:
                places.release()
                held = False
            await send(message)

        try:
            await self.app(scope, counted_receive, counted_send)
        finally:
            if held:
                places.release()


def _overloaded(max_requests: int) -> JSONResponse:
    answer = error_response(
        503,
        "overloaded",
        f"the service is answering {max_requests} requests already "
        "(LABELDP_MAX_CONCURRENT_REQUESTS); retry shortly",
    )
    answer.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return answer


def enough_threads(max_requests: int) -> None:
    """Give the running event loop's thread pool a thread per request in flight
    (call it from the app's lifespan: the pool is the loop's)."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = max(int(limiter.total_tokens), max_requests)
