"""Start, read and resume LP-MST runs; the registry of their driver threads."""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from feature_party.config import Settings
from feature_party.db import Database, get_for_update
from feature_party.errors import ConflictError, InvalidInputError, not_found
from feature_party.feature_sets.repository import FeatureSetRepository
from feature_party.jobs import service as jobs
from feature_party.jobs.repository import JobRepository
from feature_party.jobs.status import Status
from feature_party.multistage.driver import Driver, part_sizes
from feature_party.multistage.schemas import (
    MultistageCreate,
    MultistageRead,
    MultistageResume,
    RunStatus,
    StageRead,
)
from feature_party.orm import MultistageRun
from shared.pagination import Pager
from shared.timestamps import utcnow

#: A running run whose driver has not written for this long lost its service
#: (killed without a clean stop): it reads as interrupted and may be resumed.
STALE_AFTER = timedelta(minutes=2)
#: How long a stopping service waits for its drivers to reach a step's end.
STOP_TIMEOUT_SECONDS = 30.0


class Drivers:
    """The driver threads of this service process (``app.state.multistage``)."""

    def __init__(self, database: Database, settings: Settings) -> None:
        self.database = database
        self.settings = settings
        #: run id → (its driver's thread, its stop event, its launch mark)
        self._threads: dict[str, tuple[threading.Thread, threading.Event, str]] = {}
        self._lock = threading.Lock()

    def launch(self, run_id: str, token: str) -> None:
        with self._lock:
            current = self._threads.get(run_id)
            if current is not None and current[0].is_alive():
                raise ConflictError(f"run {run_id} is already running here", code="run_active")
            stop = threading.Event()
            driver = Driver(self.database, self.settings, run_id, token, stop)
            thread = threading.Thread(target=driver, name=f"lpmst-{run_id[:8]}", daemon=True)
            self._threads[run_id] = (thread, stop, driver.launch)
            thread.start()

    def wake(self, run_id: str) -> None:
        """Stop this service's driver of ``run_id``, if it has one, at its next step
        (a cancelled run's: it finds the run no longer its own and writes nothing)."""
        with self._lock:
            current = self._threads.get(run_id)
        if current is not None:
            current[1].set()

    def is_active(self, run_id: str) -> bool:
        with self._lock:
            current = self._threads.get(run_id)
            return current is not None and current[0].is_alive()

    def stop_all(self, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        """Stop every driver at its next step (runs become ``interrupted``).

        A driver still inside a step when ``timeout`` runs out (a release or an
        upload in flight) is marked ``interrupted`` here: its daemon thread dies
        with the process, and without the mark its run would read ``running`` and
        refuse a resume until it went stale. A resume replays the step (releases
        by their idempotency key, so nothing is paid twice)."""
        with self._lock:
            threads = dict(self._threads)
        for _, stop, _ in threads.values():
            stop.set()
        deadline = time.monotonic() + timeout
        for thread, _, _ in threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        for run_id, (thread, _, launch) in threads.items():
            if thread.is_alive():
                mark_interrupted(self.database, run_id, STOPPED_MID_STEP, launch=launch)


STOPPED_MID_STEP = (
    "the service stopped while a step was in flight; resume with the token "
    "(a release is replayed by its idempotency key, not paid again)"
)


def mark_interrupted(database: Database, run_id: str, error: str, *, launch: str) -> None:
    """Mark a ``running`` run interrupted if the driver ``launch`` still owns it (a
    run that ended, or that another service resumed meanwhile, is left as it is)."""
    with database.session() as session:
        run = get_for_update(session, MultistageRun, run_id)
        if run is None or run.status != RunStatus.RUNNING:
            return
        if run.state.get("driver") in (None, launch):
            run.status, run.error, run.updated_at = RunStatus.INTERRUPTED, error, utcnow()


def create(session: Session, body: MultistageCreate) -> MultistageRun:
    feature_set = FeatureSetRepository(session).get(body.feature_set_id)  # 404 first
    sizes = part_sizes(feature_set.num_rows, body.shares())
    if min(sizes) == 0:
        # Found here, not after stage 1 has spent its ε and left its plan behind.
        raise InvalidInputError(
            f"a stage would get no examples: {feature_set.num_rows} feature rows split "
            f"as {sizes}; use fewer stages or larger fractions",
            detail={"num_rows": feature_set.num_rows, "stage_sizes": sizes},
        )
    # Stage 1 trains on the fewest examples: its part.
    jobs.check_training(body.training, feature_set, sizes[0])
    seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
    now = utcnow()
    run = MultistageRun(
        id=uuid.uuid4().hex,
        status=RunStatus.RUNNING,
        feature_set_id=body.feature_set_id,
        labels_party_url=body.labels_party_url,
        dataset_id=body.dataset_id,
        config=body.public_config(seed),
        state={"stages": []},
        created_at=now,
        updated_at=now,
    )
    session.add(run)
    session.flush()
    return run


def _get(session: Session, run_id: str) -> MultistageRun:
    run = session.get(MultistageRun, run_id)
    if run is None:
        raise not_found("multistage run", run_id)
    return run


def effective_status(run: MultistageRun, *, active: bool) -> RunStatus:
    """``running`` rows whose driver is gone (service killed) read as interrupted."""
    status = RunStatus(run.status)
    if status == RunStatus.RUNNING and not active and utcnow() - run.updated_at > STALE_AFTER:
        return RunStatus.INTERRUPTED
    return status


def prepare_resume(
    session: Session, run_id: str, body: MultistageResume, *, active: bool
) -> MultistageRun:
    """Mark the run running again for a new driver; locked, so that of two services
    resuming it at once one gets 409. A stage whose job ended without a model (it
    failed, or was cancelled while the run was stopped) is set to train again."""
    run = get_for_update(session, MultistageRun, run_id)
    if run is None:
        raise not_found("multistage run", run_id)
    status = effective_status(run, active=active)
    if status not in (RunStatus.INTERRUPTED, RunStatus.FAILED):
        stale = (
            ""
            if status != RunStatus.RUNNING
            else (
                "; a run whose service was killed reads as interrupted once it has not moved "
                f"for {STALE_AFTER.total_seconds():.0f} s, so retry then"
            )
        )
        raise ConflictError(
            f"run {run_id} is {status}; only interrupted or failed runs resume{stale}",
            code="run_not_resumable",
            detail={"status": status},
        )
    if body.training is not None:
        feature_set = FeatureSetRepository(session).get(run.feature_set_id)
        first = part_sizes(feature_set.num_rows, run.config["fractions"])[0]
        jobs.check_training(body.training, feature_set, first)
        run.config = {**run.config, "training": body.training.model_dump(mode="json")}
    run.state = _retrain_ended_jobs(session, run.state)
    run.status, run.error, run.finished_at, run.updated_at = (
        RunStatus.RUNNING,
        None,
        None,
        utcnow(),
    )
    return run


def cancel(session: Session, run_id: str) -> MultistageRun:
    """End a run for good: ``cancelled``, its stage's queued or running job
    cancelled. Its driver, on whichever service runs it, stops at its next write
    (a step in flight finishes first: what it spent stays spent, like all ε)."""
    run = get_for_update(session, MultistageRun, run_id)
    if run is None:
        raise not_found("multistage run", run_id)
    if run.status in (RunStatus.SUCCEEDED, RunStatus.CANCELLED):
        raise ConflictError(
            f"run {run_id} is already {run.status}",
            code="run_finished",
            detail={"status": run.status},
        )
    repository = JobRepository(session)
    for stage in run.state.get("stages", []):
        if stage.get("job_id") is not None and stage.get("model_id") is None:
            repository.cancel(stage["job_id"])  # False when it had ended: nothing to do
    run.status, run.error = RunStatus.CANCELLED, "cancelled by request"
    run.updated_at = run.finished_at = utcnow()
    return run


def _retrain_ended_jobs(session: Session, state: dict[str, Any]) -> dict[str, Any]:
    stages = []
    for stage in state.get("stages", []):
        job_id = stage.get("job_id")
        if job_id is not None and stage.get("model_id") is None:
            job = JobRepository(session).get(job_id)
            if Status(job.status).is_final and job.status != Status.SUCCEEDED:
                failed = [*stage.get("failed_jobs", []), job_id]
                stage = {k: v for k, v in stage.items() if k != "job_id"} | {"failed_jobs": failed}
        stages.append(stage)
    return {**state, "stages": stages}


def get(session: Session, run_id: str, *, active: bool) -> MultistageRead:
    return to_read(session, _get(session, run_id), active=active)


def list_page(session: Session, pager: Pager, drivers: Drivers) -> list[MultistageRead]:
    rows = pager.rows(session, select(MultistageRun), MultistageRun)
    return [to_read(session, r, active=drivers.is_active(r.id)) for r in rows]


def to_read(session: Session, run: MultistageRun, *, active: bool) -> MultistageRead:
    stages = [_stage(session, s) for s in run.state.get("stages", [])]
    status = effective_status(run, active=active)
    error = run.error
    if status == RunStatus.INTERRUPTED and error is None:
        error = "its service stopped without a clean shutdown; resume it with the token"
    return MultistageRead(
        id=run.id,
        status=status,
        feature_set_id=run.feature_set_id,
        dataset_id=run.dataset_id,
        labels_party_url=run.labels_party_url,
        config=run.config,
        partition_plan_id=run.state.get("partition_plan_id"),
        stages=stages,
        model_id=run.state.get("model_id"),
        error=error,
        created_at=run.created_at,
        updated_at=run.updated_at,
        finished_at=run.finished_at,
    )


def _stage(session: Session, state: dict[str, Any]) -> StageRead:
    stage = StageRead.model_validate(state)
    if stage.job_id is not None:
        job = JobRepository(session).get(stage.job_id)
        stage.job_status, stage.job_progress = job.status, job.progress
    return stage
