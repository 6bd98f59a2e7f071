"""LabelDP-Pro end to end, from the CLI, across both real parties as processes:
the publisher asks the labels party for a trained model (``labeldp label-party
trainings create … --watch``), a labels-party worker (``labeldp label-party
worker``) trains it by DP-SGD with the ALTCONV denoiser, the ledger and the audit
log carry its (ε, δ), and the model imported at the features party
(``labeldp feature-party models import``) predicts there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from feature_party.client import LabelsPartyClient
from labeldp.processes import ServiceProcess, running
from tests.e2e.conftest import Services, ok, parquet_bytes

pytestmark = pytest.mark.slow

K, N = 3, 300


def _problem(tmp_path: Path) -> tuple[pa.Table, Path]:
    """Labels, and a features file of four numeric columns that carry the label."""
    rng = np.random.default_rng(3)
    ids = [f"u{i}" for i in range(N)]
    labels = rng.integers(0, K, size=N)
    x = rng.normal(size=(N, 4)) + 2.0 * labels[:, None]
    features = pa.table({"example_id": ids, **{f"x{j}": x[:, j] for j in range(4)}})
    path = tmp_path / "features.parquet"
    path.write_bytes(parquet_bytes(features))
    return pa.table({"example_id": ids, "label": labels}), path


def _cli(args: list[str], env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "labeldp", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{args[:3]}: {done.stdout}\n{done.stderr}"
    return done.stdout


def test_labeldp_pro_from_the_cli_to_a_prediction(
    services: Services, database_urls: dict[str, str], tmp_path: Path
) -> None:
    labels, features_file = _problem(tmp_path)
    with LabelsPartyClient(services.labels_url, services.labels_admin) as admin:
        dataset = admin.create_dataset(name="pro", task="classification",
                                       label_domain={"num_classes": K}, epsilon_budget=5,
                                       delta_budget=1e-3)  # fmt: skip
        admin.upload_labels(dataset["id"], parquet_bytes(labels))
        client = admin.create_client(name="publisher", role="client")
        admin.create_grant(dataset["id"], client_id=client["id"])

    worker_env = {
        "LABELDP_MODE": "production",
        "LABELDP_DATA_DIR": str(tmp_path / "labels-party"),  # the service's (conftest)
        "LABELDP_DATABASE_URL": database_urls["labels"],
        "LABELDP_ADMIN_TOKEN": services.labels_admin,
        "LABELDP_WORKER_POLL_SECONDS": "0.2",
        "LABELDP_WORKER_HEARTBEAT_SECONDS": "0.5",
    }
    worker = ServiceProcess("labels worker", ["label-party", "worker"], worker_env,
                            services.logs / "labels-worker.log")  # fmt: skip
    with running(worker):
        out = _cli(
            ["label-party", "trainings", "create", "--url", services.labels_url,
             "--dataset", dataset["id"], "--features", str(features_file),
             "--epsilon", "2", "--delta", "1e-5", "--architecture", "mlp",
             "--denoiser", "alt-conv", "--epochs", "2", "--batch-size", "100",
             "--spec", json.dumps({"hidden": [16], "projection_steps": 5, "alt_batch_size": 8,
                                   "learning_rate": 0.5}),
             "--watch"],
            {"LABELDP_TOKEN": client["token"]},
        )  # fmt: skip
    found = re.search(r"training ([0-9a-f-]{36})", out)
    assert found is not None and "succeeded" in out, out
    training_id = found.group(1)

    with LabelsPartyClient(services.labels_url, services.labels_admin) as admin:
        budget = admin.get_budget(dataset["id"])
        assert budget["epsilon_spent"] == 2 and budget["delta_spent"] == pytest.approx(1e-5)
        assert admin.verify_audit()["ok"] is True
        actions = [e["action"] for e in admin.get_audit(dataset["id"])["entries"]]
        assert "training.reserved" in actions and "training.succeeded" in actions
        training = admin.get_training(training_id)
    assert training["accounting"]["epsilon"] <= 2

    imported = json.loads(
        _cli(
            ["feature-party", "models", "import", "--url", services.features_url,
             "--labels-party-url", services.labels_url, "--training", training_id],
            {"LABELDP_ADMIN_TOKEN": services.features_token,
             "LABELDP_LABELS_PARTY_TOKEN": client["token"]},
        )
    )  # fmt: skip
    assert imported["source"] == "labels-party-training" and imported["job_id"] is None
    assert imported["metrics"]["sha256"] == training["sha256"]
    # Importing it again registers nothing new.
    again = services.features.post(
        "/v1/models/import",
        json={"labels_party_url": services.labels_url, "token": client["token"],
              "training_id": training_id},
    )  # fmt: skip
    assert again.status_code == 200 and again.json()["id"] == imported["id"]

    rows = [{"example_id": f"q{c}", **{f"x{j}": 2.0 * c for j in range(4)}} for c in range(K)]
    predictions = ok(
        services.features.post(f"/v1/models/{imported['id']}/predict", json={"rows": rows}), 200
    )
    assert predictions["example_id"] == ["q0", "q1", "q2"]
    assert all(p in range(K) for p in predictions["prediction"])
