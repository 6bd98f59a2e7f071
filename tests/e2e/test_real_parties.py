"""End to end with the REAL labels party: ``labeldp label-party serve``,
``labeldp feature-party serve`` and ``labeldp feature-party worker`` as processes
on loopback, each party on its own database (SQLite files, or fresh Postgres
databases ``labeldp_e2e_<random>``).

The test plays both organizations and the referee on a real dataset (RAND HIE
medical spend): the advertiser uploads the *training* labels, the publisher
uploads the features of *every* row, asks for one release, trains, and predicts
the held-out rows. Only the test knows the held-out true labels; the services
never see them. It also checks the budget contract across the two services:
fetching a persisted release again is free and byte-identical, and a release
beyond the remaining budget is refused (409 ``budget_exceeded``, surfaced by the
features party) with nothing spent and nothing stored.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine, text

from feature_party.client import LabelsPartyClient
from labeldp.datasets import DatasetUnavailableError, load
from tests.e2e.conftest import Services, ok, parquet_bytes

pytestmark = pytest.mark.slow

EPSILON = 2.0
BUDGET = 3.0  # room for one release at ε = 2, not for a second one
RELEASE = {"mechanism": {"name": "unbiased", "mesh": 100}, "epsilon": EPSILON}
TRAINING = {"task": "regression", "loss": "squared", "epochs": 4, "batch_size": 512,
            "learning_rate": 3e-3, "seed": 0}  # fmt: skip


# -- helpers -----------------------------------------------------------------------------


def _received_rows(database_url: str) -> int:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM received_labels")).scalar_one())
    finally:
        engine.dispose()


def _stored_files(data_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*.parquet"))


def _train(features: httpx.Client, body: dict[str, Any], logs: Path) -> dict[str, Any]:
    job = ok(features.post("/v1/jobs", json=body), 202)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = ok(features.get(f"/v1/jobs/{job['id']}"), 200)
        if state["status"] == "succeeded":
            return state
        assert state["status"] not in ("failed", "cancelled"), (
            f"job {state['status']}: {state.get('error')}; see {logs / 'worker.log'}"
        )
        time.sleep(0.2)
    raise AssertionError(f"the job did not finish in 120 s; see {logs / 'worker.log'}")


# -- the test ------------------------------------------------------------------------------


def test_release_train_predict_and_budget(services: Services) -> None:
    try:
        data = load("rand-hie-spend")
    except DatasetUnavailableError as exc:
        pytest.skip(str(exc))
    train_rows, test_rows = data.split(seed=0)

    # The advertiser: a dataset, its training labels, a client with a grant.
    with LabelsPartyClient(services.labels_url, services.labels_admin) as advertiser:
        dataset = advertiser.create_dataset(
            name="e2e", task=data.task, label_domain=data.label_domain, epsilon_budget=BUDGET
        )
        labels = parquet_bytes(data.labels_table(train_rows))
        uploaded = advertiser.upload_labels(dataset["id"], labels)
        assert uploaded["num_labels"] == train_rows.size
        client = advertiser.create_client(name="publisher", role="client")
        advertiser.create_grant(dataset["id"], client_id=client["id"])

    def budget() -> dict[str, Any]:
        with LabelsPartyClient(services.labels_url, services.labels_admin) as advertiser:
            return advertiser.get_budget(dataset["id"])

    # The publisher: features of every row, then one release at ε = 2.
    features = services.features
    feature_set = ok(
        features.post(
            "/v1/feature-sets",
            files={"file": ("features.parquet", parquet_bytes(data.features_table()))},
            data={"schema": json.dumps({"numeric": data.numeric,
                                        "categorical": data.categorical})},
        ),
        201,
    )  # fmt: skip
    assert feature_set["num_rows"] == len(data)
    source = {
        "feature_set_id": feature_set["id"],
        "labels_party_url": services.labels_url,
        "token": client["token"],
        "dataset_id": dataset["id"],
    }
    received = ok(features.post("/v1/received-labels", json={**source, "release": RELEASE}), 201)
    assert received["num_labels"] == train_rows.size
    assert received["matched"] == train_rows.size and received["unmatched"] == 0
    spent = budget()
    assert spent["epsilon_spent"] == pytest.approx(EPSILON)

    # Fetching the same release again is free and answers with the row it made.
    again = ok(
        features.post("/v1/received-labels", json={**source, "release_id": received["release_id"]}),
        200,
    )
    assert again == received
    assert budget() == spent

    # Beyond the remaining budget: 409 budget_exceeded, nothing spent or stored.
    rows_before = _received_rows(services.features_db)
    files_before = _stored_files(services.features_data)
    refused = features.post(
        "/v1/received-labels", json={**source, "release": {**RELEASE, "epsilon": EPSILON}}
    )
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "budget_exceeded"
    assert budget() == spent
    assert _received_rows(services.features_db) == rows_before
    assert _stored_files(services.features_data) == files_before

    # Train on the release and predict the held-out rows.
    job = _train(
        features,
        {"feature_set_id": feature_set["id"], "labels_id": received["id"], **TRAINING},
        services.logs,
    )
    assert job["metrics"]["epochs_run"] >= 1
    test_features = data.features_table(test_rows)
    predicted = ok(
        features.post(
            f"/v1/models/{job['model_id']}/predict",
            files={"file": ("rows.parquet", parquet_bytes(test_features))},
        ),
        200,
    )
    by_id = dict(zip(predicted["example_id"], predicted["prediction"], strict=True))
    prediction = np.array([by_id[i] for i in data.example_id[test_rows]], dtype=np.float64)
    assert np.isfinite(prediction).all()

    # The referee: the model beats predicting the mean of the noisy labels, on
    # held-out TRUE labels.
    with LabelsPartyClient(services.labels_url, client["token"]) as publisher:
        path = services.logs.parent / "release.parquet"
        publisher.download_labels(received["release_id"], path, expected_sha256=received["sha256"])
    noisy_mean = float(np.mean(pq.read_table(path).column("label").to_numpy()))
    truth = data.labels[test_rows]
    model_mse = float(np.mean((prediction - truth) ** 2))
    mean_mse = float(np.mean((noisy_mean - truth) ** 2))
    print(f"test MSE: model {model_mse:,.0f}, noisy mean {mean_mse:,.0f}")
    assert model_mse < mean_mse, (model_mse, mean_mse)
