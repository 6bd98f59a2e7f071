"""A durable work queue in one database table, with leases (DESIGN.md §5).

Both parties run one: the features party's training jobs
(``feature_party.jobs``) and the labels party's LabelDP-Pro trainings
(``label_party.trainings``). A row's life::

    queued ──claim──▶ running ──▶ succeeded
      ▲                  │    └──▶ failed      (error says why)
      └──lease expired───┘
    queued / running ──cancel──▶ cancelled

Every state change is a guarded ``UPDATE … WHERE`` on the expected state, so two
workers can never both win a transition; on Postgres the claim also selects with
``FOR UPDATE SKIP LOCKED`` so concurrent workers pick different rows instead of
queueing on one (SQLite ignores the clause and serializes writers; run a single
worker there). A running row holds a *lease* its worker renews with each
heartbeat; when a worker dies the lease expires and the next claim takes the row
again (``attempts`` + 1; a clean hand-back gives its attempt back).

:class:`LeaseQueue` is parameterized by the ORM class of the table, which must
have the columns ``id, status, worker_id, attempts, lease_expires_at,
created_at, started_at, finished_at, progress, error``, and by the process's
clock (aware UTC, :func:`shared.timestamps.utcnow` in both parties).

Leases are judged by one clock, the database's, on Postgres, where workers run
on many hosts: judged by each worker's own clock, one running a minute fast took
over healthy leases and ran their work twice. On SQLite every worker is on the
database's host, and the process's clock is that host's.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, and_, func, or_, select, text, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from shared.errors import ServiceError

__all__ = ["LeaseQueue", "RowBusyError", "Status"]

#: How long a cancel waits on Postgres for the row lock a worker holds while it
#: writes (a heartbeat, its result): milliseconds for a live worker; a frozen
#: one held it until it was killed, and the user's DELETE with it.
CANCEL_LOCK_TIMEOUT_MS = 5000

#: Postgres's SQLSTATE for a lock not had within ``lock_timeout``.
LOCK_NOT_AVAILABLE = "55P03"


class RowBusyError(ServiceError):
    """A cancel found its row locked by its worker past the wait: retry."""

    status_code = 503
    code = "row_busy"
    retry_after = 5


class Status(StrEnum):
    QUEUED = "queued"
    """Waiting for a worker (new, or taken back after its worker's lease expired)."""
    RUNNING = "running"
    """A worker holds the lease and is working."""
    SUCCEEDED = "succeeded"
    """Finished with a result. Final."""
    FAILED = "failed"
    """Stopped by an error in the work itself (``error``). Final."""
    CANCELLED = "cancelled"
    """Cancelled by a user. Final."""

    @property
    def is_final(self) -> bool:
        return self in {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}


RowT = TypeVar("RowT")


class LeaseQueue(Generic[RowT]):
    """The queue's SQL on one table, inside the caller's session (it never commits)."""

    def __init__(
        self, session: Session, table: type[RowT], *, clock: Callable[[], datetime]
    ) -> None:
        self.session = session
        self.table = table
        self.clock = clock
        self._t: Any = table  # column attributes, untyped for the generic class

    def now(self) -> datetime:
        """The clock leases are judged by: the database's on Postgres (aware UTC)."""
        if self.session.get_bind().dialect.name != "postgresql":
            return self.clock()
        database: datetime = self.session.execute(select(func.clock_timestamp())).scalar_one()
        return database.astimezone(UTC)

    def stalled(self, row: RowT) -> bool:
        """Whether ``row`` is running on a lease its worker let lapse: the worker
        died, hung or lost the database. Such a row reads ``running`` until the
        next claim takes it back, so readers are told."""
        r: Any = row
        expires = r.lease_expires_at
        if r.status != Status.RUNNING or expires is None:
            return False
        return bool(expires < self.now())

    def count_stalled(self) -> int:
        """How many rows are :meth:`stalled`."""
        lapsed = self._lapsed(self.now())
        return int(self.session.scalar(select(func.count()).where(lapsed)) or 0)

    def _lapsed(self, now: datetime) -> ColumnElement[bool]:
        t = self._t
        return and_(t.status == Status.RUNNING, t.lease_expires_at < now)

    def _rowcount(self, statement: Any) -> int:
        result: Any = self.session.execute(statement)
        return int(result.rowcount)

    def _mine(self, row_id: str, worker_id: str) -> ColumnElement[bool]:
        t = self._t
        return and_(t.id == row_id, t.worker_id == worker_id, t.status == Status.RUNNING)

    def claim(
        self,
        *,
        worker_id: str,
        lease_seconds: float,
        max_attempts: int | None = None,
        eligible: ColumnElement[bool] | None = None,
    ) -> RowT | None:
        """Take the oldest queued row, or a running one whose lease expired, unless
        ``max_attempts`` claims of it have ended so (that one is
        :meth:`fail_exhausted`'s, even when its lease ran out after that call);
        only among rows ``eligible`` for this worker, when given."""
        t = self._t
        now = self.now()
        lapsed = self._lapsed(now)
        if max_attempts is not None:
            lapsed = and_(lapsed, t.attempts < max_attempts)
        claimable = or_(t.status == Status.QUEUED, lapsed)
        if eligible is not None:
            claimable = and_(claimable, eligible)
        candidate = self.session.execute(
            select(t.id)
            .where(claimable)
            .order_by(t.created_at, t.id)
            .limit(1)
            .with_for_update(skip_locked=True)
        ).first()
        if candidate is None:
            return None
        won = self._rowcount(
            update(t)
            .where(t.id == candidate.id, claimable)
            .values(
                status=Status.RUNNING,
                worker_id=worker_id,
                attempts=t.attempts + 1,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
                started_at=now,
            )
        )
        if won != 1:
            return None
        return self.session.get(self.table, candidate.id, populate_existing=True)

    def heartbeat(
        self, row_id: str, worker_id: str, *, lease_seconds: float, progress: dict[str, Any] | None
    ) -> bool:
        """Renew the lease (and publish progress); False if the row is no longer ours."""
        values: dict[str, Any] = {"lease_expires_at": self.now() + timedelta(seconds=lease_seconds)}
        if progress is not None:
            values["progress"] = progress
        return (
            self._rowcount(update(self._t).where(self._mine(row_id, worker_id)).values(**values))
            == 1
        )

    def succeed(self, row_id: str, worker_id: str, **values: Any) -> bool:
        """Finish a row we hold, setting ``values`` too; False if it is no longer ours."""
        return (
            self._rowcount(
                update(self._t)
                .where(self._mine(row_id, worker_id))
                .values(
                    status=Status.SUCCEEDED,
                    finished_at=self.now(),
                    lease_expires_at=None,
                    **values,
                )
            )
            == 1
        )

    def fail(self, row_id: str, worker_id: str, *, error: str) -> bool:
        return (
            self._rowcount(
                update(self._t)
                .where(self._mine(row_id, worker_id))
                .values(
                    status=Status.FAILED,
                    error=error,
                    finished_at=self.now(),
                    lease_expires_at=None,
                )
            )
            == 1
        )

    def release(self, row_id: str, worker_id: str) -> bool:
        """Give a running row back to the queue (worker shutting down). The claim's
        attempt is given back too: ``attempts`` counts the claims that ended with a
        lost lease (a worker that died) or are running, so deploys that stop workers
        cleanly never fail the work."""
        t = self._t
        return (
            self._rowcount(
                update(t)
                .where(self._mine(row_id, worker_id))
                .values(
                    status=Status.QUEUED,
                    worker_id=None,
                    lease_expires_at=None,
                    attempts=t.attempts - 1,
                )
            )
            == 1
        )

    def forgive(self, row_id: str, worker_id: str) -> bool:
        """Give back the attempt of a claim that storage failed (the operator's to
        fix, not the row's): the row stays running until its lease lapses and is
        then claimed again, however long the disk stays full. False if not ours."""
        t = self._t
        statement = update(t).where(self._mine(row_id, worker_id))
        return self._rowcount(statement.values(attempts=t.attempts - 1)) == 1

    def fail_exhausted(self, *, max_attempts: int) -> list[str]:
        """Rows whose workers died ``max_attempts`` times fail instead of looping;
        their ids (the caller records and cleans up after them)."""
        t = self._t
        now = self.now()
        exhausted = and_(self._lapsed(now), t.attempts >= max_attempts)
        # A row locked by its worker (frozen mid-heartbeat) is skipped, not waited
        # for: every other claim runs this first, and no job ran until it woke.
        locked = select(t.id).where(exhausted).with_for_update(skip_locked=True)
        ids = list(self.session.scalars(locked))
        if not ids:
            return []
        self.session.execute(
            update(t)
            .where(t.id.in_(ids), exhausted)
            .values(
                status=Status.FAILED,
                error=f"the worker stopped responding or could not record a result "
                f"{max_attempts} times (the workers' logs say why)",
                finished_at=now,
                lease_expires_at=None,
            )
        )
        return ids

    def cancel(self, row_id: str) -> bool:
        """Cancel a queued or running row; False if it is already final;
        :class:`RowBusyError` if its worker holds its lock past
        :data:`CANCEL_LOCK_TIMEOUT_MS` (Postgres; the caller's transaction is
        then aborted and must be rolled back)."""
        t = self._t
        bounded = self.session.get_bind().dialect.name == "postgresql"
        if bounded:
            # SET LOCAL: the wait bounds this transaction alone, not the pooled
            # connection, and is lifted after the UPDATE for what the caller does next.
            self.session.execute(text(f"SET LOCAL lock_timeout = {CANCEL_LOCK_TIMEOUT_MS}"))
        try:
            cancelled = self._rowcount(
                update(t)
                .where(t.id == row_id, t.status.in_([Status.QUEUED, Status.RUNNING]))
                .values(status=Status.CANCELLED, finished_at=self.now(), lease_expires_at=None)
            )
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            raise RowBusyError(
                f"{row_id} is being written by its worker, which holds it locked; retry shortly",
                {"id": row_id},
            ) from exc
        if bounded:
            self.session.execute(text("SET LOCAL lock_timeout = DEFAULT"))
        return cancelled == 1
