"""DistributedDataParallel on CPU: the worker launches torchrun with two gloo
processes for a job that asks for them."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from feature_party.db import Database, migrate
from feature_party.jobs.repository import JobRepository
from feature_party.jobs.status import Status
from feature_party.jobs.worker import Worker
from feature_party.training.artifact import load_artifact
from tests.feature_party.conftest import add_jobs, make_settings, seed_inputs
from tests.file_limits import fill, full_disk


@pytest.mark.slow
def test_two_gloo_processes_train_a_job(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    fs, labels = seed_inputs(database, settings, n=2000)
    [job_id] = add_jobs(
        database,
        fs,
        labels,
        1,
        device="cpu",
        processes=2,
        epochs=2,
        batch_size=256,
        hidden=[16, 8],
    )
    assert Worker(database, settings).run(once=True) == 1
    with database.session() as session:
        job = JobRepository(session).get(job_id)
        assert job.status == Status.SUCCEEDED, job.error
        assert job.metrics is not None
        assert job.metrics["world_size"] == 2
        assert job.metrics["epochs_run"] == 2
        [model] = JobRepository(session).models_of(job_id)
        path = settings.data_dir.resolve() / model.path
    predictor = load_artifact(path)
    assert isinstance(predictor.model, torch.nn.Module)
    database.dispose()


@pytest.mark.slow
def test_a_diverging_job_stops_on_every_rank_and_fails_saying_why(tmp_path: Path) -> None:
    """The check reads the weights, which DDP keeps equal on every rank: a check of
    each rank's own loss could stop one rank and leave the other in an all-reduce."""
    settings = make_settings(tmp_path)
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    fs, labels = seed_inputs(database, settings, n=800)
    [job_id] = add_jobs(database, fs, labels, 1, device="cpu", processes=2, epochs=3,
                        learning_rate=10.0, optimizer="sgd", momentum=0.9, batch_size=16,
                        hidden=[64], early_stopping_patience=None)  # fmt: skip
    started = time.monotonic()
    assert Worker(database, settings).run(once=True) == 1
    with database.session() as session:
        job = JobRepository(session).get(job_id)
        assert job.status == Status.FAILED and job.attempts == 1, job.error
        assert job.error is not None and "training diverged in epoch 1" in job.error
    assert time.monotonic() - started < 120
    database.dispose()


def _ranks_of(run_dir: Path) -> list[int]:
    """Pids of the training ranks running in ``run_dir`` (from /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = b"feature_party.training.distributed" in argv and str(run_dir).encode() in argv
        if ours and b"torch.distributed.run" not in argv:  # not the launcher itself
            pids.append(int(proc.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_a_killed_worker_leaves_no_rank_training(tmp_path: Path) -> None:
    """SIGKILL of the worker: the launcher dies with it (its death signal), and so
    must each rank, or they go on training beside the job's next owner."""
    settings = make_settings(tmp_path)
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    fs, labels = seed_inputs(database, settings, n=2000)
    [job_id] = add_jobs(database, fs, labels, 1, device="cpu", processes=2, epochs=400,
                        batch_size=64, hidden=[16, 8])  # fmt: skip
    database.dispose()
    env = {**os.environ, "LABELDP_DATA_DIR": str(settings.data_dir)}
    command = [sys.executable, "-m", "labeldp", "feature-party", "worker"]
    worker = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    job_dir = settings.data_dir.resolve() / "jobs" / job_id
    try:
        deadline = time.monotonic() + 120
        while not [*job_dir.glob("run-*/progress.json")]:  # the ranks are training
            assert time.monotonic() < deadline and worker.poll() is None, "no rank started"
            time.sleep(0.5)
        [run_dir] = job_dir.glob("run-*")  # the claim's own directory
        ranks = _ranks_of(run_dir)
        assert len(ranks) == 2
    finally:
        worker.kill()
        worker.wait()
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in ranks if _alive(pid)]


def test_rank_0_reports_a_full_disk_on_a_full_disk(tmp_path: Path) -> None:
    """A multi-GPU job whose disk fills must be retried, not failed: rank 0's report
    of the errno is written over space allocated at launch, where a new file (the
    result's) finds no block."""
    from feature_party.training import distributed

    with full_disk(tmp_path / "small") as run_dir:
        (run_dir / distributed.FAILURE).write_bytes(b" " * distributed.FAILURE_BYTES)
        assert distributed.read_result(run_dir) is None  # launched, nothing reported
        fill(run_dir)
        with pytest.raises(OSError) as full:
            distributed._write_json(run_dir / distributed.RESULT, {"ok": True, "metrics": {}})
        distributed.report_failure(run_dir, full.value)
        result = distributed.read_result(run_dir)
    assert result is not None and result["ok"] is False
    assert result["errno"] == errno.ENOSPC
