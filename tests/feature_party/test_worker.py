"""The worker loop in-process on SQLite: cancellation, shutdown hand-back,
failures recorded with their reason."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from feature_party.config import Settings
from feature_party.db import Database, migrate
from feature_party.jobs.repository import JobRepository
from feature_party.jobs.status import Status
from feature_party.jobs.worker import Worker
from feature_party.orm import Job, Model
from tests.cuda import needs_cuda
from tests.feature_party.conftest import add_jobs, make_settings, running_service, seed_inputs

LONG = {"epochs": 200, "batch_size": 16, "hidden": [8], "early_stopping_patience": None}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[Database, Settings, str, str]]:
    settings = make_settings(tmp_path)
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    fs, labels = seed_inputs(database, settings, n=800)
    yield database, settings, fs, labels
    database.dispose()


def job_row(database: Database, job_id: str) -> Job:
    with database.session() as session:
        return JobRepository(session).get(job_id)


def wait_for(predicate: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def start(worker: Worker, job_id: str) -> threading.Thread:
    thread = threading.Thread(target=worker.run_job, args=(job_id,))
    assert worker.claim() == job_id
    thread.start()
    return thread


def test_cancelling_a_running_job_stops_the_worker(
    env: tuple[Database, Settings, str, str],
) -> None:
    database, settings, fs, labels = env
    [job_id] = add_jobs(database, fs, labels, 1, **LONG)
    worker = Worker(database, settings)
    thread = start(worker, job_id)
    wait_for(lambda: (job_row(database, job_id).progress or {}).get("epoch", 0) >= 1)
    with database.session() as session:
        assert JobRepository(session).cancel(job_id)
    thread.join(timeout=30)
    assert not thread.is_alive()
    job = job_row(database, job_id)
    assert job.status == Status.CANCELLED and job.model_id is None
    assert not (settings.data_dir / "jobs" / job_id).exists()


def test_shutdown_gives_the_job_back_and_it_resumes(
    env: tuple[Database, Settings, str, str],
) -> None:
    database, settings, fs, labels = env
    [job_id] = add_jobs(database, fs, labels, 1, **{**LONG, "epochs": 30})
    worker = Worker(database, settings)
    thread = start(worker, job_id)
    wait_for(lambda: (job_row(database, job_id).progress or {}).get("epoch", 0) >= 2)
    worker.shutdown.set()  # what SIGTERM does
    thread.join(timeout=30)
    job = job_row(database, job_id)
    assert job.status == Status.QUEUED and job.worker_id is None
    assert (settings.data_dir / "jobs" / job_id / "checkpoint.pt").exists()
    assert Worker(database, settings).run(once=True) == 1
    job = job_row(database, job_id)
    assert job.status == Status.SUCCEEDED
    assert job.metrics is not None and job.metrics["resumed_from_epoch"] >= 1


def test_failures_are_recorded(env: tuple[Database, Settings, str, str]) -> None:
    database, settings, fs, labels = env
    [bad_labels] = add_jobs(
        database, fs, labels, 1, task="classification", loss="cross-entropy", num_classes=2
    )
    assert Worker(database, settings).run(once=True) == 1
    bad = job_row(database, bad_labels)
    assert bad.status == Status.FAILED
    assert bad.error is not None and "class indices" in bad.error


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_job_on_a_worker_without_one_fails_with_the_reason(
    env: tuple[Database, Settings, str, str],
) -> None:
    database, settings, fs, labels = env
    [gpu_job] = add_jobs(database, fs, labels, 1, device="cuda", epochs=1)
    assert Worker(database, settings, gpus=0).run(once=True) == 0  # left for a GPU worker
    assert job_row(database, gpu_job).status == Status.QUEUED
    # A worker that offers a GPU it cannot use (a broken driver) fails the job.
    assert Worker(database, settings, gpus=1).run(once=True) == 1
    gpu = job_row(database, gpu_job)
    assert gpu.status == Status.FAILED
    assert gpu.error is not None and "no GPU" in gpu.error


@needs_cuda
@pytest.mark.parametrize("device", ["cuda", "auto", 1], ids=["cuda", "auto", "one-gpu-ddp"])
def test_a_gpu_job_trains_on_the_gpu(
    env: tuple[Database, Settings, str, str], device: str | int
) -> None:
    """``cuda`` and ``auto`` train in the worker's process; a GPU count goes
    through the distributed launcher (NCCL), here with one rank."""
    database, settings, fs, labels = env
    [job_id] = add_jobs(database, fs, labels, 1, device=device, epochs=2)
    assert Worker(database, settings).run(once=True) == 1
    job = job_row(database, job_id)
    assert job.status == Status.SUCCEEDED, job.error
    assert job.metrics is not None and str(job.metrics["device"]).startswith("cuda")
    assert job.metrics["embedding_updates"] == "dense"  # the GPU's faster update


def test_start_up_deletes_what_finished_jobs_left_behind(tmp_path: Path) -> None:
    """A worker that died, or left a job to its lease on a full disk before the job
    was cancelled, cannot delete its checkpoint: the next start does, for jobs that
    never run again, with model files no model row names, and keeps registered
    models and everything of a running job."""
    settings = make_settings(tmp_path)
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    fs, labels = seed_inputs(database, settings, n=50)
    cancelled, succeeded, running = add_jobs(database, fs, labels, 3, epochs=1)
    with database.session() as session:
        for job_id, status in ((cancelled, Status.CANCELLED), (succeeded, Status.SUCCEEDED),
                               (running, Status.RUNNING)):  # fmt: skip
            job = session.get(Job, job_id)
            assert job is not None
            job.status = status
        session.add(Model(id="m1", job_id=succeeded, path=f"jobs/{succeeded}/model-1.pt",
                          task="regression", loss="squared", metrics={}))  # fmt: skip
    left: dict[str, list[Path]] = {}
    for job_id in (cancelled, succeeded, running):
        job_dir = settings.data_dir / "jobs" / job_id
        (job_dir / "run").mkdir(parents=True)  # as older workers named it
        (job_dir / "run-0123abcd").mkdir()  # a claim's own
        left[job_id] = [job_dir / "checkpoint.pt", job_dir / ".checkpoint.pt.ab12.partial",
                        job_dir / "model-1.pt"]  # fmt: skip
        for path in left[job_id]:
            path.write_bytes(b"x")
    database.dispose()
    with running_service(settings) as client:
        assert client.get("/healthz").status_code == 200
    for job_id in (cancelled, succeeded):
        checkpoint, partial, model = left[job_id]
        assert not checkpoint.exists() and not partial.exists()
        assert model.exists() == (job_id == succeeded)  # the cancelled job's is no model's
        assert not [*(settings.data_dir / "jobs" / job_id).glob("run*")]
    assert all(path.exists() for path in left[running])


def test_an_idle_worker_sweeps_what_killed_processes_left(
    env: tuple[Database, Settings, str, str],
) -> None:
    """A long-running service swept ``tmp/`` only when it started, and never a model
    file whose job ended without recording it: an idle worker does both."""
    database, settings, fs_id, labels_id = env
    (job_id,) = add_jobs(database, fs_id, labels_id, 1, epochs=1, batch_size=64)
    assert Worker(database, settings).run(once=True) == 1
    job = job_row(database, job_id)
    assert job.status == Status.SUCCEEDED and job.model_id is not None
    job_dir = settings.data_dir / "jobs" / job_id
    (registered,) = job_dir.glob("model-*.pt")
    orphan = job_dir / "model-0123456789abcdef.pt"  # written by an attempt that was killed
    orphan.write_bytes(registered.read_bytes())
    tmp = settings.data_dir / "tmp"
    tmp.mkdir(exist_ok=True)
    stale, young = tmp / "a.upload", tmp / "b.upload"
    for path in (stale, young):
        path.write_bytes(b"part")
    hours_ago = time.time() - 2 * 3600
    os.utime(stale, (hours_ago, hours_ago))
    assert Worker(database, settings).run(once=True) == 0  # idle: it sweeps
    assert not orphan.exists() and not stale.exists()
    assert registered.exists() and young.exists()


def test_a_diverging_job_fails_once_saying_why_on_every_database(
    settings: Settings, tmp_path: Path
) -> None:
    """Learning rate 10 with SGD drives the loss to NaN. JSON has no NaN: SQLite
    stored it and Postgres refused it, so there every heartbeat and the success
    failed and the job ran five times before failing as "stopped responding". Then
    it succeeded, with ``train_loss`` null and a model predicting NaN. It fails
    once, after the epoch that diverged, and says so; its heartbeats' NaN is null."""
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    try:
        fs, labels = seed_inputs(database, settings, n=800)
        diverging = {"learning_rate": 10.0, "optimizer": "sgd", "momentum": 0.9,
                     "batch_size": 16, "hidden": [64], "epochs": 3,
                     "early_stopping_patience": None}  # fmt: skip
        [job_id] = add_jobs(database, fs, labels, 1, **diverging)
        worker = Worker(database, settings, worker_id="w")
        assert worker.claim() == job_id
        worker.run_job(job_id)
        job = job_row(database, job_id)
        assert (job.status, job.attempts) == (Status.FAILED, 1), job.error
        assert job.error is not None
        assert "training diverged in epoch 1: the model's weights are no longer finite" in job.error
        assert "lower learning_rate" in job.error
        with database.session() as session:
            assert JobRepository(session).models_of(job_id) == []
    finally:
        database.dispose()


class _Ranks:
    """A stand-in for a torchrun launch: it runs until its directory's stop file
    appears (the stop it was told) or its owner lets it finish, like the ranks."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.pid, self.returncode = run_dir, -1, None
        self.finish = threading.Event()

    def poll(self) -> int | None:
        from feature_party.training import distributed

        if (self.run_dir / distributed.STOP).exists():
            self.returncode = 1
        elif self.finish.is_set():
            (self.run_dir / distributed.RESULT).write_text('{"ok": true, "metrics": {"m": 1}}')
            self.returncode = 0
        return self.returncode


def test_a_worker_that_lost_its_job_stops_only_its_own_ranks(
    env: tuple[Database, Settings, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two owners of one job (A's lease lapsed, B claimed it) shared jobs/<id>/run:
    A's late stop touched B's stop file, B's ranks quit without a result and B
    failed the job for good."""
    from feature_party.jobs import worker as worker_module

    database, settings, fs, labels = env
    [job_id] = add_jobs(database, fs, labels, 1, device="cpu", processes=2, epochs=1)
    launched: list[_Ranks] = []

    def launch(run_dir: Path, spec: object, *, processes: int) -> _Ranks:
        run_dir.mkdir(parents=True, exist_ok=True)
        launched.append(_Ranks(run_dir))
        return launched[-1]

    monkeypatch.setattr(worker_module.distributed, "launch", launch)
    a, b = (Worker(database, settings, worker_id=w) for w in ("a", "b"))
    spec, job_dir = a._spec(job_id)
    stale, owner = worker_module._Shared(), worker_module._Shared()
    results: dict[str, object] = {}

    def run(worker: Worker, shared: object, name: str) -> None:
        try:
            results[name] = worker._run_distributed(spec, job_dir, shared)  # type: ignore[arg-type]
        except Exception as exc:
            results[name] = exc

    threads = [threading.Thread(target=run, args=(a, stale, "a"))]
    threads[0].start()
    wait_for(lambda: len(launched) == 1)
    threads.append(threading.Thread(target=run, args=(b, owner, "b")))
    threads[1].start()
    wait_for(lambda: len(launched) == 2)
    stale.stop.set()  # A learns it lost the job
    threads[0].join(timeout=30)
    assert isinstance(results["a"], worker_module.Interrupted)
    launched[1].finish.set()  # B's ranks were left to finish
    threads[1].join(timeout=30)
    assert results["b"] == {"m": 1}
    assert not [*job_dir.glob("run*")]  # each claim's directory goes with it
