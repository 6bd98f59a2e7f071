"""The loop both parties' workers run (``labeldp feature-party worker`` for training
jobs, ``labeldp label-party worker`` for LabelDP-Pro trainings): claim the oldest
claimable item from a lease queue (``shared.lease_queue``), run it, and poll when
the queue is empty. SIGTERM and SIGINT set :attr:`PollingWorker.shutdown`; each
worker checks it while running an item and gives the item back to the queue.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from shared.errors import storage_problem
from shared.logging import exception_fields
from shared.startup import flocked

__all__ = [
    "PollingWorker",
    "WorkerBusyError",
    "default_worker_id",
    "left_to_retry",
    "run_queue_worker",
]

log = logging.getLogger("labeldp.worker")


class WorkerBusyError(RuntimeError):
    """Another worker already serves this SQLite database."""


def run_queue_worker(
    url: str,
    data_dir: Path,
    open_worker: Callable[[str], tuple[PollingWorker, Callable[[], None]]],
    *,
    once: bool,
) -> None:
    """A worker command's life: hold the single-worker lock on SQLite, open the
    database and its worker (``open_worker(url)`` → the worker and how to close its
    database), run until the queue is empty (``once``) or a signal stops it."""
    with _single_sqlite_worker(data_dir) if url.startswith("sqlite") else nullcontext():
        worker, close = open_worker(url)
        try:
            worker.install_signal_handlers()
            worker.run(once=once)
        finally:
            close()


@contextmanager
def _single_sqlite_worker(data_dir: Path) -> Iterator[None]:
    """SQLite serializes every write: allow one worker per database (the lock is
    the OS's, so a killed worker releases it)."""
    with flocked(data_dir / "worker.lock") as held:
        if not held:
            raise WorkerBusyError(
                "another worker already serves this SQLite database; "
                "use Postgres (LABELDP_DATABASE_URL) for several workers"
            )
        yield


def left_to_retry(exc: BaseException, fields: dict[str, Any]) -> bool:
    """Whether ``exc`` is storage refusing a write (logged so, with ``fields``).
    That is the operator's to fix, not the item's: the caller leaves the item
    running, so its lease runs out and a worker claims it again and goes on from its
    last checkpoint, rather than failing work that may have been paid for. When the
    disk is full (``shared.errors.disk_full``) the caller also gives the claim's
    attempt back (``LeaseQueue.forgive``): that is retried every lease period until
    there is room; a permission or a file-size limit keeps its attempts."""
    if storage_problem(exc) is None:
        return False
    log.error(
        "item left to retry: storage refused a write",
        extra={"fields": {**fields, **exception_fields(exc)}},
    )
    return True


def default_worker_id() -> str:
    """``host:pid:random``: unique across machines and restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


#: How often an idle worker sweeps what killed processes left (``housekeep``).
HOUSEKEEPING_SECONDS = 3600.0


class PollingWorker(ABC):
    """Claim → run → repeat. Subclasses say how to claim an item and run one, and
    may sweep up after killed processes when idle (:meth:`housekeep`)."""

    def __init__(self, *, worker_id: str | None, poll_seconds: float) -> None:
        self.worker_id = worker_id or default_worker_id()
        self.poll_seconds = poll_seconds
        self.shutdown = threading.Event()

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            log.info("signal %s: finishing up", signum)
            self.shutdown.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self, *, once: bool = False) -> int:
        """Work until shut down (with ``once``: until the queue is empty); returns
        the number of items run."""
        ran, next_housekeeping = 0, 0.0
        while not self.shutdown.is_set():
            item_id = self.claim()
            if item_id is None:
                if time.monotonic() >= next_housekeeping:
                    self._housekeep()
                    next_housekeeping = time.monotonic() + HOUSEKEEPING_SECONDS
                if once:
                    break
                self.shutdown.wait(self.poll_seconds)
                continue
            try:
                self.run_item(item_id)
            except Exception:
                # Recording the end failed (a full disk, a lost database): the worker
                # lives on; the item's lease runs out and it is claimed again.
                log.exception("item %s: its worker could not record how it ended", item_id)
                self.shutdown.wait(self.poll_seconds)
            ran += 1
        return ran

    def _housekeep(self) -> None:
        try:
            self.housekeep()
        except Exception:  # a sweep must never stop the worker: the next one tries again
            log.exception("housekeeping failed")

    def housekeep(self) -> None:  # noqa: B027 - an optional hook, not an abstract one
        """Remove what killed processes left behind (by default nothing): run when
        the worker is idle, at most every ``HOUSEKEEPING_SECONDS``."""

    @abstractmethod
    def claim(self) -> str | None:
        """The id of the item this worker now holds the lease of, or ``None``."""

    @abstractmethod
    def run_item(self, item_id: str) -> None:
        """Run one claimed item to its end (or give it back on shutdown)."""
