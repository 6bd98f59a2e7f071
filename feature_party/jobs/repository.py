"""The job queue's SQL. Every state change is a guarded ``UPDATE … WHERE`` on the
expected state, so two workers can never both win a transition; on Postgres the
claim also selects with ``FOR UPDATE SKIP LOCKED`` so concurrent workers pick
different rows instead of queueing on one (SQLite ignores the clause and
serializes writers; run a single worker there)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from feature_party.errors import not_found
from feature_party.jobs.status import Status
from feature_party.orm import Job, Model, utcnow


class JobRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, job: Job) -> Job:
        self.session.add(job)
        self.session.flush()
        return job

    def get(self, id_: str) -> Job:
        row = self.session.get(Job, id_)
        if row is None:
            raise not_found("job", id_)
        return row

    def _mine(self, job_id: str, worker_id: str) -> Any:
        return and_(Job.id == job_id, Job.worker_id == worker_id, Job.status == Status.RUNNING)

    def fail_exhausted(self, *, max_attempts: int, now: datetime) -> int:
        """Jobs whose workers died ``max_attempts`` times fail instead of looping."""
        result = self.session.execute(
            update(Job)
            .where(
                Job.status == Status.RUNNING,
                Job.lease_expires_at < now,
                Job.attempts >= max_attempts,
            )
            .values(
                status=Status.FAILED,
                error=f"the worker stopped responding {max_attempts} times",
                finished_at=now,
            )
        )
        return int(result.rowcount)  # type: ignore[attr-defined]

    def claim(self, *, worker_id: str, lease_seconds: float, now: datetime) -> Job | None:
        """Take the oldest queued job, or a running one whose lease expired."""
        claimable = or_(
            Job.status == Status.QUEUED,
            and_(Job.status == Status.RUNNING, Job.lease_expires_at < now),
        )
        candidate = self.session.execute(
            select(Job.id, Job.status, Job.worker_id)
            .where(claimable)
            .order_by(Job.created_at, Job.id)
            .limit(1)
            .with_for_update(skip_locked=True)
        ).first()
        if candidate is None:
            return None
        result = self.session.execute(
            update(Job)
            .where(Job.id == candidate.id, claimable)
            .values(
                status=Status.RUNNING,
                worker_id=worker_id,
                attempts=Job.attempts + 1,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
                started_at=now,
            )
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            return None
        job = self.session.get(Job, candidate.id, populate_existing=True)
        return job

    def heartbeat(
        self, job_id: str, worker_id: str, *, lease_seconds: float, progress: dict[str, Any] | None
    ) -> bool:
        """Renew the lease (and publish progress); False if the job is no longer ours."""
        values: dict[str, Any] = {"lease_expires_at": utcnow() + timedelta(seconds=lease_seconds)}
        if progress is not None:
            values["progress"] = progress
        result = self.session.execute(
            update(Job).where(self._mine(job_id, worker_id)).values(**values)
        )
        return bool(result.rowcount == 1)  # type: ignore[attr-defined]

    def succeed(
        self,
        job_id: str,
        worker_id: str,
        *,
        model: Model,
        metrics: dict[str, Any],
        progress: dict[str, Any] | None = None,
    ) -> bool:
        """Record the model and finish the job, atomically; False (and nothing
        recorded once the caller rolls back) if the job is no longer ours."""
        result = self.session.execute(
            update(Job)
            .where(self._mine(job_id, worker_id))
            .values(
                status=Status.SUCCEEDED,
                model_id=model.id,
                metrics=metrics,
                progress=progress if progress is not None else Job.progress,
                finished_at=utcnow(),
                lease_expires_at=None,
            )
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            return False
        self.session.add(model)
        self.session.flush()
        return True

    def fail(self, job_id: str, worker_id: str, *, error: str) -> bool:
        result = self.session.execute(
            update(Job)
            .where(self._mine(job_id, worker_id))
            .values(status=Status.FAILED, error=error, finished_at=utcnow(), lease_expires_at=None)
        )
        return bool(result.rowcount == 1)  # type: ignore[attr-defined]

    def release(self, job_id: str, worker_id: str) -> bool:
        """Give a running job back to the queue (worker shutting down)."""
        result = self.session.execute(
            update(Job)
            .where(self._mine(job_id, worker_id))
            .values(status=Status.QUEUED, worker_id=None, lease_expires_at=None)
        )
        return bool(result.rowcount == 1)  # type: ignore[attr-defined]

    def cancel(self, job_id: str) -> bool:
        result = self.session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status.in_([Status.QUEUED, Status.RUNNING]))
            .values(status=Status.CANCELLED, finished_at=utcnow(), lease_expires_at=None)
        )
        return bool(result.rowcount == 1)  # type: ignore[attr-defined]

    def models_of(self, job_id: str) -> list[Model]:
        return list(self.session.scalars(select(Model).where(Model.job_id == job_id)))
