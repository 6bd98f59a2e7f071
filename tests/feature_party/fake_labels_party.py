"""A tiny stand-in for the labels party (until the real one is wired into these
tests): serves fixed noisy labels as releases, speaking shared.protocol, and can
be told to misbehave (5xx, dropped connections, a wrong hash, budget refusal).
It runs as a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import uvicorn
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response

from shared.protocol import PARQUET_MEDIA_TYPE, ReleaseCreate, ReleaseRead

TOKEN = "labels-party-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parquet_bytes(example_ids: list[str], labels: list[float]) -> bytes:
    buf = io.BytesIO()
    table = pa.table(
        {"example_id": pa.array(example_ids, pa.string()), "label": pa.array(labels, pa.float64())}
    )
    pq.write_table(table, buf)
    return buf.getvalue()


@dataclass
class FakeLabelsParty:
    """State and misbehaviour switches; ``url`` once started."""

    dataset_id: str = "ds-1"
    labels: bytes = b""
    num_labels: int = 0
    budget: float = 10.0
    spent: float = 0.0
    mechanism: dict[str, Any] = field(
        default_factory=lambda: {"name": "laplace", "epsilon": 1.0, "params": {}}
    )
    task: str | None = None
    """the manifest's task (None: as a labels party older than that field)"""
    fail_posts: int = 0
    """answer this many release POSTs with 503 *after* spending (as a crash would)"""
    fail_gets: int = 0
    """answer this many label downloads with 500"""
    corrupt_gets: int = 0
    """serve this many label downloads with a flipped byte (200, a corrupt transfer)"""
    wrong_hash: bool = False
    on_release: Callable[[], None] | None = None
    """called while a release POST is being answered"""
    on_download: Callable[[], None] | None = None
    """called while a release's labels GET is being answered"""
    mechanism_fails: bool = False
    """charge every new release and answer 422 release_failed (replayed by key)"""
    failed_keys: set[str] = field(default_factory=set)
    releases: dict[str, ReleaseRead] = field(default_factory=dict)
    by_key: dict[str, str] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def set_labels(self, example_ids: list[str], labels: list[float]) -> None:
        self.labels = parquet_bytes(example_ids, labels)
        self.num_labels = len(example_ids)

    def app(self) -> FastAPI:
        app = FastAPI()

        def error(status: int, code: str, message: str) -> JSONResponse:
            return JSONResponse({"error": code, "message": message, "detail": None}, status)

        @app.middleware("http")
        async def auth(request: Request, call_next: Any) -> Response:
            self.requests.append(f"{request.method} {request.url.path}")
            if request.headers.get("authorization") != f"Bearer {TOKEN}":
                return error(401, "unauthorized", "bad token")
            response: Response = await call_next(request)
            return response

        @app.post("/v1/datasets/{dataset_id}/releases", status_code=201)
        def create(
            dataset_id: str, body: ReleaseCreate, idempotency_key: str | None = Header(None)
        ) -> Any:
            if dataset_id != self.dataset_id:
                return error(404, "not_found", "no such dataset")
            if self.on_release is not None:
                self.on_release()
            key = body.idempotency_key
            assert key is not None and key == idempotency_key, "the client must send a key"
            if key in self.failed_keys:
                return error(422, "release_failed", "the mechanism failed; its ε is spent")
            if key in self.by_key:
                release = self.releases[self.by_key[key]]
            else:
                if self.spent + float(body.epsilon) > self.budget:
                    return error(409, "budget_exceeded", "the release would exceed the budget")
                self.spent += float(body.epsilon)
                if self.mechanism_fails:
                    self.failed_keys.add(key)
                    return error(422, "release_failed", "the mechanism failed; its ε is spent")
                release = self._release(float(body.epsilon), key)
            if self.fail_posts > 0:
                self.fail_posts -= 1
                return error(503, "unavailable", "try again")
            return release.model_dump(mode="json")

        @app.get("/v1/releases/{release_id}")
        def get(release_id: str) -> Any:
            if release_id not in self.releases:
                return error(404, "not_found", "no such release")
            return self.releases[release_id].model_dump(mode="json")

        @app.get("/v1/releases/{release_id}/labels")
        def labels(release_id: str, format: str = "json") -> Any:
            if release_id not in self.releases:
                return error(404, "not_found", "no such release")
            if self.on_download is not None:
                self.on_download()
            if self.fail_gets > 0:
                self.fail_gets -= 1
                return error(500, "internal_error", "boom")
            body = self.labels
            if self.corrupt_gets > 0:
                self.corrupt_gets -= 1
                body = bytes([body[0] ^ 0xFF]) + body[1:]
            return Response(body, media_type=PARQUET_MEDIA_TYPE)

        return app

    def _release(self, epsilon: float, key: str) -> ReleaseRead:
        digest = hashlib.sha256(self.labels).hexdigest()
        if self.wrong_hash:
            digest = hashlib.sha256(b"something else").hexdigest()
        release = ReleaseRead(
            id=f"rel-{len(self.releases) + 1}",
            dataset_id=self.dataset_id,
            task=self.task,  # type: ignore[arg-type]
            epsilon=epsilon,  # type: ignore[arg-type]
            mechanism={**self.mechanism, "epsilon": epsilon},  # type: ignore[arg-type]
            num_labels=self.num_labels,
            sha256=digest,
            idempotency_key=key,
            created_at=datetime.now(UTC),
        )
        self.releases[release.id] = release
        self.by_key[key] = release.id
        return release


@contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """Run an ASGI app under uvicorn in a thread on a free loopback port."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def serve(fake: FakeLabelsParty) -> Iterator[FakeLabelsParty]:
    with serve_app(fake.app()) as url:
        fake.url = url
        yield fake


@contextmanager
def tcp_server(handle: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    """A raw TCP server on loopback: ``handle(connection, stop)`` runs on a thread
    of its own for each connection; ``stop`` is set when the server closes."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.1)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handle, args=(conn, stop), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()


@contextmanager
def dropping_server() -> Iterator[str]:
    """A TCP server that accepts connections and closes them without answering."""
    with tcp_server(lambda conn, _stop: conn.close()) as url:
        yield url


@contextmanager
def trickling_server(*, headers_first: bool) -> Iterator[str]:
    """Answers every request a byte at a time, 20 a second: the whole answer
    (``headers_first=False``) or, after prompt headers, its body."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        with conn:
            try:
                conn.recv(65536)
                if headers_first:
                    conn.sendall(head)
                for byte in b"x" * 100_000 if headers_first else head + b"x" * 100_000:
                    if stop.wait(0.05):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:
                return

    with tcp_server(answer) as url:
        yield url
