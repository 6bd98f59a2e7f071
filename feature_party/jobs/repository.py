"""The job queue's SQL: the generic lease queue of :mod:`shared.lease_queue`
(guarded ``UPDATE … WHERE`` transitions, ``FOR UPDATE SKIP LOCKED`` claims) on
the ``jobs`` table, plus the job's model row."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from feature_party.errors import not_found
from feature_party.orm import Job, Model
from shared.lease_queue import LeaseQueue
from shared.timestamps import utcnow


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

    def _queue(self) -> LeaseQueue[Job]:
        return LeaseQueue(self.session, Job, clock=utcnow)

    def stalled(self, job: Job) -> bool:
        """Running on a lease its worker let lapse (``LeaseQueue.stalled``)."""
        return self._queue().stalled(job)

    def forgive(self, job_id: str, worker_id: str) -> bool:
        """Give back the attempt storage failed (``LeaseQueue.forgive``)."""
        return self._queue().forgive(job_id, worker_id)

    def fail_exhausted(self, *, max_attempts: int) -> list[str]:
        """Jobs whose workers died ``max_attempts`` times fail instead of looping."""
        return self._queue().fail_exhausted(max_attempts=max_attempts)

    def claim(
        self,
        *,
        worker_id: str,
        lease_seconds: float,
        max_attempts: int | None = None,
        gpus: int = 0,
    ) -> Job | None:
        """Take the oldest queued job, or a running one whose lease expired (fewer
        than ``max_attempts`` times), among those asking for at most ``gpus`` GPUs
        (the worker's): a GPU job waits for a GPU worker instead of failing on a
        CPU-only one."""
        return self._queue().claim(
            worker_id=worker_id,
            lease_seconds=lease_seconds,
            max_attempts=max_attempts,
            eligible=Job.gpus <= gpus,
        )

    def heartbeat(
        self, job_id: str, worker_id: str, *, lease_seconds: float, progress: dict[str, Any] | None
    ) -> bool:
        """Renew the lease (and publish progress); False if the job is no longer ours."""
        return self._queue().heartbeat(
            job_id, worker_id, lease_seconds=lease_seconds, progress=progress
        )

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
        ok = self._queue().succeed(
            job_id,
            worker_id,
            model_id=model.id,
            metrics=metrics,
            progress=progress if progress is not None else Job.progress,
        )
        if not ok:
            return False
        self.session.add(model)
        self.session.flush()
        return True

    def fail(self, job_id: str, worker_id: str, *, error: str) -> bool:
        return self._queue().fail(job_id, worker_id, error=error)

    def release(self, job_id: str, worker_id: str) -> bool:
        """Give a running job back to the queue (worker shutting down)."""
        return self._queue().release(job_id, worker_id)

    def cancel(self, job_id: str) -> bool:
        return self._queue().cancel(job_id)

    def models_of(self, job_id: str) -> list[Model]:
        return list(self.session.scalars(select(Model).where(Model.job_id == job_id)))
