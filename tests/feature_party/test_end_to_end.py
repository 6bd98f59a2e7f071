"""End to end on loopback: the features-party service and real worker processes
(``python -m feature_party serve|worker``, SQLite), a fake labels party serving a
noisy release. Upload, fetch, train, predict; then SIGKILL a worker mid-job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import select

from feature_party.db import Database
from feature_party.orm import Model
from tests.feature_party.conftest import ADMIN, AUTH, csv_bytes, synthetic
from tests.feature_party.fake_labels_party import TOKEN, FakeLabelsParty, free_port, serve

pytestmark = pytest.mark.slow

N_TRAIN, N_TEST = 6000, 1500


@dataclass
class Stack:
    http: httpx.Client
    env: dict[str, str]
    data_dir: Path
    feature_set_id: str
    labels_id: str
    test_rows: list[dict[str, Any]]
    test_true: np.ndarray
    noisy_mean: float

    def worker(self, name: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "feature_party", "worker", "--id", name],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.http.get(f"/v1/jobs/{job_id}", headers=AUTH)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait(self, job_id: str, until: Any, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if until(job):
                return job
            time.sleep(0.2)
        raise AssertionError(f"job never got there: {job}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("e2e")
    port = free_port()
    env = {
        **os.environ,
        "LABELDP_DATA_DIR": str(tmp / "data"),
        "LABELDP_ADMIN_TOKEN": ADMIN,
        "LABELDP_JOB_LEASE_SECONDS": "3",
        "LABELDP_HEARTBEAT_SECONDS": "0.3",
        "LABELDP_POLL_SECONDS": "0.2",
        "LABELDP_CLIENT_BACKOFF_SECONDS": "0.05",
    }
    env.pop("LABELDP_DATABASE_URL", None)
    log = (tmp / "server.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "feature_party", "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    data = synthetic(N_TRAIN + N_TEST, seed=11)
    train_ids = data.features.column("example_id").to_pylist()[:N_TRAIN]
    try:
        with (
            serve(FakeLabelsParty()) as fake,
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http,
        ):
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert server.poll() is None, (tmp / "server.log").read_text()
                assert time.monotonic() < deadline, "the service did not start"
                time.sleep(0.2)
            fake.set_labels(train_ids, list(data.noisy[:N_TRAIN]))
            fake.fail_posts = 1  # the first answer is lost: the retry must not spend twice
            r = http.post(
                "/v1/feature-sets",
                headers=AUTH,
                files={"file": ("features.csv", csv_bytes(data.features))},
            )
            assert r.status_code == 201, r.text
            fs = r.json()
            assert fs["num_rows"] == N_TRAIN + N_TEST
            r = http.post(
                "/v1/received-labels",
                headers=AUTH,
                json={
                    "feature_set_id": fs["id"],
                    "labels_party_url": fake.url,
                    "token": TOKEN,
                    "dataset_id": fake.dataset_id,
                    "release": {"mechanism": {"name": "laplace"}, "epsilon": 1.0},
                },
            )
            assert r.status_code == 201, r.text
            received = r.json()
            assert received["matched"] == N_TRAIN and received["unmatched"] == 0
            assert fake.spent == 1.0 and len(fake.releases) == 1
            yield Stack(
                http=http,
                env=env,
                data_dir=tmp / "data",
                feature_set_id=fs["id"],
                labels_id=received["id"],
                test_rows=data.features.slice(N_TRAIN).to_pylist(),
                test_true=data.true[N_TRAIN:],
                noisy_mean=float(data.noisy[:N_TRAIN].mean()),
            )
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def test_train_and_predict_beats_the_noisy_mean(stack: Stack) -> None:
    r = stack.http.post(
        "/v1/jobs",
        headers=AUTH,
        json={
            "feature_set_id": stack.feature_set_id,
            "labels_id": stack.labels_id,
            "task": "regression",
            "loss": "squared",
            "epochs": 10,
            "batch_size": 256,
            "learning_rate": 3e-3,
            "optimizer": "adam",
            "hidden": [64, 32],
            "seed": 1,
        },
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    worker = stack.worker("e2e-a")
    try:
        job = stack.wait(job_id, lambda j: j["status"] in {"succeeded", "failed"})
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert job["status"] == "succeeded", job["error"]
    assert worker.returncode == 0
    r = stack.http.post(
        f"/v1/models/{job['model_id']}/predict", headers=AUTH, json={"rows": stack.test_rows}
    )
    assert r.status_code == 200, r.text
    pred = np.array(r.json()["prediction"])
    model_mse = float(np.mean((pred - stack.test_true) ** 2))
    mean_mse = float(np.mean((stack.noisy_mean - stack.test_true) ** 2))
    assert model_mse < 0.6 * mean_mse, (model_mse, mean_mse)

    watch = subprocess.run(
        [
            sys.executable,
            "-m",
            "feature_party",
            "jobs",
            "watch",
            job_id,
            "--url",
            str(stack.http.base_url),
        ],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert watch.returncode == 0, watch.stderr
    assert "100.0%" in watch.stdout and job["model_id"] in watch.stdout


def test_sigkilled_worker_job_is_requeued_and_resumes(stack: Stack) -> None:
    r = stack.http.post(
        "/v1/jobs",
        headers=AUTH,
        json={
            "feature_set_id": stack.feature_set_id,
            "labels_id": stack.labels_id,
            "epochs": 10,
            "batch_size": 16,
            "hidden": [16],
            "early_stopping_patience": None,
        },
    )
    job_id = r.json()["id"]
    first = stack.worker("doomed")
    try:
        stack.wait(job_id, lambda j: (j["progress"] or {}).get("epoch", 0) >= 2)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    dead = stack.job(job_id)
    assert dead["status"] == "running"  # still leased to the dead worker
    assert dead["lease_expires_at"] is not None
    # The API tells a dead worker's job from a live one once its lease lapses.
    stalled = stack.wait(job_id, lambda j: j["stalled"], timeout=30)
    assert stalled["status"] == "running" and stalled["attempts"] == 1
    second = stack.worker("rescuer")
    try:
        job = stack.wait(job_id, lambda j: j["status"] in {"succeeded", "failed"}, timeout=180)
    finally:
        second.terminate()
        second.wait(timeout=30)
    assert job["status"] == "succeeded", job["error"]
    assert job["attempts"] == 2 and not job["stalled"] and job["lease_expires_at"] is None
    assert job["metrics"]["resumed_from_epoch"] >= 1
    assert job["metrics"]["epochs_run"] == 10
    database = Database(f"sqlite:///{stack.data_dir / 'feature-party.db'}")
    try:
        with database.session() as session:
            models = session.scalars(select(Model).where(Model.job_id == job_id)).all()
    finally:
        database.dispose()
    assert [m.id for m in models] == [job["model_id"]]
    artifacts = list((stack.data_dir / "jobs" / job_id).glob("model-*.pt"))
    assert len(artifacts) == 1
