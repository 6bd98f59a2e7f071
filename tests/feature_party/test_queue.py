"""The job queue on SQLite and on a real Postgres: exclusive claims, leases,
guarded transitions, and two worker processes that never run the same job."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from feature_party.config import Settings
from feature_party.db import Database, migrate
from feature_party.jobs.repository import JobRepository
from feature_party.jobs.status import Status
from feature_party.jobs.worker import Worker
from feature_party.orm import Job, Model
from shared import lease_queue
from shared.lease_queue import LeaseQueue
from shared.timestamps import utcnow
from tests.feature_party.conftest import (
    ADMIN,
    AUTH,
    add_jobs,
    make_settings,
    running_service,
    seed_inputs,
)
from tests.file_limits import run_under_limit

TINY = {"epochs": 1, "batch_size": 128, "hidden": [8], "validation_fraction": 0.0}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Database, Settings]]:
    if request.param == "postgres":
        url = request.getfixturevalue("postgres_url")
        settings = make_settings(tmp_path, database_url=url)
    else:
        settings = make_settings(tmp_path)
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    with database.session() as session:  # a clean queue per test on the shared Postgres db
        session.query(Model).delete()
        session.query(Job).delete()
    yield database, settings
    database.dispose()


def test_concurrent_claims_never_share_a_job(db: tuple[Database, Settings]) -> None:
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    ids = add_jobs(database, fs, labels, 40, **TINY)
    claimed: list[str] = []
    lock = threading.Lock()

    def claimer(i: int) -> None:
        worker = Worker(database, settings, worker_id=f"w{i}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                if len(claimed) >= len(ids):
                    return
            job = worker.claim()
            if job is not None:
                with lock:
                    claimed.append(job)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counter(claimed).most_common(1)[0][1] == 1
    assert sorted(claimed) == sorted(ids)
    with database.session() as session:
        attempts = session.scalars(select(Job.attempts)).all()
    assert set(attempts) == {1}


def test_expired_lease_requeues_and_the_old_worker_loses(db: tuple[Database, Settings]) -> None:
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    [job_id] = add_jobs(database, fs, labels, 1, **TINY)
    with database.session() as session:
        repo = JobRepository(session)
        assert repo.claim(worker_id="a", lease_seconds=-1) is not None  # expired
    with database.session() as session:
        repo = JobRepository(session)
        job = repo.claim(worker_id="b", lease_seconds=60)
        assert job is not None and job.id == job_id and job.attempts == 2
    with database.session() as session:
        repo = JobRepository(session)
        assert not repo.heartbeat(job_id, "a", lease_seconds=60, progress=None)
        assert repo.heartbeat(job_id, "b", lease_seconds=60, progress={"epoch": 1})
        stale = Model(
            id="m-a", job_id=job_id, path="x", task="regression", loss="squared", metrics={}
        )
        assert not repo.succeed(job_id, "a", model=stale, metrics={})
    with database.session() as session:
        repo = JobRepository(session)
        fresh = Model(
            id="m-b", job_id=job_id, path="x", task="regression", loss="squared", metrics={}
        )
        assert repo.succeed(job_id, "b", model=fresh, metrics={})
    with database.session() as session:
        assert [m.id for m in JobRepository(session).models_of(job_id)] == ["m-b"]
        assert JobRepository(session).get(job_id).status == Status.SUCCEEDED


def test_a_lapsed_lease_reads_stalled_until_the_job_is_claimed_again(
    db: tuple[Database, Settings],
) -> None:
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    # One at a time, so that claims take them in this order (oldest first).
    live, lapsed, waiting = (add_jobs(database, fs, labels, 1, **TINY)[0] for _ in range(3))
    with database.session() as session:
        repo = JobRepository(session)
        for worker, seconds, expected in [("alive", 60, live), ("dead", -1, lapsed)]:
            job = repo.claim(worker_id=worker, lease_seconds=seconds)
            assert job is not None and job.id == expected
    with database.session() as session:
        repo = JobRepository(session)
        stalled = {j: repo.stalled(repo.get(j)) for j in (lapsed, live, waiting)}
        assert stalled == {lapsed: True, live: False, waiting: False}
        assert LeaseQueue(session, Job, clock=utcnow).count_stalled() == 1
        retaken = repo.claim(worker_id="rescuer", lease_seconds=60)
        assert retaken is not None and retaken.id == lapsed
        assert not repo.stalled(retaken)
        assert LeaseQueue(session, Job, clock=utcnow).count_stalled() == 0


@pytest.mark.postgres
@pytest.mark.parametrize("db", ["postgres"], indirect=True)
def test_a_worker_whose_clock_runs_fast_takes_no_healthy_lease(
    db: tuple[Database, Settings],
) -> None:
    """Leases are judged by the database's clock (``LeaseQueue.now``): judged by
    its own, a worker ten minutes fast took over the job and failed it as dead."""
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    [job_id] = add_jobs(database, fs, labels, 1, **TINY)
    with database.session() as session:
        assert JobRepository(session).claim(worker_id="a", lease_seconds=60) is not None

    def fast() -> datetime:
        return utcnow() + timedelta(minutes=10)

    with database.session() as session:
        queue = LeaseQueue(session, Job, clock=fast)
        assert queue.fail_exhausted(max_attempts=1) == []
        assert queue.claim(worker_id="b", lease_seconds=60) is None
        assert queue.heartbeat(job_id, "a", lease_seconds=60, progress=None)
    with database.session() as session:
        job = JobRepository(session).get(job_id)
        assert (job.status, job.worker_id) == (Status.RUNNING, "a")
        assert job.lease_expires_at is not None
        assert abs((job.lease_expires_at - utcnow()).total_seconds() - 60) < 5


def test_cancel_stops_a_running_job(db: tuple[Database, Settings]) -> None:
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    [job_id] = add_jobs(database, fs, labels, 1, **TINY)
    with database.session() as session:
        JobRepository(session).claim(worker_id="a", lease_seconds=60)
    with database.session() as session:
        assert JobRepository(session).cancel(job_id)
    with database.session() as session:
        repo = JobRepository(session)
        assert not repo.heartbeat(job_id, "a", lease_seconds=60, progress=None)
        assert not repo.cancel(job_id)  # already final
        assert repo.claim(worker_id="b", lease_seconds=60) is None


def test_workers_give_up_on_jobs_that_keep_killing_them(db: tuple[Database, Settings]) -> None:
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    [job_id] = add_jobs(database, fs, labels, 1, **TINY)
    with database.session() as session:
        session.get(Job, job_id).attempts = 5  # type: ignore[union-attr]
        session.get(Job, job_id).status = Status.RUNNING  # type: ignore[union-attr]
        session.get(Job, job_id).lease_expires_at = utcnow()  # type: ignore[union-attr]
    assert Worker(database, settings).claim() is None
    with database.session() as session:
        job = JobRepository(session).get(job_id)
        assert job.status == Status.FAILED and "stopped responding" in (job.error or "")


@pytest.mark.postgres
@pytest.mark.parametrize("db", ["postgres"], indirect=True)
def test_an_exhausted_job_whose_row_is_locked_stops_no_other_claim(
    db: tuple[Database, Settings],
) -> None:
    """A worker frozen mid-heartbeat holds its job's row lock; on its last attempt
    with its lease lapsed, every other worker's claim waited on that lock in
    ``fail_exhausted`` and no job ran until the frozen one woke (helper-68)."""
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    frozen_id, waiting_id = add_jobs(database, fs, labels, 2, **TINY)
    with database.session() as session:
        job = session.get(Job, frozen_id)
        assert job is not None
        job.status, job.worker_id, job.attempts = Status.RUNNING, "frozen", 5
        job.lease_expires_at = utcnow() - timedelta(seconds=1)
    holder = Session(database.engine)
    try:
        holder.execute(select(Job).where(Job.id == frozen_id).with_for_update())  # the heartbeat
        claimed: list[str | None] = []
        worker = threading.Thread(
            target=lambda: claimed.append(Worker(database, settings, worker_id="w").claim())
        )
        worker.start()
        worker.join(timeout=20)
        assert not worker.is_alive(), "the claim waited on the frozen worker's lock"
        assert claimed == [waiting_id]
    finally:
        holder.rollback()
        holder.close()
        worker.join()


@pytest.mark.postgres
@pytest.mark.parametrize("db", ["postgres"], indirect=True)
def test_a_cancel_does_not_wait_for_a_frozen_worker_s_row_lock(
    db: tuple[Database, Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DELETE /v1/jobs/{id}`` waited on the row lock of a worker frozen while it
    wrote its heartbeat, for as long as the worker stayed frozen; now it answers
    503 ``row_busy`` with ``Retry-After``, changes nothing, and a retry once the
    lock is gone cancels."""
    monkeypatch.setattr(lease_queue, "CANCEL_LOCK_TIMEOUT_MS", 300)
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    [job_id] = add_jobs(database, fs, labels, 1, **TINY)
    with database.session() as session:
        JobRepository(session).claim(worker_id="frozen", lease_seconds=60)
    holder = Session(database.engine)
    with running_service(settings) as client:
        client.headers.update(AUTH)
        try:
            holder.execute(select(Job).where(Job.id == job_id).with_for_update())
            busy = client.delete(f"/v1/jobs/{job_id}", timeout=20)
            assert busy.status_code == 503, busy.text
            assert busy.json()["error"] == "row_busy" and busy.headers["retry-after"] == "5"
            assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "running"
        finally:
            holder.rollback()
            holder.close()
        cancelled = client.delete(f"/v1/jobs/{job_id}")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


def _clean_postgres(url: str, tmp_path: Path) -> tuple[Settings, Database]:
    """Settings and a migrated database with an empty queue (the session's Postgres
    database is shared by the tests)."""
    settings = make_settings(tmp_path, database_url=url)
    database = Database(url)
    migrate(database.engine)
    with database.session() as session:
        session.query(Model).delete()
        session.query(Job).delete()
    return settings, database


@pytest.mark.postgres
@pytest.mark.slow
def test_two_worker_processes_on_postgres(postgres_url: str, tmp_path: Path) -> None:
    settings, database = _clean_postgres(postgres_url, tmp_path)
    fs, labels = seed_inputs(database, settings, n=300)
    ids = add_jobs(database, fs, labels, 6, **TINY)
    env = {
        **os.environ,
        "LABELDP_DATABASE_URL": postgres_url,
        "LABELDP_DATA_DIR": str(settings.data_dir),
        "LABELDP_ADMIN_TOKEN": ADMIN,
        "LABELDP_POLL_SECONDS": "0.1",
        "LABELDP_HEARTBEAT_SECONDS": "0.5",
        "OMP_NUM_THREADS": "1",
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "feature_party", "worker", "--id", f"w{i}"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with database.session() as session:
                done = session.scalar(select(func.count()).where(Job.status == Status.SUCCEEDED))
            if done == len(ids):
                break
            time.sleep(0.3)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            _, err = w.communicate(timeout=30)
            assert w.returncode == 0, err.decode()[-2000:]
    with database.session() as session:
        jobs = session.scalars(select(Job)).all()
        models = session.scalars(select(Model)).all()
    assert {j.status for j in jobs} == {Status.SUCCEEDED}
    assert {j.attempts for j in jobs} == {1}  # nobody ran a job twice
    assert sorted(m.job_id for m in models) == sorted(ids)
    assert {j.worker_id for j in jobs} <= {"w0", "w1"}
    database.dispose()


def test_clean_hand_backs_are_not_deaths(db: tuple[Database, Settings]) -> None:
    """Deploys stop workers cleanly (SIGTERM hands the job back): that must not
    use up the attempts meant for workers that die, or a paid-for job fails after
    two redeploys and one real crash."""
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    [job_id] = add_jobs(database, fs, labels, 1, **TINY)
    for worker in ("a", "b", "c", "d"):
        with database.session() as session:
            repo = JobRepository(session)
            assert repo.claim(worker_id=worker, lease_seconds=60) is not None
            assert repo.release(job_id, worker)
    with database.session() as session:
        repo = JobRepository(session)
        assert repo.get(job_id).attempts == 0
        assert repo.claim(worker_id="e", lease_seconds=-1) is not None  # then dies
        assert repo.fail_exhausted(max_attempts=2) == []
        assert repo.claim(worker_id="f", lease_seconds=-1) is not None  # dies again
    with database.session() as session:
        assert JobRepository(session).fail_exhausted(max_attempts=2) == [job_id]
        assert JobRepository(session).get(job_id).status == Status.FAILED


def test_a_lapsed_lease_on_its_last_attempt_is_never_claimed(db: tuple[Database, Settings]) -> None:
    """The row whose lease runs out between ``fail_exhausted`` and ``claim`` (two
    statements, two clock readings) must not get one run more than the attempts."""
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    [job_id] = add_jobs(database, fs, labels, 1, **TINY)
    with database.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.status, job.worker_id, job.attempts = Status.RUNNING, "dead", 3
        job.lease_expires_at = utcnow() - timedelta(seconds=1)
    with database.session() as session:
        repo = JobRepository(session)
        assert repo.claim(worker_id="b", lease_seconds=60, max_attempts=3) is None
        assert repo.claim(worker_id="b", lease_seconds=60, max_attempts=4) is not None


@pytest.mark.postgres
def test_a_job_storage_refused_is_left_to_retry_not_failed(
    postgres_url: str, tmp_path: Path
) -> None:
    """A job whose checkpoint or model the disk refuses (a real EFBIG: the worker
    process runs under ``ulimit -f``) stays running until its lease lapses, and the
    next worker trains it. A file-size limit, unlike a full disk, keeps its
    attempts. Postgres: on SQLite the limit refuses the database too."""
    settings, database = _clean_postgres(postgres_url, tmp_path)
    fs, labels = seed_inputs(database, settings, n=200)
    [job_id] = add_jobs(database, fs, labels, 1, **TINY)
    env = {
        **os.environ,
        "LABELDP_DATABASE_URL": postgres_url,
        "LABELDP_DATA_DIR": str(settings.data_dir),
        "OMP_NUM_THREADS": "1",
    }
    worker = run_under_limit(["feature_party", "worker", "--once", "--id", "full-disk"], env,
                             2 << 10)  # fmt: skip
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert "left to retry" in worker.stderr and "EFBIG" in worker.stderr, worker.stderr[-3000:]
    with database.session() as session:
        job = JobRepository(session).get(job_id)
        assert (job.status, job.attempts) == (Status.RUNNING, 1)  # a limit keeps its attempts
        job.lease_expires_at = utcnow() - timedelta(seconds=1)  # that worker is gone
    assert Worker(database, settings, worker_id="roomy").run(once=True) == 1
    with database.session() as session:
        job = JobRepository(session).get(job_id)
        assert (job.status, job.attempts, job.worker_id) == (Status.SUCCEEDED, 2, "roomy")
    database.dispose()


def test_a_worker_claims_only_the_jobs_its_gpus_can_run(db: tuple[Database, Settings]) -> None:
    """A CPU-only worker took a GPU job and failed it at once ("asks for CUDA but this
    worker has no GPU"), though a GPU worker of the same party would have run it;
    such a job now waits for a worker with enough GPUs."""
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    one_gpu = add_jobs(database, fs, labels, 1, device="cuda", **TINY)[0]  # the oldest
    two_gpus = add_jobs(database, fs, labels, 1, device=2, **TINY)[0]
    anywhere = add_jobs(database, fs, labels, 1, **TINY)[0]  # device "auto"
    on_cpu = add_jobs(database, fs, labels, 1, device="cpu", **TINY)[0]
    cpu_worker = Worker(database, settings, worker_id="cpu", gpus=0)
    assert [cpu_worker.claim(), cpu_worker.claim(), cpu_worker.claim()] == [anywhere, on_cpu, None]
    gpu_worker = Worker(database, settings, worker_id="gpu", gpus=1)
    assert [gpu_worker.claim(), gpu_worker.claim()] == [one_gpu, None]
    assert Worker(database, settings, worker_id="gpu2", gpus=2).claim() == two_gpus
    with database.session() as session:
        assert session.get(Job, two_gpus).gpus == 2  # type: ignore[union-attr]


def test_a_job_created_through_the_api_records_the_gpus_it_asks_for(
    db: tuple[Database, Settings],
) -> None:
    database, settings = db
    fs, labels = seed_inputs(database, settings, n=50)
    with running_service(settings) as client:
        made = {device: client.post("/v1/jobs", headers=AUTH, json={
            "feature_set_id": fs, "labels_id": labels, "device": device, **TINY}).json()["id"]
            for device in ("cuda", 3, "auto")}  # fmt: skip
        read = client.get(f"/v1/jobs/{made[3]}", headers=AUTH).json()
        assert (read["status"], read["gpus"]) == ("queued", 3)
    with database.session() as session:
        assert {d: session.get(Job, i).gpus for d, i in made.items()} == {  # type: ignore[union-attr]
            "cuda": 1, 3: 3, "auto": 0}  # fmt: skip
        # Left queued on the session's Postgres database, they were the next test's
        # claim (a test that claims the job it added expects that one).
        session.query(Job).delete()
