"""LabelDP-Pro trainings through the real labels-party API (SQLite and Postgres):
submit → the worker trains → the model downloads; the ledger and the audit log
carry the training's (ε, δ); refusals spend nothing; access mirrors releases."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from sqlalchemy import select

from label_party.db import connect, transaction
from label_party.labeldp_pro import LabelDPProConfig
from label_party.models import Training
from label_party.storage import TRAININGS_GRACE_SECONDS
from label_party.trainings.schemas import TrainingSpec
from label_party.trainings.worker import Worker
from shared.torch_models import build_model, model_config_from_dict
from tests.cuda import needs_cuda
from tests.file_limits import fill, full_disk, run_under_limit
from tests.label_party.conftest import Server
from tests.label_party.helpers import create_client, parquet_bytes, upload_labels

NUM_CLASSES = 3
FAST = {"epochs": 1, "projection_steps": 3, "alt_batch_size": 8}
#: A tabular spec that trains in well under a second (for tests about the API).
CHEAP = {"architecture": "mlp", "hidden": [8], "denoiser": "noop", "epochs": 1}


def run_worker(server: Server) -> int:
    """One in-process worker pass over the queue (what ``labeldp label-party worker
    --once`` does); returns the number of trainings it ran."""
    settings = server.settings
    db = connect(settings.resolved_database_url)
    try:
        return Worker(db, settings, worker_id="test-worker").run(once=True)
    finally:
        db.dispose()


def make_dataset(
    admin: httpx.Client,
    *,
    n: int = 200,
    task: str = "classification",
    epsilon_budget: float = 10.0,
    delta_budget: float = 0.01,
) -> tuple[str, list[str], np.ndarray]:
    domain = {"num_classes": NUM_CLASSES} if task == "classification" else {"min": 0, "max": 2}
    r = admin.post(
        "/v1/datasets",
        json={
            "name": "pro",
            "task": task,
            "label_domain": domain,
            "epsilon_budget": epsilon_budget,
            "delta_budget": delta_budget,
        },
    )
    assert r.status_code == 201, r.text
    dataset_id: str = r.json()["id"]
    rng = np.random.default_rng(7)
    ids = [f"e{i}" for i in range(n)]
    labels = rng.integers(0, NUM_CLASSES, size=n)
    r = upload_labels(admin, dataset_id, ids, labels.tolist())
    assert r.status_code == 200, r.text
    return dataset_id, ids, labels


def tabular(ids: list[str], labels: np.ndarray, **extra: list[Any]) -> bytes:
    """Four numeric features that carry the label, plus ``extra`` columns."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(len(ids), 4)) + labels[:, None]
    columns: dict[str, list[Any]] = {"example_id": ids}
    columns.update({f"x{j}": x[:, j].tolist() for j in range(4)})
    columns.update(extra)
    return parquet_bytes(columns)


def images(ids: list[str], labels: np.ndarray) -> bytes:
    rng = np.random.default_rng(5)
    pixels = rng.random((len(ids), 28 * 28)) + labels[:, None] * 0.5
    columns: dict[str, list[Any]] = {"example_id": ids}
    columns.update({f"p{j}": pixels[:, j].tolist() for j in range(28 * 28)})
    return parquet_bytes(columns)


def submit(client: httpx.Client, dataset_id: str, features: bytes, **spec: Any) -> httpx.Response:
    return client.post(
        f"/v1/datasets/{dataset_id}/trainings",
        files={"file": ("features.parquet", features)},
        data={"spec": json.dumps(spec)},
    )


@pytest.fixture
def granted(server: Server) -> tuple[httpx.Client, httpx.Client, str, list[str], np.ndarray]:
    """(admin, a granted client, dataset id, example ids, labels)."""
    admin = server.client()
    dataset_id, ids, labels = make_dataset(admin)
    client_id, token = create_client(admin)
    assert admin.post(f"/v1/datasets/{dataset_id}/grants", json={"client_id": client_id}).is_success
    return admin, server.client(token), dataset_id, ids, labels


def test_cnn_training_charges_ledger_and_releases_a_model(server: Server, granted: Any) -> None:
    admin, client, dataset_id, ids, labels = granted
    r = submit(client, dataset_id, images(ids, labels), epsilon=4, delta=1e-5,
               expected_batch_size=100, projection_backend="dense", **FAST)  # fmt: skip
    assert r.status_code == 201, r.text
    training = r.json()
    assert training["status"] == "queued" and training["num_examples"] == len(ids)
    assert training["spec"]["denoiser"] == "alt-conv"
    assert training["spec"]["projection_backend"] == "dense"
    # What was left out is filled in with what the trainer uses (recorded in
    # the artifact too, below).
    defaults = LabelDPProConfig(epsilon=1, delta=0.1, num_classes=2)
    assert training["spec"]["smoothing"] == defaults.smoothing == 0.75
    assert training["spec"]["projection_method"] == defaults.projection_method

    budget = admin.get(f"/v1/datasets/{dataset_id}/budget").json()
    assert budget["epsilon_spent"] == 4 and budget["delta_spent"] == pytest.approx(1e-5)
    # Not downloadable before it trained.
    assert client.get(f"/v1/trainings/{training['id']}/model").status_code == 409

    assert run_worker(server) >= 1
    done = client.get(f"/v1/trainings/{training['id']}").json()
    assert done["status"] == "succeeded", done["error"]
    assert done["progress"]["step"] == done["progress"]["total_steps"] == 2
    accounting = done["accounting"]
    assert 0 < accounting["epsilon"] <= 4 and accounting["delta"] == pytest.approx(1e-5)
    assert accounting["noise_multiplier"] > 0

    model = client.get(f"/v1/trainings/{training['id']}/model")
    assert model.status_code == 200
    assert model.headers["content-type"] == "application/octet-stream"
    sha = hashlib.sha256(model.content).hexdigest()
    assert sha == model.headers["X-Content-SHA256"] == done["sha256"]
    blob = torch.load(io.BytesIO(model.content), weights_only=True)
    assert blob["format"] == "labeldp-model/1" and blob["num_classes"] == NUM_CLASSES
    assert blob["model"]["architecture"] == "cnn" and blob["accounting"] == accounting
    assert blob["preprocessing"]["numeric"][:2] == ["p0", "p1"]
    assert blob["training"]["smoothing"] == 0.75
    net = build_model(model_config_from_dict(blob["model"]))
    net.load_state_dict(blob["state_dict"])
    assert net(torch.zeros(5, 28 * 28)).shape == (5, NUM_CLASSES)

    assert admin.get("/v1/audit/verify").json()["ok"] is True
    actions = [e["action"] for e in admin.get(f"/v1/datasets/{dataset_id}/audit").json()["entries"]]
    assert "training.reserved" in actions and "training.succeeded" in actions

    # A model file an operator lost: a named error, not an anonymous 500 mid-answer.
    (server.settings.trainings_dir / "models" / f"{sha}.pt").unlink()
    gone = client.get(f"/v1/trainings/{training['id']}/model")
    assert gone.status_code == 500 and gone.json()["error"] == "file_missing", gone.text
    assert f"models/{sha}.pt" in gone.json()["message"]


@needs_cuda
def test_a_gpu_worker_trains_and_releases_a_model_a_cpu_loads(server: Server, granted: Any) -> None:
    """``LABELDP_TRAINING_DEVICE=cuda``: the worker trains on the GPU and the
    released weights are CPU tensors (a features party without a GPU loads them
    with plain ``torch.load``)."""
    _admin, client, dataset_id, ids, labels = granted
    r = submit(client, dataset_id, images(ids, labels), epsilon=4, delta=1e-5,
               expected_batch_size=100, projection_backend="dense", **FAST)  # fmt: skip
    assert r.status_code == 201, r.text
    settings = server.settings.model_copy(update={"training_device": "cuda"})
    db = connect(settings.resolved_database_url)
    try:
        assert Worker(db, settings, worker_id="gpu-worker").run(once=True) >= 1
    finally:
        db.dispose()
    done = client.get(f"/v1/trainings/{r.json()['id']}").json()
    assert done["status"] == "succeeded", done["error"]
    assert done["metrics"]["device"] == "cuda"
    blob = torch.load(io.BytesIO(client.get(f"/v1/trainings/{done['id']}/model").content))
    assert {t.device.type for t in blob["state_dict"].values()} == {"cpu"}
    net = build_model(model_config_from_dict(blob["model"]))
    net.load_state_dict(blob["state_dict"])
    assert net(torch.zeros(2, 28 * 28)).shape == (2, NUM_CLASSES)


def test_mlp_training_default_delta_is_one_over_n(server: Server, granted: Any) -> None:
    admin, client, dataset_id, ids, labels = granted
    r = submit(client, dataset_id, tabular(ids[:150], labels[:150]), epsilon=2,
               architecture="mlp", hidden=[8], denoiser="noop", expected_batch_size=50,
               epochs=1)  # fmt: skip
    assert r.status_code == 201, r.text
    assert r.json()["num_examples"] == 150 and r.json()["delta"] == pytest.approx(1 / 150)
    # noop projects nothing, so no projection setting is filled in for it.
    spec = r.json()["spec"]
    assert spec["smoothing"] is None and spec["projection_steps"] is None
    # The noise plan is computed and shown when the training is accepted ...
    plan = r.json()["spec"]["plan"]
    assert plan["sampling_rate"] == pytest.approx(50 / 150) and plan["steps"] == 3
    assert plan["noise_multiplier"] > 0
    run_worker(server)
    done = client.get(f"/v1/trainings/{r.json()['id']}").json()
    assert done["status"] == "succeeded", done["error"]
    assert done["accounting"]["epsilon"] <= 2
    # ... and it is exactly what the worker trained with.
    for key in ("noise_multiplier", "sampling_rate", "steps", "amplification"):
        assert done["accounting"][key] == plan[key], key
    assert admin.get("/v1/audit/verify").json()["ok"] is True


def test_budget_exceeded_spends_nothing(server: Server, granted: Any) -> None:
    admin, client, dataset_id, ids, labels = granted
    before = admin.get(f"/v1/datasets/{dataset_id}/budget").json()
    features = tabular(ids, labels)
    short_of = {
        "ε = 11 but only ε = 10 remains": {"epsilon": 11},
        "δ = 0.05 but only δ = 0.01 remains": {"epsilon": 1, "delta": 0.05},
    }
    for says, spec in short_of.items():
        r = submit(client, dataset_id, features, architecture="mlp", **spec)
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "budget_exceeded"
        # The message names what is short, and only that.
        assert says in r.json()["message"] and r.json()["message"].count("remains") == 1
        detail = r.json()["detail"]
        assert detail["requested_epsilon"] == spec["epsilon"] and detail["remaining_epsilon"] == 10
        assert detail["remaining_delta"] == pytest.approx(0.01)
    # An ε beyond the budget is refused before the features are read (seconds of
    # CPU, for free, per request): even an unreadable file gets the 409.
    r = submit(client, dataset_id, b"not a parquet file", architecture="mlp", epsilon=11)
    assert r.status_code == 409 and r.json()["error"] == "budget_exceeded", r.text
    # Its default δ (1/n) was never computed: the refusal says so, not "δ = 0".
    assert r.json()["detail"]["requested_delta"] is None
    # A δ the spec gives is checked as early.
    r = submit(client, dataset_id, b"not a parquet file", architecture="mlp", epsilon=1,
               delta=0.05)  # fmt: skip
    assert r.status_code == 409 and r.json()["detail"]["requested_delta"] == 0.05, r.text
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json() == before
    assert client.get(f"/v1/datasets/{dataset_id}/trainings").json() == []
    entries = admin.get(f"/v1/datasets/{dataset_id}/audit").json()["entries"]
    refused = [e["payload"] for e in entries if e["action"] == "training.refused"]
    assert len(refused) == 4 and not any(e["action"] == "training.reserved" for e in entries)
    assert [p["requested_delta"] for p in refused][-2:] == [None, 0.05]
    assert admin.get("/v1/audit/verify").json()["ok"] is True


def test_features_that_decode_past_the_limit_are_refused_unread(make_server: Any) -> None:
    """9 MB of zstd decoded to 2.4 GB in the API (then 422, free): a Parquet file may
    decode to at most LABELDP_TRAINING_MAX_FEATURES_BYTES, and one whose metadata
    says more is refused before any of it is decoded."""
    server = make_server(LABELDP_TRAINING_MAX_FEATURES_BYTES=str(1 << 20)).start()
    admin = server.client()
    dataset_id, ids, labels = make_dataset(admin)
    zeros = {f"z{j}": [0.0] * len(ids) for j in range(1000)}  # 1.6 MB decoded
    r = submit(admin, dataset_id, tabular(ids, labels, **zeros), epsilon=1, **CHEAP)
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large", r.text
    assert r.json()["detail"]["limit"] == 1 << 20 and "1000×" not in r.json()["message"]
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json()["epsilon_spent"] == 0
    assert submit(admin, dataset_id, tabular(ids, labels), epsilon=1, **CHEAP).status_code == 201


def test_a_dataset_without_a_delta_budget_says_so(server: Server) -> None:
    admin = server.client()
    dataset_id, ids, labels = make_dataset(admin, delta_budget=0)
    client_id, token = create_client(admin)
    assert admin.post(f"/v1/datasets/{dataset_id}/grants", json={"client_id": client_id}).is_success
    r = submit(server.client(token), dataset_id, tabular(ids, labels), architecture="mlp",
               epsilon=1)  # fmt: skip
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "δ = 0.005 but only δ = 0 remains" in message and "ε = 1" not in message
    assert "no δ budget" in message


def test_idempotent_replay_spends_once(server: Server, granted: Any) -> None:
    admin, client, dataset_id, ids, labels = granted
    features = tabular(ids, labels)
    spec = {"epsilon": 1, **CHEAP, "idempotency_key": "k-1"}
    first = submit(client, dataset_id, features, **spec)
    again = submit(client, dataset_id, features, **spec)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json()["epsilon_spent"] == 1
    other = submit(client, dataset_id, features, **{**spec, "epsilon": 2})
    assert other.status_code == 409 and other.json()["error"] == "idempotency_conflict"
    by_header = client.post(
        f"/v1/datasets/{dataset_id}/trainings",
        files={"file": ("features.parquet", features)},
        data={"spec": json.dumps({"epsilon": 1, **CHEAP})},
        headers={"Idempotency-Key": "k-1"},
    )
    assert by_header.status_code == 200 and by_header.json()["id"] == first.json()["id"]
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json()["epsilon_spent"] == 1


def test_a_client_sees_only_its_own_trainings(server: Server, granted: Any) -> None:
    admin, client, dataset_id, ids, labels = granted
    r = submit(client, dataset_id, tabular(ids, labels), epsilon=1, **CHEAP)
    training_id = r.json()["id"]
    other_id, other_token = create_client(admin, name="other")
    admin.post(f"/v1/datasets/{dataset_id}/grants", json={"client_id": other_id})
    other = server.client(other_token)
    for method, path in (
        ("GET", f"/v1/trainings/{training_id}"),
        ("GET", f"/v1/trainings/{training_id}/model"),
        ("DELETE", f"/v1/trainings/{training_id}"),
    ):
        assert other.request(method, path).status_code == 404
    assert other.get(f"/v1/datasets/{dataset_id}/trainings").json() == []
    _id, auditor_token = create_client(admin, role="auditor", name="aud")
    assert server.client(auditor_token).get(f"/v1/trainings/{training_id}").status_code == 403
    assert admin.get(f"/v1/trainings/{training_id}").status_code == 200


def test_cancel_keeps_the_budget_spent(server: Server, granted: Any) -> None:
    admin, client, dataset_id, ids, labels = granted
    r = submit(client, dataset_id, tabular(ids, labels), epsilon=1, **CHEAP)
    training_id = r.json()["id"]
    cancelled = client.delete(f"/v1/trainings/{training_id}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert client.delete(f"/v1/trainings/{training_id}").status_code == 409
    run_worker(server)
    assert client.get(f"/v1/trainings/{training_id}").json()["status"] == "cancelled"
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json()["epsilon_spent"] == 1
    assert admin.get("/v1/audit/verify").json()["ok"] is True


def test_a_failed_training_is_not_refunded(
    server: Server, granted: Any, caplog: pytest.LogCaptureFixture
) -> None:
    admin, client, dataset_id, ids, labels = granted
    # Features no other test uploads: the stored file is named by its hash.
    r = submit(client, dataset_id, tabular(ids[:123], labels[:123]), epsilon=1, **CHEAP)
    training = r.json()
    # The stored features vanish before a worker runs it (a lost disk, say).
    settings = server.settings
    (settings.trainings_dir / "features" / f"{training['features_sha256']}.parquet").unlink()
    with caplog.at_level(logging.INFO, logger="label_party"):
        run_worker(server)
    failed = client.get(f"/v1/trainings/{training['id']}").json()
    assert failed["status"] == "failed" and "FileNotFoundError" in failed["error"]
    assert str(settings.data_dir) not in failed["error"]  # no paths, no data
    # The worker's log names the type and the place, never the text (it may quote data).
    [logged] = [r for r in caplog.records if r.getMessage() == "training failed"]
    assert logged.fields["exception"] == "FileNotFoundError"  # type: ignore[attr-defined]
    assert training["features_sha256"] not in caplog.text
    assert client.get(f"/v1/trainings/{training['id']}/model").status_code == 409
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json()["epsilon_spent"] == 1
    actions = [e["action"] for e in admin.get(f"/v1/datasets/{dataset_id}/audit").json()["entries"]]
    assert "training.failed" in actions
    assert admin.get("/v1/audit/verify").json()["ok"] is True


def test_refusals_before_any_spend(server: Server, granted: Any, tmp_path: Path) -> None:
    admin, client, dataset_id, ids, labels = granted
    cases: list[tuple[bytes, dict[str, Any], str]] = [
        (tabular(ids, labels, city=["a"] * len(ids)), {"architecture": "mlp"}, "numeric"),
        (tabular(ids, labels), {"architecture": "cnn"}, "784"),
        (tabular(ids, labels), {"architecture": "mlp", "expected_batch_size": 999}, "exceed"),
        (tabular(["zz"], labels[:1]), {"architecture": "mlp"}, "no feature row"),
        (tabular(ids, labels), {"architecture": "mlp", "bogus": 1}, "invalid training spec"),
        (tabular(ids, labels), {"architecture": "mlp", "alt_batch_size": 201}, "alt_batch_size"),
        (tabular(ids, labels), {"architecture": "mlp", "learning_rate": math.nan}, "finite"),
        # 2·10¹⁰ parameters: refused before the charge, not failed after it.
        (
            tabular(ids, labels),
            {"architecture": "mlp", "hidden": [10**5] * 3},
            "LABELDP_TRAINING_MAX_PARAMETERS",
        ),
        # A width too large to count (torch's meta build overflowed: a 500).
        (tabular(ids, labels), {"architecture": "mlp", "hidden": [10**30]}, "hidden"),
        # Steps and noise that overflow float32: accepted, charged, then failed.
        (tabular(ids, labels), {"architecture": "mlp", "learning_rate": 1e308}, "learning_rate"),
        (tabular(ids, labels), {"architecture": "mlp", "clip_norm": 1e308}, "clip_norm"),
        # The worker joins the labels as "label": a feature of that name broke it.
        (tabular(ids, labels, label=[1.0] * len(ids)), {"architecture": "mlp"}, "label"),
        # Finite in float64, infinite once stored as float32 (then trained as 0).
        (tabular(ids, labels, z=[1e300] * len(ids)), {"architecture": "mlp"}, "finite numbers"),
        # 2·10⁶ steps (10⁴ epochs of 200): past LABELDP_TRAINING_MAX_STEPS, paid, never done.
        (
            tabular(ids, labels),
            {
                "architecture": "mlp",
                "epochs": 10_000,
                "expected_batch_size": 1,
                "denoiser": "noop",
            },  # a projection would be past the compute bound first
            "LABELDP_TRAINING_MAX_STEPS",
        ),
    ]
    for features, spec, message in cases:
        r = submit(client, dataset_id, features, epsilon=1, **spec)
        assert r.status_code == 422, r.text
        assert message in r.json()["message"] + json.dumps(r.json()["detail"]), r.text
    regression, _ids, _labels = make_dataset(admin, task="regression", n=10)
    r = submit(admin, regression, tabular(ids, labels), epsilon=1, architecture="mlp")
    assert r.status_code == 422 and "classification" in r.json()["message"]
    # Without a δ budget it was refused as budget_exceeded, and audited so (helper-70).
    no_delta, _ids, _labels = make_dataset(admin, task="regression", n=10, delta_budget=0)
    r = submit(admin, no_delta, tabular(ids, labels), epsilon=1, architecture="mlp")
    assert r.status_code == 422 and "classification" in r.json()["message"], r.text
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json()["epsilon_spent"] == 0


def test_a_request_cannot_choose_the_seed(server: Server, granted: Any) -> None:
    """DESIGN §3.5: the noise and the sampling draw from the OS; no spec field sets them."""
    admin, client, dataset_id, ids, labels = granted
    for field in ("seed", "generator_seed"):
        r = submit(client, dataset_id, tabular(ids, labels), epsilon=1, architecture="mlp",
                   **{field: 7})  # fmt: skip
        assert r.status_code == 422, r.text
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json()["epsilon_spent"] == 0


def _audit_entries(admin: httpx.Client, dataset_id: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = admin.get(f"/v1/datasets/{dataset_id}/audit").json()["entries"]
    return entries


def _files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.exists() else set()


def test_an_infeasible_spec_is_refused_before_any_spend(server: Server, granted: Any) -> None:
    """Issue 7: what the worker could not calibrate is refused by the POST (422),
    before the ledger, the audit log or the data directory change."""
    admin, client, dataset_id, ids, labels = granted
    features_dir = server.settings.trainings_dir / "features"
    budget, audit = (
        admin.get(f"/v1/datasets/{dataset_id}/budget").json(),
        _audit_entries(admin, dataset_id),
    )
    stored = _files(features_dir)
    cases: list[tuple[bytes, dict[str, Any], str]] = [
        # σ above B·√T = 200: the noise would drown any gradient.
        (tabular(ids, labels), {"epsilon": 0.001}, "outweighs any gradient"),
        (tabular(ids, labels), {"epsilon": 1e-6, "delta": 1e-10}, "outweighs any gradient"),
        # One covered example: the default δ = 1/n is 1.
        (tabular(ids[:1], labels[:1]), {"epsilon": 1}, "delta must be below 1"),
    ]
    for features, spec, message in cases:
        r = submit(client, dataset_id, features, **{**CHEAP, **spec})
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["error"] == "invalid_request"
        assert body["message"].startswith("infeasible training spec") and message in body["message"]
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json() == budget
    assert _audit_entries(admin, dataset_id) == audit
    assert client.get(f"/v1/datasets/{dataset_id}/trainings").json() == []
    assert _files(features_dir) == stored  # no features file written
    assert admin.get("/v1/audit/verify").json()["ok"] is True


def test_a_spec_value_of_the_wrong_json_type_is_refused_not_coerced(
    server: Server, granted: Any
) -> None:
    """Lax parsing trained on ``"epochs": true`` as 1 epoch, ``"smoothing": false``
    as λ = 0 (uniform labels) and ``"hidden": ["16", true]`` as [16, 1], and
    charged for it."""
    admin, client, dataset_id, ids, labels = granted
    budget = admin.get(f"/v1/datasets/{dataset_id}/budget").json()
    for wrong in ({"epochs": True}, {"smoothing": False}, {"hidden": ["16", True]},
                  {"expected_batch_size": "10"}, {"epochs": 3.0}):  # fmt: skip
        r = submit(client, dataset_id, tabular(ids, labels), **{**CHEAP, "epsilon": 1, **wrong})
        assert r.status_code == 422, (wrong, r.text)
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json() == budget
    assert client.get(f"/v1/datasets/{dataset_id}/trainings").json() == []
    # Integers are numbers, and a decimal string is an exact ε, as before.
    r = submit(client, dataset_id, tabular(ids, labels),
               **{**CHEAP, "epsilon": "0.5", "delta": 1e-5, "learning_rate": 1})  # fmt: skip
    assert r.status_code == 201, r.text


def test_a_field_the_denoiser_or_model_does_not_read_is_refused_not_echoed(
    server: Server, granted: Any
) -> None:
    """``"denoiser": "noop", "smoothing": 0.5`` was accepted, charged and echoed as
    if λ = 0.5 had shaped the model; what is not read is refused before any
    spend, and null in the resolved spec."""
    admin, client, dataset_id, ids, labels = granted
    budget = admin.get(f"/v1/datasets/{dataset_id}/budget").json()
    for denoiser, unread in (
        ("noop", {"smoothing": 0.5}),
        ("noop", {"alt_batch_size": 8, "projection_steps": 3}),
        ("self-span", {"projection_method": "fista"}),
        ("self-conv", {"alt_batch_size": 8}),
        ("alt-conv", {"image_shape": [1, 28, 28]}),  # an mlp's
    ):
        spec = {**CHEAP, "epsilon": 1, "denoiser": denoiser, **unread}
        r = submit(client, dataset_id, tabular(ids, labels), **spec)
        assert r.status_code == 422, (denoiser, r.text)
        assert all(key in r.text for key in unread) and "leave" in r.text
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json() == budget
    noop = {**CHEAP, "epsilon": 1, "delta": 1e-4, "denoiser": "noop"}
    r = submit(client, dataset_id, tabular(ids, labels), **noop)
    assert r.status_code == 201, r.text
    resolved = r.json()["spec"]
    assert resolved["hidden"] == CHEAP["hidden"] and resolved["learning_rate"] > 0
    for key in ("alt_batch_size", "projection_steps", "projection_method",
                "projection_backend", "smoothing", "image_shape"):  # fmt: skip
        assert resolved[key] is None, key
    # The resolved spec's fields, sent back for another training, are the same
    # spec: its nulls are what is not read (what the labels party adds, the
    # noise plan and the class count, is not a spec field).
    again = {k: v for k, v in resolved.items() if k in TrainingSpec.model_fields}
    r = submit(client, dataset_id, tabular(ids, labels), **again)
    assert r.status_code == 201, r.text
    assert {k: r.json()["spec"][k] for k in again} == again
    # ... and a retry with its key is the same request, with those nulls or without.
    keyed = submit(client, dataset_id, tabular(ids, labels), **noop, idempotency_key="t")
    retry = {**noop, "idempotency_key": "t", "alt_batch_size": None, "smoothing": None}
    replay = submit(client, dataset_id, tabular(ids, labels), **retry)
    assert replay.status_code == 200 and replay.json()["id"] == keyed.json()["id"], replay.text
    r = submit(client, dataset_id, tabular(ids, labels), **{**noop, "denoiser": "alt-conv"})
    resolved = r.json()["spec"]
    assert resolved["alt_batch_size"] == 64 and resolved["smoothing"] == 0.75, resolved
    assert resolved["image_shape"] is None


def test_the_worker_releases_only_the_accepted_plan(server: Server, granted: Any) -> None:
    """The trainer runs the stored plan's σ only if its ε is within the spec's: a plan
    with too little noise (here half the calibrated σ) fails the training, no model."""
    admin, client, dataset_id, ids, labels = granted
    r = submit(client, dataset_id, tabular(ids[:97], labels[:97]), epsilon=1, delta=1e-5, **CHEAP)
    training_id = r.json()["id"]
    settings = server.settings
    db = connect(settings.resolved_database_url)
    try:
        with transaction(db.writer) as session:
            row = session.get(Training, training_id)
            assert row is not None
            plan = row.spec["plan"]
            row.spec = {
                **row.spec,
                "plan": {**plan, "noise_multiplier": plan["noise_multiplier"] / 2},
            }
    finally:
        db.dispose()
    run_worker(server)
    failed = client.get(f"/v1/trainings/{training_id}").json()
    assert failed["status"] == "failed" and "above the configured" in failed["error"]
    assert failed["sha256"] is None
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json()["epsilon_spent"] == 1


def test_labels_are_frozen_once_a_training_is_accepted(server: Server) -> None:
    """A training's charge is only meaningful for the labels it trains on: once one
    is accepted (cancelled ones too) a labels upload is refused with 409, audited."""
    admin = server.client()
    dataset_id, ids, labels = make_dataset(admin)
    r = submit(admin, dataset_id, tabular(ids, labels), epsilon=1, **CHEAP)
    assert r.status_code == 201, r.text
    assert admin.delete(f"/v1/trainings/{r.json()['id']}").is_success
    refused = upload_labels(admin, dataset_id, ids[:150], labels[:150].tolist())
    assert refused.status_code == 409 and refused.json()["error"] == "labels_frozen"
    actions = [e["action"] for e in _audit_entries(admin, dataset_id)]
    assert actions[-1] == "labels.refused"
    assert admin.get(f"/v1/datasets/{dataset_id}").json()["num_labels"] == len(ids)


def test_a_training_whose_examples_changed_fails_before_it_runs(server: Server) -> None:
    """Defence in depth behind the freeze: the worker trains only when the features
    still cover the n examples the plan was calibrated for (here the stored n is
    altered, as labels replaced by an older version would have done)."""
    admin = server.client()
    dataset_id, ids, labels = make_dataset(admin)
    r = submit(admin, dataset_id, tabular(ids, labels), epsilon=1, **CHEAP)
    assert r.status_code == 201, r.text
    db = connect(server.settings.resolved_database_url)
    try:
        with transaction(db.writer) as session:
            row = session.get(Training, r.json()["id"])
            assert row is not None
            row.num_examples = len(ids) - 50
    finally:
        db.dispose()
    run_worker(server)
    failed = admin.get(f"/v1/trainings/{r.json()['id']}").json()
    assert failed["status"] == "failed" and "labels were replaced" in failed["error"]


def test_startup_sweep_sets_aside_unreferenced_training_files(
    server: Server, granted: Any, make_server: Any
) -> None:
    """Real files in a fresh data directory on the session's database: what no
    training row names and is older than the grace period goes to orphans/
    (partial writes are deleted); referenced or recent files stay."""
    _admin, client, dataset_id, ids, labels = granted
    r = submit(client, dataset_id, tabular(ids[:88], labels[:88]), epsilon=1, delta=1e-5, **CHEAP)
    assert r.status_code == 201, r.text
    run_worker(server)
    done = client.get(f"/v1/trainings/{r.json()['id']}").json()
    assert done["status"] == "succeeded", done["error"]
    queued = submit(client, dataset_id, tabular(ids[:88], labels[:88]), epsilon=1,
                    delta=1e-5, idempotency_key="queued", **CHEAP).json()  # fmt: skip

    source = server.settings.trainings_dir
    fresh = make_server()
    root = fresh.settings.trainings_dir
    features, models, tmp = root / "features", root / "models", root / "tmp"
    for directory in (features, models, tmp):
        directory.mkdir(parents=True)
    kept_features = f"{done['features_sha256']}.parquet"
    kept_model = f"{done['sha256']}.pt"
    shutil.copy(source / "features" / kept_features, features / kept_features)
    shutil.copy(source / "models" / kept_model, models / kept_model)
    orphan_features, young_features = f"{'a' * 64}.parquet", f"{'b' * 64}.parquet"
    orphan_model = f"{'c' * 64}.pt"
    for path in (features / orphan_features, features / young_features, models / orphan_model):
        path.write_bytes(b"left by a crash before commit")
    checkpoints = root / "checkpoints"
    checkpoints.mkdir()
    finished, waiting = f"{done['id']}.pt", f"{queued['id']}.pt"
    for name in (finished, waiting):
        (checkpoints / name).write_bytes(b"a checkpoint")
    (tmp / ".old.pt").write_bytes(b"partial")
    (tmp / ".young.parquet").write_bytes(b"being written")
    old = time.time() - TRAININGS_GRACE_SECONDS - 60
    for path in (
        features / kept_features,
        models / kept_model,
        features / orphan_features,
        models / orphan_model,
        tmp / ".old.pt",
        checkpoints / finished,
        checkpoints / waiting,
    ):
        os.utime(path, (old, old))

    fresh.start()  # the start-up sweep runs before the server answers

    assert _files(features) == {kept_features, young_features}
    assert _files(models) == {kept_model}
    assert _files(tmp) == {".young.parquet"}
    orphans = root.parent / "orphans" / "trainings"
    assert _files(orphans / "features") == {orphan_features}
    assert _files(orphans / "models") == {orphan_model}
    # A checkpoint stays while its training may resume (queued), not after it ended.
    assert _files(checkpoints) == {waiting}
    assert _files(orphans / "checkpoints") == {finished}
    # Leave no queued training behind for the next test's worker.
    assert client.delete(f"/v1/trainings/{queued['id']}").is_success
    # The kept files still serve: the fresh server downloads the model.
    model = fresh.client().get(f"/v1/trainings/{done['id']}/model")
    assert model.status_code == 200 and model.headers["X-Content-SHA256"] == done["sha256"]


def _checkpoint_at_end_of_epoch_0(spec: dict[str, Any], mark: float) -> Any:
    """A checkpoint after epoch 0 of ``spec`` whose history carries ``mark`` seconds."""
    from label_party.labeldp_pro.dpsgd import Checkpoint, EpochSummary, _make_optimizer
    from label_party.trainings import training

    model = training.build(spec, 4, NUM_CLASSES)
    optimizer = _make_optimizer(model, training.config_for(spec, NUM_CLASSES, "cpu"))
    steps = int(spec["plan"]["steps_per_epoch"])
    summary = EpochSummary(epoch=0, steps=steps, seconds=mark,
                           noisy_gradient_norm=1.0, denoised_gradient_norm=1.0)  # fmt: skip
    return Checkpoint(step=steps, model=model.state_dict(), optimizer=optimizer.state_dict(),
                      history=[summary])  # fmt: skip


def test_an_interrupted_training_goes_on_from_its_checkpoint(server: Server, granted: Any) -> None:
    """The worker resumes from ``trainings/checkpoints/<id>.pt`` when it was saved under
    the training's plan (its epoch-0 history carries over into the model's metrics),
    ignores one saved under another plan, and deletes the file when the training ends."""
    from label_party.storage import training_checkpoint_path
    from label_party.trainings.training import write_checkpoint

    _admin, client, dataset_id, ids, labels = granted
    settings = server.settings
    spec = {**CHEAP, "epochs": 4, "expected_batch_size": 50}
    ours = submit(client, dataset_id, tabular(ids, labels), epsilon=1, delta=1e-5, **spec).json()
    other = submit(client, dataset_id, tabular(ids, labels), epsilon=2, delta=1e-5,
                   idempotency_key="other", **spec).json()  # fmt: skip
    for training, plan, mark in (
        (ours, ours["spec"]["plan"], 12345.0),
        (other, {**other["spec"]["plan"], "noise_multiplier": 1.0}, 54321.0),
    ):
        path = training_checkpoint_path(settings, training["id"])
        write_checkpoint(path, _checkpoint_at_end_of_epoch_0(training["spec"], mark), plan)
    assert run_worker(server) >= 2  # ours, other (and anything earlier tests queued)
    resumed = client.get(f"/v1/trainings/{ours['id']}").json()
    assert resumed["status"] == "succeeded", resumed
    history = resumed["metrics"]["history"]
    assert [h["epoch"] for h in history] == [0, 1, 2, 3] and history[0]["seconds"] == 12345.0
    fresh = client.get(f"/v1/trainings/{other['id']}").json()
    assert fresh["status"] == "succeeded", fresh
    assert fresh["metrics"]["history"][0]["seconds"] != 54321.0  # foreign plan: from step 0
    assert not (settings.trainings_dir / "checkpoints").exists() or not any(
        (settings.trainings_dir / "checkpoints").iterdir()
    )


def test_labels_replaced_while_the_plan_is_computed_spend_nothing(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The noise plan is computed before the dataset is locked; a labels upload that
    commits meanwhile (here a real one, through the API, while the accountant runs)
    makes the accept a 409 under the lock, with no ledger entry and no training."""
    from label_party.auth import ADMIN_ID, Principal
    from label_party.exceptions import ConflictError
    from label_party.trainings import service

    admin = server.client()
    dataset_id, ids, labels = make_dataset(admin)
    real_plan = service._plan

    def plan_while_labels_change(resolved: dict[str, Any], n: int, steps: int) -> dict[str, Any]:
        plan = real_plan(resolved, n, steps)
        assert upload_labels(admin, dataset_id, ids, labels[::-1].tolist()).status_code == 200
        return plan

    monkeypatch.setattr(service, "_plan", plan_while_labels_change)
    db = connect(server.settings.resolved_database_url)
    spec = service.parse_spec(json.dumps({"epsilon": 1, **CHEAP}))
    try:
        with pytest.raises(ConflictError, match="labels changed"), transaction(db.writer) as s:
            service.create(s, server.settings, Principal(ADMIN_ID, "admin"), dataset_id,
                           spec, io.BytesIO(tabular(ids, labels)), "parquet",
                           unlocked=db.reader)  # fmt: skip
    finally:
        db.dispose()
    assert admin.get(f"/v1/datasets/{dataset_id}/trainings").json() == []
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json()["epsilon_spent"] == 0


def _wait_until_running(client: httpx.Client, training_id: str) -> None:
    deadline = time.monotonic() + 60
    while client.get(f"/v1/trainings/{training_id}").json()["status"] != "running":
        assert time.monotonic() < deadline, "the worker never started the training"
        time.sleep(0.1)


def test_a_shut_down_or_cancelled_training_stops_within_a_long_projection(
    server: Server, granted: Any
) -> None:
    """Shutdown and cancel were honoured only between DP-SGD steps, and a step of
    100,000 projection steps takes minutes: SIGTERM's grace ran out and the worker
    was killed (three kills fail a paid training). Both now stop inside the step."""
    _admin, client, dataset_id, ids, labels = granted
    spec = {"architecture": "mlp", "hidden": [8], "epochs": 1, "alt_batch_size": 64,
            "projection_steps": 100_000}  # one DP-SGD step (B = n) of minutes  # fmt: skip
    training = submit(client, dataset_id, tabular(ids, labels), epsilon=1, **spec).json()
    db = connect(server.settings.resolved_database_url)
    try:
        for stop in ("shutdown", "cancel"):
            worker = Worker(db, server.settings, worker_id=f"worker-{stop}")
            thread = threading.Thread(target=worker.run, kwargs={"once": True})
            thread.start()
            _wait_until_running(client, training["id"])
            time.sleep(1)  # well into the projection
            stopped = time.monotonic()
            if stop == "shutdown":
                worker.shutdown.set()
            else:
                assert client.delete(f"/v1/trainings/{training['id']}").status_code == 200
            thread.join(timeout=60)
            assert not thread.is_alive()
            # The heartbeat finds a cancel within LABELDP_WORKER_HEARTBEAT_SECONDS (5).
            assert time.monotonic() - stopped < 15
            status = client.get(f"/v1/trainings/{training['id']}").json()["status"]
            assert status == ("queued" if stop == "shutdown" else "cancelled")
    finally:
        db.dispose()


def test_a_cancelled_training_s_checkpoint_goes_when_its_worker_stops(
    server: Server, granted: Any
) -> None:
    """A worker that finds its training no longer its own deletes the checkpoint when
    the training was cancelled, and keeps it when another worker took it over."""
    from label_party.storage import training_checkpoint_path

    _admin, client, dataset_id, ids, labels = granted
    settings = server.settings
    cancelled = submit(client, dataset_id, tabular(ids, labels), epsilon=1, **CHEAP).json()
    taken_over = submit(client, dataset_id, tabular(ids, labels), epsilon=1,
                        idempotency_key="queued", **CHEAP).json()  # fmt: skip
    assert client.delete(f"/v1/trainings/{cancelled['id']}").status_code == 200
    paths = {t["id"]: training_checkpoint_path(settings, t["id"]) for t in (cancelled, taken_over)}
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"checkpoint")
    db = connect(settings.resolved_database_url)
    try:
        worker = Worker(db, settings, worker_id="test-worker")
        for training_id in paths:
            worker._after_interrupt(training_id, lost=True)
    finally:
        db.dispose()
    assert not paths[cancelled["id"]].exists() and paths[taken_over["id"]].exists()
    paths[taken_over["id"]].unlink()


def test_cancelling_a_training_handed_back_to_the_queue_deletes_its_checkpoint(
    server: Server, granted: Any
) -> None:
    """A training a stopped worker handed back keeps its checkpoint to resume from;
    cancelled then, no worker would ever touch it again: it stayed on disk."""
    from label_party.storage import training_checkpoint_path

    _admin, client, dataset_id, ids, labels = granted
    queued = submit(client, dataset_id, tabular(ids, labels), epsilon=1,
                    idempotency_key="handed-back", **CHEAP).json()  # fmt: skip
    checkpoint = training_checkpoint_path(server.settings, queued["id"])
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_bytes(b"checkpoint")
    assert client.delete(f"/v1/trainings/{queued['id']}").status_code == 200
    assert not checkpoint.exists()


def test_a_worker_that_lost_its_training_leaves_the_new_owner_s_checkpoint(
    server: Server, granted: Any
) -> None:
    """The worker whose lease lapsed finds on finishing that the training is another
    worker's: it must neither record its result nor delete the checkpoint that the
    new owner resumes from. Checkpoints written side by side never share a file."""
    from label_party.labeldp_pro.dpsgd import Checkpoint
    from label_party.storage import training_checkpoint_path
    from label_party.trainings.training import read_checkpoint, write_checkpoint

    _admin, client, dataset_id, ids, labels = granted
    settings = server.settings
    queued = submit(client, dataset_id, tabular(ids, labels), epsilon=1, **CHEAP).json()
    path = training_checkpoint_path(settings, queued["id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    plan = {"steps": 8}
    state = Checkpoint(step=3, model={"w": torch.ones(2)}, optimizer={}, history=[])
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda _: write_checkpoint(path, state, plan), range(16)))
    assert read_checkpoint(path, plan) is not None
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".partial")] == []
    models, orphans = (root / "trainings" / "models" for root in
                       (settings.data_dir, settings.data_dir / "orphans"))  # fmt: skip
    kept, set_aside = set(models.glob("*.pt")), set(orphans.glob("*.pt"))
    db = connect(settings.resolved_database_url)
    try:
        worker = Worker(db, settings, worker_id="lapsed-worker")
        assert worker._finish_failed(queued["id"], "boom") is False
        assert worker._record_success(queued["id"], {"format": "x"}, {}, {}, None) is False
    finally:
        db.dispose()
    # The model it published is set aside now, not left until the next server start.
    assert set(models.glob("*.pt")) == kept and len(set(orphans.glob("*.pt")) - set_aside) == 1
    assert path.exists()  # the checkpoint is the owner's to use and drop
    assert client.get(f"/v1/trainings/{queued['id']}").json()["status"] == "queued"
    path.unlink()


def test_feature_files_that_would_train_on_guesses_are_refused(
    server: Server, granted: Any
) -> None:
    admin, client, dataset_id, ids, labels = granted
    spec = json.dumps({"epsilon": 1, "architecture": "mlp"})
    repeated = "example_id,x0,x0\n" + "".join(f"{i},1,2\n" for i in ids)
    files = {"file": ("features.csv", repeated.encode())}
    r = client.post(f"/v1/datasets/{dataset_id}/trainings", files=files, data={"spec": spec})
    assert r.status_code == 422 and r.json()["detail"] == {"repeated_columns": ["x0"]}
    half = len(ids) // 2
    holes = [math.nan] * half + [1.0] * (len(ids) - half - 1) + [math.inf]
    r = submit(client, dataset_id, tabular(ids, labels, z=holes), epsilon=1, architecture="mlp")
    assert r.status_code == 422
    assert r.json()["detail"] == {"non_finite": [{"column": "z", "rows": half + 1, "first_row": 1}]}
    r = submit(client, dataset_id, tabular(ids, labels, z=[None] * len(ids)), epsilon=1,
               architecture="mlp")  # fmt: skip
    assert r.status_code == 422 and r.json()["detail"] == {"empty_columns": ["z"]}
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json()["epsilon_spent"] == 0


def test_the_spec_may_come_as_a_file_part(server: Server, granted: Any) -> None:
    """``curl -F spec=@spec.json`` sends the spec as a file; it is read like the field."""
    _admin, client, dataset_id, ids, labels = granted
    url = f"/v1/datasets/{dataset_id}/trainings"
    features = ("features.parquet", tabular(ids, labels))
    bad = client.post(
        url, files={"file": features, "spec": ("spec.json", b'{"epsilon": 1, "x": 2}')}
    )
    assert bad.status_code == 422 and bad.json()["message"] == "invalid training spec"
    # A form field: the JSON body's duplicate-key check does not read it, this does.
    twice = client.post(
        url, files={"file": features}, data={"spec": '{"epsilon": 1, "epsilon": 2}'}
    )
    assert twice.status_code == 422, twice.text
    assert twice.json()["message"] == "the spec names the key 'epsilon' twice in one object"
    spec = json.dumps({"epsilon": 1, **CHEAP, "idempotency_key": "as-a-file"}).encode()
    r = client.post(url, files={"file": features, "spec": ("spec.json", spec)})
    assert r.status_code == 201, r.text


def test_a_projection_the_worker_could_not_hold_is_refused(server: Server) -> None:
    """A projecting denoiser computes per-class gradients K × d at a time: with
    1,000 classes a 516k-parameter MLP (within the parameter limit) needs about
    6 GiB, past LABELDP_TRAINING_MAX_PROJECTION_BYTES (4 GiB), refused before
    anything is spent; the noop denoiser projects nothing."""
    admin = server.client()
    r = admin.post("/v1/datasets", json={"name": "wide", "task": "classification",
                                         "label_domain": {"num_classes": 1000},
                                         "epsilon_budget": 10, "delta_budget": 0.1})  # fmt: skip
    dataset_id = r.json()["id"]
    ids = [f"e{i}" for i in range(50)]
    labels = np.arange(50) % 1000
    assert upload_labels(admin, dataset_id, ids, labels.tolist()).status_code == 200
    spec = {"epsilon": 1, "architecture": "mlp", "hidden": [512], "alt_batch_size": 8}
    r = submit(admin, dataset_id, tabular(ids, labels), **spec)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail["projection_bytes"] > 12 * 1000 * 515_560 and detail["limit"] == 4 << 30
    assert detail["projection_examples"] == 8
    spec["hidden"] = [128, 64]  # the default MLP: about 1 GiB, well within
    assert submit(admin, dataset_id, tabular(ids, labels), **spec).status_code == 201
    noop = {"epsilon": 1, "architecture": "mlp", "hidden": [512], "denoiser": "noop"}
    r = submit(admin, dataset_id, tabular(ids, labels), **noop)
    assert r.status_code == 201, r.text
    r = admin.post(f"/v1/datasets/{dataset_id}/trainings", data={"spec": json.dumps(spec)},
                   files={"file": ("features.xlsx", b"PK\x03\x04")})  # fmt: skip
    assert r.status_code == 422 and r.json()["error"] == "invalid_request"


def test_a_projection_over_too_many_examples_or_steps_is_refused(make_server: Any) -> None:
    """The projection's memory grows with the examples it spans (alt_batch_size, or
    the batch for self-*) and its compute with them times projection_steps: n₂ = n
    took 0.25 GB per 1,000 examples and 100,000 steps hours a step, accepted and
    paid for. Both are refused before anything is spent."""
    server = make_server(LABELDP_TRAINING_MAX_PROJECTION_BYTES=str(300 << 20),
                         LABELDP_TRAINING_MAX_EXAMPLE_GRADIENTS=str(10**7)).start()  # fmt: skip
    admin = server.client()
    dataset_id, ids, labels = make_dataset(admin)
    features = images(ids, labels)
    r = submit(admin, dataset_id, features, epsilon=1, alt_batch_size=len(ids))
    assert r.status_code == 422 and "alt_batch_size" in r.json()["message"], r.text
    assert r.json()["detail"]["projection_examples"] == len(ids)
    r = submit(admin, dataset_id, features, epsilon=1, denoiser="self-conv")
    assert r.status_code == 422 and "the batch" in r.json()["message"], r.text
    r = submit(admin, dataset_id, features, epsilon=1, projection_steps=100_000)
    assert r.status_code == 422 and "projection_steps" in r.json()["message"], r.text
    assert r.json()["detail"]["limit"] == 10**7
    assert admin.get(f"/v1/datasets/{dataset_id}/budget").json()["epsilon_spent"] == 0
    r = submit(admin, dataset_id, features, epsilon=1, **FAST)
    assert r.status_code == 201, r.text


def _gauge(server: Server, name: str) -> float:
    text = server.client().get("/metrics").text
    [line] = [x for x in text.splitlines() if x.startswith(name + " ")]
    return float(line.split()[-1])


def test_a_training_whose_worker_died_reads_stalled_until_one_takes_it(
    server: Server, granted: Any
) -> None:
    """A dead worker's training still reads ``running`` (its lease is the only
    sign); the API says ``stalled`` and ``/metrics`` counts it, so an operator can
    tell it from a live one, until a worker claims and finishes it."""
    _admin, client, dataset_id, ids, labels = granted
    settings = server.settings
    training = submit(client, dataset_id, tabular(ids, labels), epsilon=1, delta=1e-5,
                      **CHEAP).json()  # fmt: skip
    stalled_before = _gauge(server, "labeldp_trainings_stalled")
    db = connect(settings.resolved_database_url)
    try:
        with transaction(db.writer) as session:  # its worker died a minute ago
            row = session.get(Training, training["id"])
            assert row is not None
            row.status, row.worker_id, row.attempts = "running", "dead", 1
            row.lease_expires_at = datetime.now(UTC) - timedelta(minutes=1)
    finally:
        db.dispose()
    dead = client.get(f"/v1/trainings/{training['id']}").json()
    assert dead["status"] == "running" and dead["stalled"] is True
    assert dead["lease_expires_at"] is not None
    assert _gauge(server, "labeldp_trainings_stalled") == stalled_before + 1
    assert run_worker(server) >= 1
    done = client.get(f"/v1/trainings/{training['id']}").json()
    assert done["status"] == "succeeded" and done["attempts"] == 2
    assert done["stalled"] is False and done["lease_expires_at"] is None
    assert _gauge(server, "labeldp_trainings_stalled") == stalled_before


def test_a_training_whose_workers_kept_dying_fails_in_the_audit_log(
    server: Server, granted: Any
) -> None:
    """After MAX_ATTEMPTS lost leases the training fails: auditors see
    ``training.failed`` (as for every end of a paid training) and its checkpoint goes."""
    from label_party.storage import training_checkpoint_path
    from label_party.trainings.worker import MAX_ATTEMPTS

    _admin, client, dataset_id, ids, labels = granted
    settings = server.settings
    training = submit(client, dataset_id, tabular(ids, labels), epsilon=1, delta=1e-5,
                      idempotency_key="doomed", **CHEAP).json()  # fmt: skip
    checkpoint = training_checkpoint_path(settings, training["id"])
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_bytes(b"left by a dead worker")
    db = connect(settings.resolved_database_url)
    try:
        with transaction(db.writer) as session:  # its last worker died, lease run out
            row = session.get(Training, training["id"])
            assert row is not None
            row.status, row.worker_id, row.attempts = "running", "dead", MAX_ATTEMPTS
            row.lease_expires_at = datetime.now(UTC) - timedelta(minutes=1)
        assert Worker(db, settings, worker_id="survivor").claim() != training["id"]
    finally:
        db.dispose()
    failed = client.get(f"/v1/trainings/{training['id']}").json()
    assert failed["status"] == "failed" and "stopped responding" in failed["error"]
    entries = server.client().get(f"/v1/datasets/{dataset_id}/audit").json()["entries"]
    ends = [e for e in entries if e["payload"].get("training_id") == training["id"]]
    assert [e["action"] for e in ends][-1] == "training.failed"
    assert not checkpoint.exists()
    assert server.client().get("/v1/audit/verify").json()["ok"] is True


def test_a_training_storage_refused_is_left_to_retry_not_failed(
    server: Server, granted: Any
) -> None:
    """A paid training whose checkpoint the disk refuses (here a real EFBIG: the
    worker process runs under ``ulimit -f``) is not failed: its worker leaves it to
    its lease, and the next worker that claims it trains it to a released model,
    spending nothing more. On SQLite the limit would refuse the database's own
    writes, so this runs on Postgres."""
    if not server.env["LABELDP_DATABASE_URL"].startswith("postgresql"):
        pytest.skip("ulimit -f would refuse the SQLite database's writes too")
    _admin, client, dataset_id, ids, labels = granted
    training = submit(client, dataset_id, tabular(ids, labels), epsilon=1, delta=1e-5,
                      idempotency_key="full-disk", **CHEAP).json()  # fmt: skip
    command = ["labeldp", "label-party", "worker", "--once", "--id", "full-disk"]
    worker = run_under_limit(command, server.env, 2 << 10, cwd=Path(__file__).resolve().parents[2])
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert "left to retry" in worker.stderr and "EFBIG" in worker.stderr, worker.stderr[-3000:]
    left = client.get(f"/v1/trainings/{training['id']}").json()
    assert left["status"] == "running", left  # not failed: paid for, and the disk's fault
    db = connect(server.settings.resolved_database_url)
    try:
        with transaction(db.writer) as session:  # the limit's worker is gone; leases lapse
            for row in session.scalars(select(Training).where(Training.worker_id == "full-disk")):
                if row.id == training["id"]:  # a file-size limit, unlike a full disk, counts
                    assert row.attempts == 1
                row.lease_expires_at = datetime.now(UTC) - timedelta(seconds=1)
    finally:
        db.dispose()
    assert run_worker(server) >= 1
    done = client.get(f"/v1/trainings/{training['id']}").json()
    assert done["status"] == "succeeded", done
    budget = client.get(f"/v1/datasets/{dataset_id}/budget").json()
    entries = server.client().get(f"/v1/datasets/{dataset_id}/audit").json()["entries"]
    ours = [e["action"] for e in entries if e["payload"].get("training_id") == training["id"]]
    assert ours == ["training.reserved", "training.succeeded"]
    assert float(budget["delta_spent"]) == pytest.approx(1e-5)


def test_a_full_disk_gives_a_paid_training_its_attempt_back(server: Server, granted: Any) -> None:
    """A model the full disk refuses (a real ENOSPC: a full tmpfs where the worker
    writes it) leaves the training running with its attempt given back, however
    long the disk stays full; with room again it trains to its model."""
    from label_party.storage import training_tmp_dir

    _admin, client, dataset_id, ids, labels = granted
    settings = server.settings
    training = submit(client, dataset_id, tabular(ids, labels), epsilon=1, delta=1e-5,
                      idempotency_key="disk-full", **CHEAP).json()  # fmt: skip
    with full_disk(training_tmp_dir(settings)) as full:
        fill(full)
        run_worker(server)
        db = connect(settings.resolved_database_url)
        try:
            with transaction(db.writer) as session:
                row = session.get(Training, training["id"])
                assert row is not None and (row.status, row.attempts) == ("running", 0)
                row.lease_expires_at = datetime.now(UTC) - timedelta(seconds=1)
        finally:
            db.dispose()
    assert run_worker(server) >= 1
    assert client.get(f"/v1/trainings/{training['id']}").json()["status"] == "succeeded"


def test_a_checkpoint_saved_with_batch_sizes_still_resumes(tmp_path: Path) -> None:
    """Epoch summaries no longer carry ``mean_batch_size`` (the sampled batches are
    the subsampling's secret); a checkpoint saved before that still reads."""
    from label_party.trainings.training import _CHECKPOINT_FORMAT, read_checkpoint
    from shared.torch_files import save_torch_file

    plan = {"steps": 8}
    old = {"epoch": 0, "steps": 4, "seconds": 1.0, "mean_batch_size": 50.0,
           "noisy_gradient_norm": 1.0, "denoised_gradient_norm": 0.5, "loss": None}  # fmt: skip
    path = tmp_path / "c.pt"
    model = {"w": torch.ones(2)}
    save_torch_file(path, {"format": _CHECKPOINT_FORMAT, "plan": plan, "step": 4,
                           "model": model, "optimizer": {}, "history": [old]})  # fmt: skip
    checkpoint = read_checkpoint(path, plan)
    assert checkpoint is not None and checkpoint.step == 4
    assert checkpoint.history[0].denoised_gradient_norm == 0.5
    assert not hasattr(checkpoint.history[0], "mean_batch_size")
