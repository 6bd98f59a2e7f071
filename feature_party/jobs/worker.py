"""The worker loop: claim a job, train it while heartbeating, record the outcome.

Run any number of workers (``labeldp feature-party worker``), each on its own
machine or GPUs, against the same Postgres. While a job trains, a heartbeat
thread renews its lease every ``heartbeat_seconds`` and publishes the latest
progress; if the renewal finds the job no longer ours (cancelled, or re-claimed
after this worker stalled) training stops and nothing is written. A job that
asks for several processes runs under torchrun (``training.distributed``).

Success is one transaction: insert the model row and move the job to
``succeeded`` only if it is still running under this worker — so a job can never
produce two models, even when a stalled worker wakes up after being replaced.
SIGTERM/SIGINT stop training at the next report and give the job back to the
queue (it resumes from its checkpoint elsewhere).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DBAPIError

from feature_party.config import Settings
from feature_party.db import Database
from feature_party.jobs.repository import JobRepository
from feature_party.jobs.service import sweep_finished
from feature_party.orm import FeatureSet, Model, ReceivedLabels
from feature_party.training import distributed
from feature_party.training.loop import Interrupted, Progress, available_gpus, resolve_device
from feature_party.training.runner import RunSpec, execute
from feature_party.uploads import sweep_stale
from shared.errors import disk_full
from shared.logging import exception_fields
from shared.worker_loop import PollingWorker, left_to_retry

log = logging.getLogger("labeldp.feature_party.worker")

MAX_ATTEMPTS = 5


@dataclass
class _Shared:
    """What the training thread and the heartbeat thread share."""

    progress: Progress | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    lost: bool = False


class Worker(PollingWorker):
    def __init__(
        self,
        database: Database,
        settings: Settings,
        *,
        worker_id: str | None = None,
        gpus: int | None = None,
    ) -> None:
        super().__init__(worker_id=worker_id, poll_seconds=settings.poll_seconds)
        self.db = database
        self.settings = settings
        #: The GPUs this worker has: it claims only jobs that ask for at most these.
        self.gpus = available_gpus() if gpus is None else gpus

    def run_item(self, item_id: str) -> None:
        self.run_job(item_id)

    def housekeep(self) -> None:
        """The sweeps the service makes at start, for a service that runs for months:
        upload and download parts over an hour old, and what ended jobs left."""
        removed = sweep_stale(self.settings.data_dir / "tmp")
        with self.db.session() as session:
            removed += sweep_finished(session, self.settings.data_dir)
        if removed:
            log.info(
                "housekeeping: removed %d files left by ended jobs or killed requests", removed
            )

    def claim(self) -> str | None:
        try:
            with self.db.session() as session:
                repo = JobRepository(session)
                exhausted = repo.fail_exhausted(max_attempts=MAX_ATTEMPTS)
                job = repo.claim(
                    worker_id=self.worker_id,
                    lease_seconds=self.settings.job_lease_seconds,
                    max_attempts=MAX_ATTEMPTS,
                    gpus=self.gpus,
                )
            for job_id in exhausted:  # committed: it never resumes
                self._checkpoint(job_id).unlink(missing_ok=True)
            return job.id if job else None
        except Exception:  # a busy SQLite, a Postgres failover: try again next poll
            log.exception("claiming a job failed")
            return None

    # -- one job ----------------------------------------------------------------------

    def _checkpoint(self, job_id: str) -> Path:
        return self.settings.data_dir.resolve() / "jobs" / job_id / "checkpoint.pt"

    def _spec(self, job_id: str) -> tuple[RunSpec, Path]:
        data_dir = self.settings.data_dir.resolve()
        with self.db.session() as session:
            job = JobRepository(session).get(job_id)
            features = session.get(FeatureSet, job.feature_set_id)
            labels = session.get(ReceivedLabels, job.labels_id)
            assert features is not None and labels is not None
            job_dir = data_dir / "jobs" / job.id
            spec = RunSpec(
                features_path=str(data_dir / features.path),
                labels_path=str(data_dir / labels.path),
                roles=dict(features.roles),
                config=dict(job.config),
                manifest=dict(labels.manifest),
                checkpoint_path=str(self._checkpoint(job.id)),
                artifact_path=str(job_dir / f"model-{uuid.uuid4().hex}.pt"),
                init_artifact_path=_init_artifact(session, data_dir, job.config),
            )
        return spec, job_dir

    def _heartbeat(self, job_id: str, shared: _Shared) -> None:
        interval = self.settings.heartbeat_seconds
        while not shared.stop.wait(interval):
            progress = shared.progress.to_dict() if shared.progress else None
            try:
                with self.db.session() as session:
                    ours = JobRepository(session).heartbeat(
                        job_id,
                        self.worker_id,
                        lease_seconds=self.settings.job_lease_seconds,
                        progress=progress,
                    )
            except Exception:
                log.exception("heartbeat failed for job %s", job_id)
                continue
            if not ours:
                log.warning("job %s is no longer ours (cancelled or re-claimed)", job_id)
                shared.lost = True
                shared.stop.set()

    def run_job(self, job_id: str) -> None:
        try:
            spec, job_dir = self._spec(job_id)
        except Exception as exc:  # e.g. a stored file went missing
            with self.db.session() as session:
                JobRepository(session).fail(job_id, self.worker_id, error=f"cannot start: {exc}")
            return
        shared = _Shared()
        beat = threading.Thread(target=self._heartbeat, args=(job_id, shared), daemon=True)
        beat.start()
        log.info("job %s: training", job_id)
        try:
            if spec.training.world_size > 1:
                metrics = self._run_distributed(spec, job_dir, shared)
            else:
                metrics = self._run_here(spec, shared)
        except Interrupted:
            shared.stop.set()
            beat.join()
            self._after_interrupt(job_id, job_dir, lost=shared.lost)
            return
        except Exception as exc:
            shared.stop.set()
            beat.join()
            Path(spec.artifact_path).unlink(missing_ok=True)
            if left_to_retry(exc, {"job_id": job_id}):
                self._forgive(job_id, exc)
                return
            log.error("job failed", extra={"fields": {"job_id": job_id, **exception_fields(exc)}})
            with self.db.session() as session:
                JobRepository(session).fail(
                    job_id, self.worker_id, error=f"{type(exc).__name__}: {exc}"
                )
            return
        shared.stop.set()
        beat.join()
        try:
            self._record_success(job_id, spec, metrics, shared.progress)
        except DBAPIError as exc:  # its row: the model's file is written already
            if not left_to_retry(exc, {"job_id": job_id}):
                raise
            self._forgive(job_id, exc)

    def _forgive(self, job_id: str, exc: BaseException) -> None:
        """Give the attempt back when the disk is full (``shared.errors.disk_full``);
        a database too full to take even that leaves the attempt counted."""
        if not disk_full(exc):
            return
        try:
            with self.db.session() as session:
                JobRepository(session).forgive(job_id, self.worker_id)
        except DBAPIError:
            log.exception("could not give job %s its attempt back", job_id)

    def _check_stop(self, shared: _Shared) -> None:
        if shared.stop.is_set() or self.shutdown.is_set():
            raise Interrupted("stop requested")

    def _run_here(self, spec: RunSpec, shared: _Shared) -> dict[str, Any]:
        def report(progress: Progress) -> None:
            shared.progress = progress
            self._check_stop(shared)

        return execute(spec, report=report)

    def _run_distributed(self, spec: RunSpec, job_dir: Path, shared: _Shared) -> dict[str, Any]:
        resolve_device(spec.training)  # "asks for 2 GPUs; this worker has 0", not an exit code
        # A directory of this claim's own: a worker that lost the job (its lease
        # lapsed) and stops late must not touch the stop file, or read the result,
        # of the worker that claimed it next.
        run_dir = job_dir / f"run-{uuid.uuid4().hex}"
        proc = distributed.launch(run_dir, spec, processes=spec.training.world_size)
        try:
            while proc.poll() is None:
                shared.progress = distributed.read_progress(run_dir) or shared.progress
                if shared.stop.is_set() or self.shutdown.is_set():
                    (run_dir / distributed.STOP).touch()
                    _terminate(proc)
                    raise Interrupted("stop requested")
                time.sleep(0.2)
            result = distributed.read_result(run_dir)
        finally:
            _terminate(proc)
            shutil.rmtree(run_dir, ignore_errors=True)
        if result is None:
            raise RuntimeError(f"distributed training exited with status {proc.returncode}")
        if not result.get("ok"):
            if isinstance(result.get("errno"), int):  # the job's storage errno, not an exit code
                raise OSError(result["errno"], str(result.get("error")))
            raise RuntimeError(str(result.get("error")))
        metrics: dict[str, Any] = result["metrics"]
        return metrics

    def _after_interrupt(self, job_id: str, job_dir: Path, *, lost: bool) -> None:
        if lost:  # cancelled or taken over: the new owner keeps the checkpoint
            with self.db.session() as session:
                cancelled = JobRepository(session).get(job_id).status == "cancelled"
            if cancelled:
                shutil.rmtree(job_dir, ignore_errors=True)
            return
        with self.db.session() as session:
            JobRepository(session).release(job_id, self.worker_id)
        log.info("job %s: given back to the queue", job_id)

    def _record_success(
        self, job_id: str, spec: RunSpec, metrics: dict[str, Any], progress: Progress | None
    ) -> None:
        config = spec.training
        artifact = Path(spec.artifact_path)
        data_dir = self.settings.data_dir.resolve()
        model = Model(
            id=uuid.uuid4().hex,
            job_id=job_id,
            path=str(artifact.relative_to(data_dir)),
            task=config.task,
            loss=config.loss,
            metrics={k: v for k, v in metrics.items() if k != "history"},
        )
        with self.db.session() as session:
            ok = JobRepository(session).succeed(
                job_id,
                self.worker_id,
                model=model,
                metrics=metrics,
                progress=progress.to_dict() if progress else None,
            )
            if not ok:
                session.rollback()
        if ok:
            Path(spec.checkpoint_path).unlink(missing_ok=True)
            log.info("job %s: succeeded, model %s", job_id, model.id)
        else:
            artifact.unlink(missing_ok=True)
            log.warning("job %s finished but is no longer ours; result dropped", job_id)


def _init_artifact(session: Any, data_dir: Path, config: dict[str, Any]) -> str | None:
    """The artifact of the job's ``init_model_id`` (multi-stage training), if any."""
    model_id = config.get("init_model_id")
    if model_id is None:
        return None
    model = session.get(Model, model_id)
    if model is None:
        raise ValueError(f"init_model_id: no model {model_id!r}")
    return str(data_dir / model.path)


def _terminate(proc: Any) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, OSError):
        return
    except Exception:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
