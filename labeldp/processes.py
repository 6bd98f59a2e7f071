"""Run the two services and the worker as local processes.

The demo, the experiments and the end-to-end tests all start the real commands
(``labeldp label-party serve`` …) as subprocesses on free loopback ports, wait
until they answer ``/healthz``, and stop them — also on Ctrl-C or an error.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx


class ServiceStartError(RuntimeError):
    """A service process exited or never became healthy."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ServiceProcess:
    """One ``labeldp`` subcommand running in the background, logging to a file."""

    name: str
    args: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    port: int | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _log: IO[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        if self.port is None:
            raise ValueError(f"{self.name} has no port")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        # Its settings are ``env`` alone: a LABELDP_DATABASE_URL exported for a
        # real deployment must never reach a demo's services (they would migrate
        # that database, both parties into the one).
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("LABELDP_")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "labeldp", *self.args],
            env={**inherited, **self.env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in the terminal reaches us, not it
        )

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServiceStartError(
                    f"{self.name} exited with status {self.process.returncode}; "
                    f"its log ends:\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.2)
        raise ServiceStartError(
            f"{self.name} not healthy after {timeout:.0f} s; its log ends:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 5) -> str:
        """The log's last lines, quoted in a start failure: the log itself is often in
        a temporary directory that is gone by the time the user reads the error."""
        if self._log is not None:
            self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "  (no log)"
        return "\n".join(f"  {line}" for line in text[-lines:]) or "  (empty)"

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextlib.contextmanager
def _terminate_cleanly() -> Iterator[None]:
    """While services run, SIGTERM and SIGINT unwind as KeyboardInterrupt, so
    ``running`` stops them. Python's default SIGTERM ends the process without
    cleanup, and a SIGINT a shell set to "ignore" (a background job inherits
    that) would be lost; either would leave the services (each in its own
    session) behind. ``_started`` ignores both while it stops the services, so a
    second Ctrl-C cannot cut the shutdown short. Only the main thread can set
    handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def running(*services: ServiceProcess, timeout: float = 60.0) -> Iterator[None]:
    """Start ``services`` in order (each healthy before the next) and stop them all,
    also when this process is interrupted or sent SIGTERM."""
    with _terminate_cleanly(), _started(services, timeout):
        yield


@contextlib.contextmanager
def _started(services: Sequence[ServiceProcess], timeout: float) -> Iterator[None]:
    started: list[ServiceProcess] = []
    try:
        for service in services:
            service.start()
            started.append(service)
            if service.port is not None:
                service.wait_healthy(timeout)
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):  # restored by _terminate_cleanly
                signal.signal(sig, signal.SIG_IGN)
        for service in reversed(started):
            service.stop()
