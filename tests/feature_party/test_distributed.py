"""DistributedDataParallel on CPU: the worker launches torchrun with two gloo
processes for a job that asks for them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from feature_party.db import Database, migrate
from feature_party.jobs.repository import JobRepository
from feature_party.jobs.status import Status
from feature_party.jobs.worker import Worker
from feature_party.training.artifact import load_artifact
from tests.feature_party.conftest import add_jobs, make_settings, seed_inputs


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
