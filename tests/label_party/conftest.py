"""Fixtures: a fresh database (SQLite file or a new Postgres database) and a real
labels-party server (``labeldp label-party serve`` in a subprocess on 127.0.0.1).

Postgres: ``LABELDP_TEST_POSTGRES_URL`` (default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``); each test gets its own
``labeldp_lp_<random>`` database, created on the server's ``postgres`` database
and dropped afterwards. Postgres tests are skipped, with the reason, only when
the server is unreachable.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess as subprocess_
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from sqlalchemy.engine import make_url

from label_party.app import create_app
from label_party.config import Settings
from shared.logging import JsonFormatter
from tests.file_limits import file_size_limit as limit_files

ADMIN_TOKEN = "test-admin-" + "x" * 24
POSTGRES_URL = os.environ.get(
    "LABELDP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REPO = Path(__file__).resolve().parents[2]


def _pg_connect(dbname: str) -> psycopg.Connection[Any]:
    url = make_url(POSTGRES_URL)
    return psycopg.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username,
        password=url.password,
        dbname=dbname,
        autocommit=True,
        connect_timeout=3,
    )


@pytest.fixture(
    scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One fresh database per test session and backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'label_party.sqlite3'}"
        return
    name = f"labeldp_lp_{secrets.token_hex(6)}"
    try:
        with _pg_connect("postgres") as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL at {make_url(POSTGRES_URL).host} is unreachable: {exc}")
    yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    with _pg_connect("postgres") as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def settings_from_env(env: dict[str, str]) -> Settings:
    """The labels party's settings from ``LABELDP_*`` variables, as the service reads them."""
    return Settings(
        **{
            k.removeprefix("LABELDP_").lower(): v
            for k, v in env.items()
            if k.startswith("LABELDP_")
        }
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """A real server on 127.0.0.1: a uvicorn thread in this process (fast to start),
    or, with ``subprocess=True``, ``labeldp label-party serve`` in a child process
    (the crash test kills it). ``client()`` gives an httpx client with a token."""

    def __init__(self, env: dict[str, str], log_path: Path, *, subprocess: bool = False) -> None:
        self.env, self.log_path, self.subprocess = env, log_path, subprocess
        self.port = free_port()
        self.proc: subprocess_.Popen[bytes] | None = None
        self.thread: threading.Thread | None = None
        self.uvicorn: uvicorn.Server | None = None
        self.clients: list[httpx.Client] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def settings(self) -> Settings:
        """The settings its environment gives (those passed to ``start`` aside)."""
        return settings_from_env(self.env)

    def start(self, *, file_size_limit: int | None = None, **extra_env: str) -> Server:
        """Start it; ``file_size_limit`` (a subprocess only): its files stop at that
        many bytes, a real EFBIG (``tests.file_limits``)."""
        env = {**self.env, **extra_env}
        assert file_size_limit is None or self.subprocess
        if self.subprocess:
            with self.log_path.open("ab") as log:
                self.proc = subprocess_.Popen(
                    [
                        sys.executable,
                        "-m",
                        "labeldp.cli",
                        "label-party",
                        "serve",
                        "--port",
                        str(self.port),
                    ],
                    env=env,
                    cwd=REPO,
                    stdout=log,
                    stderr=log,
                    preexec_fn=None if file_size_limit is None else limit_files(file_size_limit),
                )
        else:
            config = uvicorn.Config(
                create_app(settings_from_env(env)),
                host="127.0.0.1",
                port=self.port,
                log_config=None,
                access_log=False,
                lifespan="on",
            )
            self.uvicorn = uvicorn.Server(config)
            self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
            self.thread.start()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if (self.proc is not None and self.proc.poll() is not None) or (
                self.thread is not None and not self.thread.is_alive()
            ):
                raise RuntimeError(f"server exited:\n{self.logs()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("server did not start in 90 s")

    def stop(self) -> None:
        if self.uvicorn is not None and self.thread is not None:
            self.uvicorn.should_exit = True
            self.thread.join(timeout=30)
            self.uvicorn = self.thread = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess_.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout=timeout)
        self.proc = None
        return code

    def client(self, token: str | None = ADMIN_TOKEN, timeout: float = 120) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.clients.append(client)
        return client

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.stop()


def server_env(database_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABELDP_")}
    env.update(
        LABELDP_MODE="test",
        LABELDP_DATABASE_URL=database_url,
        LABELDP_DATA_DIR=str(data_dir),
        LABELDP_ADMIN_TOKEN=ADMIN_TOKEN,
        **extra,
    )
    return env


@pytest.fixture(scope="session")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The in-process servers' JSON log lines (the privacy test reads them)."""
    path = tmp_path_factory.mktemp("logs") / "server.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield path
    root.removeHandler(handler)
    root.setLevel(old_level)
    handler.close()


@pytest.fixture
def make_server(database_url: str, tmp_path: Path, server_log: Path) -> Iterator[Any]:
    """Extra servers on the session's database, with a data directory of their own."""
    servers: list[Server] = []

    def make(subprocess: bool = False, **extra: str) -> Server:
        log = tmp_path / "server.log" if subprocess else server_log
        server = Server(
            server_env(database_url, tmp_path / "data", **extra), log, subprocess=subprocess
        )
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture(scope="session")
def server(
    database_url: str, tmp_path_factory: pytest.TempPathFactory, server_log: Path
) -> Iterator[Server]:
    """The session's server for this backend (shared by the tests: ids keep them apart)."""
    root = tmp_path_factory.mktemp("server")
    started = Server(server_env(database_url, root / "data"), server_log).start()
    yield started
    started.close()
