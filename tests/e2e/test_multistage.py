"""LP-MST end to end: the real labels party, the real features party and a worker
as processes, on SQLite and on Postgres.

The advertiser holds the labels of a 3-class problem; the publisher holds the
features and drives the multi-stage run (``POST /v1/multistage`` and
``labeldp feature-party multistage start``). What must hold:

* every stage's release touches its own part only, so each part is charged ε
  once — the whole run spends ε per example, not T·ε — and the budget endpoint
  shows it per part;
* a further release on a part a stage used is refused (409) with nothing spent;
* stage t ≥ 2 uses per-example priors from the previous stage's model
  (``rr-with-prior`` with ``prior_source: example``) and trains from its weights;
* the final model predicts at the features party.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from feature_party.client import BudgetExceededError, LabelsPartyClient
from feature_party.config import Settings
from feature_party.db import Database
from feature_party.jobs.worker import Worker
from feature_party.multistage.driver import assign_parts
from tests.e2e.conftest import Services, ok, parquet_bytes

pytestmark = pytest.mark.slow

N, K = 900, 3
TRAINING = {"task": "classification", "loss": "cross-entropy", "epochs": 4,
            "batch_size": 128, "learning_rate": 0.01, "hidden": [32], "seed": 0}  # fmt: skip


def _problem() -> tuple[pa.Table, pa.Table]:
    """Features and labels of a linearly separable 3-class problem."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(N, 4))
    labels = np.argmax(x @ rng.normal(size=(4, K)), axis=1)
    ids = [f"ex-{i:04d}" for i in range(N)]
    features = pa.table({"example_id": ids, **{f"x{j}": x[:, j] for j in range(4)}})
    return features, pa.table({"example_id": ids, "label": labels})


def _setup(services: Services, *, budget: float) -> tuple[str, str, str]:
    """(dataset id, client token, feature set id)."""
    features, labels = _problem()
    with LabelsPartyClient(services.labels_url, services.labels_admin) as admin:
        dataset = admin.create_dataset(
            name="lpmst", task="classification", label_domain={"num_classes": K},
            epsilon_budget=budget,
        )  # fmt: skip
        admin.upload_labels(dataset["id"], parquet_bytes(labels))
        client = admin.create_client(name="publisher", role="client")
        admin.create_grant(dataset["id"], client_id=client["id"])
    roles = '{"numeric": ["x0", "x1", "x2", "x3"], "categorical": []}'
    feature_set = ok(
        services.features.post(
            "/v1/feature-sets",
            files={"file": ("features.parquet", parquet_bytes(features))},
            data={"schema": roles, "name": "lpmst"},
        ),
        201,
    )
    return dataset["id"], client["token"], feature_set["id"]


def _parts_spent(services: Services, dataset_id: str) -> dict[str, Decimal]:
    with LabelsPartyClient(services.labels_url, services.labels_admin) as admin:
        budget = admin.get_budget(dataset_id)
    return {p["name"]: Decimal(str(p["epsilon_spent"])) for p in budget["parts"]}


def _ended(services: Services, run_id: str, timeout: float = 240) -> dict[str, Any]:
    """The run once it is no longer running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = ok(services.features.get(f"/v1/multistage/{run_id}"), 200)
        if run["status"] != "running":
            return run
        time.sleep(0.3)
    raise AssertionError(f"the run did not finish; logs in {services.logs}")


def _wait(services: Services, run_id: str) -> dict[str, Any]:
    run = _ended(services, run_id)
    assert run["status"] == "succeeded", f"{run['status']}: {run['error']}; logs in {services.logs}"
    return run


def test_three_stages_charge_each_part_once(services: Services) -> None:
    dataset_id, token, feature_set_id = _setup(services, budget=1.0)
    body = {"feature_set_id": feature_set_id, "labels_party_url": services.labels_url,
            "token": token, "dataset_id": dataset_id, "epsilon": 1.0, "stages": 3, "seed": 11,
            "temperature": 2.0, "training": TRAINING}  # fmt: skip
    started = ok(services.features.post("/v1/multistage", json=body), 202)
    assert "token" not in started["config"]
    run = _wait(services, started["id"])

    stages = run["stages"]
    assert [s["part"] for s in stages] == ["lpmst-1", "lpmst-2", "lpmst-3"]
    assert sum(s["num_examples"] for s in stages) == N
    assert stages[0]["prior_set_id"] is None and all(s["prior_set_id"] for s in stages[1:])
    assert len({s["release_id"] for s in stages}) == 3
    # Each stage trains on everything received so far, minus the filtered labels.
    for t, stage in enumerate(stages, start=1):
        received = sum(s["num_examples"] for s in stages[:t])
        assert stage["num_training_labels"] + stage["num_filtered"] == received
    assert run["model_id"] == stages[-1]["model_id"]

    # The ledger: every part spent exactly ε once; nothing outside the parts.
    assert _parts_spent(services, dataset_id) == {f"lpmst-{t}": Decimal(1) for t in (1, 2, 3)}
    with LabelsPartyClient(services.labels_url, token) as publisher:
        release = publisher.get_release(stages[1]["release_id"])
        assert release.mechanism.name == "rr-with-prior"
        assert release.parts == ["lpmst-2"]
        with pytest.raises(BudgetExceededError):  # a fourth stage on a used part
            publisher.create_release(dataset_id, {"mechanism": {"name": "rr"}, "epsilon": 0.5,
                                                  "parts": ["lpmst-1"]})  # fmt: skip
    assert _parts_spent(services, dataset_id)["lpmst-1"] == Decimal(1)

    # The final model predicts at the features party.
    features, _ = _problem()
    rows = features.slice(0, 5).to_pylist()
    predicted = ok(
        services.features.post(f"/v1/models/{run['model_id']}/predict", json={"rows": rows}), 200
    )
    assert all(0 <= p < K for p in predicted["prediction"])

    # A finished run does not resume.
    refused = services.features.post(f"/v1/multistage/{run['id']}/resume", json={"token": token})
    assert refused.status_code == 409 and refused.json()["error"] == "run_not_resumable"


def test_two_stage_run_from_the_cli(services: Services) -> None:
    dataset_id, token, feature_set_id = _setup(services, budget=1.0)
    env = {**os.environ, "LABELDP_ADMIN_TOKEN": services.features_token,
           "LABELDP_LABELS_PARTY_TOKEN": token}  # fmt: skip
    command = [sys.executable, "-m", "labeldp", "feature-party", "multistage", "start",
               "--url", services.features_url, "--feature-set", feature_set_id,
               "--labels-party-url", services.labels_url, "--dataset", dataset_id,
               "--epsilon", "1", "--seed", "5",
               "--training", '{"epochs": 3, "batch_size": 128, "learning_rate": 0.01}']  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\nlogs in {services.logs}"
    assert "stage 2/2 lpmst-2" in done.stdout
    model = re.search(r"succeeded: model (\w+)", done.stdout)
    assert model is not None, done.stdout
    # Two stages at 40/60, each part charged ε = 1 once.
    assert _parts_spent(services, dataset_id) == {"lpmst-1": Decimal(1), "lpmst-2": Decimal(1)}
    run_id = re.search(r"run (\w+)", done.stdout)
    assert run_id is not None
    run = ok(services.features.get(f"/v1/multistage/{run_id.group(1)}"), 200)
    assert [s["num_examples"] for s in run["stages"]] == [round(0.4 * N), N - round(0.4 * N)]


def test_cli_without_token_says_what_to_set(services: Services) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LABELDP_LABELS_PARTY_TOKEN"}
    env["LABELDP_ADMIN_TOKEN"] = services.features_token
    command = [sys.executable, "-m", "labeldp", "feature-party", "multistage", "start",
               "--url", services.features_url, "--feature-set", "x", "--labels-party-url",
               services.labels_url, "--dataset", "d", "--epsilon", "1"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "LABELDP_LABELS_PARTY_TOKEN" in done.stderr


def test_what_would_waste_epsilon_is_refused_before_any_spend(services: Services) -> None:
    dataset_id, token, feature_set_id = _setup(services, budget=1.0)
    body = {"feature_set_id": feature_set_id, "labels_party_url": services.labels_url,
            "token": token, "dataset_id": dataset_id, "epsilon": 1.0, "seed": 11,
            "training": TRAINING}  # fmt: skip
    # A stage without examples would fail only after stage 1 had spent.
    empty = services.features.post("/v1/multistage", json={**body, "fractions": [0.9995, 0.0005]})
    assert empty.status_code == 422 and empty.json()["detail"]["stage_sizes"] == [N, 0]
    # K-ary RR's correction does not fit the RRTop-k labels of stages ≥ 2.
    debiased = {**TRAINING, "loss": "rr-debiased-cross-entropy"}
    assert (
        services.features.post("/v1/multistage", json={**body, "training": debiased}).status_code
        == 422
    )
    # A model the features cannot feed, or a stage-1 part its validation split
    # empties: before, stage 1's release was paid, then its job refused.
    cnn = services.features.post(
        "/v1/multistage", json={**body, "training": {**TRAINING, "architecture": "cnn"}}
    )
    assert cnn.status_code == 422 and "cnn" in cnn.json()["message"]
    tiny_first = {**body, "fractions": [0.001, 0.999],
                  "training": {**TRAINING, "validation_fraction": 0.9}}  # fmt: skip
    validation = services.features.post("/v1/multistage", json=tiny_first)
    assert validation.status_code == 422 and "validation_fraction" in validation.json()["message"]

    # Another run's plan with the same part sizes but other examples in each part:
    # adopting it would release stage 1 on examples this run did not choose.
    features, _ = _problem()
    ids, parts = assign_parts(features.column("example_id").to_pylist(), [0.4, 0.6],
                              seed=99, prefix="lpmst")  # fmt: skip
    with LabelsPartyClient(services.labels_url, services.labels_admin) as admin:
        admin.register_partition_plan(
            dataset_id, parquet_bytes(pa.table({"example_id": ids, "part": parts}))
        )
    started = ok(services.features.post("/v1/multistage", json=body), 202)
    run = _ended(services, started["id"], timeout=60)
    assert run["status"] == "failed" and "another partition plan" in run["error"]
    assert set(_parts_spent(services, dataset_id).values()) == {Decimal(0)}

    # The command line shows what the service says is wrong, not only that it is.
    env = {**os.environ, "LABELDP_ADMIN_TOKEN": services.features_token,
           "LABELDP_LABELS_PARTY_TOKEN": token}  # fmt: skip
    command = [sys.executable, "-m", "labeldp", "feature-party", "multistage", "start",
               "--url", services.features_url, "--feature-set", feature_set_id,
               "--labels-party-url", services.labels_url, "--dataset", dataset_id,
               "--epsilon", "1", "--training", '{"epochz": 3}']  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "epochz" in done.stderr, done.stderr


def _fail_the_gpu_job(services: Services, timeout: float = 60) -> None:
    """What a worker that offers a GPU it cannot use does with the stage's job: the
    services' CPU-only worker leaves a job asking for CUDA queued; this one claims
    it, and resolving its device fails it ("asks for CUDA but this worker has no GPU")."""
    settings = Settings(data_dir=services.features_data, database_url=services.features_db)
    database = Database(services.features_db)
    worker = Worker(database, settings, worker_id="says-it-has-a-gpu", gpus=1)
    try:
        deadline = time.monotonic() + timeout
        while (job_id := worker.claim()) is None:
            assert time.monotonic() < deadline, f"no job asked for a GPU; logs in {services.logs}"
            time.sleep(0.2)
        worker.run_item(job_id)
    finally:
        database.dispose()


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the failing job needs a machine without CUDA"
)
def test_resume_trains_a_failed_stage_again_without_paying_twice(services: Services) -> None:
    dataset_id, token, feature_set_id = _setup(services, budget=1.0)
    # device cuda on a machine without one: the stage-1 job fails (_fail_the_gpu_job).
    body = {"feature_set_id": feature_set_id, "labels_party_url": services.labels_url,
            "token": token, "dataset_id": dataset_id, "epsilon": 1.0, "seed": 3,
            "training": {**TRAINING, "device": "cuda"}}  # fmt: skip
    run_id = ok(services.features.post("/v1/multistage", json=body), 202)["id"]
    failed_jobs = []
    for attempt in (1, 2):
        if attempt == 2:
            resumed = services.features.post(
                f"/v1/multistage/{run_id}/resume", json={"token": token}
            )
            assert resumed.status_code == 202, resumed.text
        _fail_the_gpu_job(services)
        run = _ended(services, run_id, timeout=120)
        assert run["status"] == "failed", run["error"]
        assert "resume to train it again" in run["error"], run["error"]
        stage = run["stages"][0]
        assert stage["job_id"] is None and len(stage["failed_jobs"]) == attempt
        failed_jobs = stage["failed_jobs"]
    assert len(set(failed_jobs)) == 2  # a new job, not a wait on the dead one
    assert _parts_spent(services, dataset_id)["lpmst-1"] == Decimal(1)  # the release replayed
    # The stored training cannot succeed here: the resume corrects it.
    fixed = {"token": token, "training": {**TRAINING, "device": "cpu"}}
    ok(services.features.post(f"/v1/multistage/{run_id}/resume", json=fixed), 202)
    run = _wait(services, run_id)
    assert run["config"]["training"]["device"] == "cpu"
    assert _parts_spent(services, dataset_id) == {"lpmst-1": Decimal(1), "lpmst-2": Decimal(1)}


def test_a_cancelled_run_stops_its_job_and_spends_no_further(services: Services) -> None:
    dataset_id, token, feature_set_id = _setup(services, budget=1.0)
    # Epochs enough that stage 1 is still training when it is cancelled.
    body = {"feature_set_id": feature_set_id, "labels_party_url": services.labels_url,
            "token": token, "dataset_id": dataset_id, "epsilon": 1.0, "seed": 3,
            "training": {**TRAINING, "epochs": 5000, "batch_size": 8}}  # fmt: skip
    run_id = ok(services.features.post("/v1/multistage", json=body), 202)["id"]
    deadline = time.monotonic() + 120
    while (stage := _stage_one(services, run_id)).get("job_status") != "running":
        assert time.monotonic() < deadline, f"stage 1 never trained; logs in {services.logs}"
        time.sleep(0.2)
    env = {**os.environ, "LABELDP_ADMIN_TOKEN": services.features_token}
    cancel = subprocess.run(
        [sys.executable, "-m", "labeldp", "feature-party", "multistage", "cancel", run_id,
         "--url", services.features_url],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cancel.returncode == 0, cancel.stderr
    run = json.loads(cancel.stdout)
    assert (run["status"], run["error"]) == ("cancelled", "cancelled by request")
    job = ok(services.features.get(f"/v1/jobs/{stage['job_id']}"), 200)
    assert job["status"] == "cancelled"
    time.sleep(2)  # the driver's next poll: it finds the run cancelled and writes nothing
    after = ok(services.features.get(f"/v1/multistage/{run_id}"), 200)
    assert (after["status"], after["updated_at"]) == ("cancelled", run["updated_at"])
    assert _parts_spent(services, dataset_id) == {"lpmst-1": Decimal(1), "lpmst-2": Decimal(0)}
    again = services.features.delete(f"/v1/multistage/{run_id}")
    assert again.status_code == 409 and again.json()["error"] == "run_finished"
    resumed = services.features.post(f"/v1/multistage/{run_id}/resume", json={"token": token})
    assert resumed.status_code == 409 and resumed.json()["error"] == "run_not_resumable"


def _stage_one(services: Services, run_id: str) -> dict[str, Any]:
    stages = ok(services.features.get(f"/v1/multistage/{run_id}"), 200)["stages"]
    return dict(stages[0]) if stages else {}


@pytest.mark.postgres
@pytest.mark.parametrize("database_urls", ["postgres"], indirect=True)
def test_seven_stages_on_postgres(services: Services) -> None:
    """Stage 6's training labels joined six release ids into one 200-character
    column: Postgres refused the row, after the release was paid, on every resume."""
    dataset_id, token, feature_set_id = _setup(services, budget=1.0)
    body = {"feature_set_id": feature_set_id, "labels_party_url": services.labels_url,
            "token": token, "dataset_id": dataset_id, "epsilon": 1.0, "stages": 7, "seed": 3,
            "training": {**TRAINING, "epochs": 1}}  # fmt: skip
    run = _wait(services, ok(services.features.post("/v1/multistage", json=body), 202)["id"])
    releases = [s["release_id"] for s in run["stages"]]
    assert len(set(releases)) == 7
    for t, stage in enumerate(run["stages"][1:], start=2):  # stage 1 trains on its release
        derived = ok(services.features.get(f"/v1/received-labels/{stage['training_labels_id']}"),
                     200)  # fmt: skip
        assert derived["release_id"] == releases[t - 1]
        assert derived["manifest"]["releases"] == releases[:t]
    # The derived labels say what they are: a regression job on them is refused.
    last = run["stages"][-1]["training_labels_id"]
    job = {"feature_set_id": feature_set_id, "labels_id": last, "task": "regression",
           "loss": "squared"}  # fmt: skip
    refused = services.features.post("/v1/jobs", json=job)
    assert refused.status_code == 422 and refused.json()["error"] == "task_mismatch"


def test_a_run_that_lost_its_registration_s_answer_gets_its_plan_back(
    services: Services, tmp_path: Any
) -> None:
    """A driver that crashed after the labels party registered its plan, before it
    saved the plan's id, registers the same seeded partition again on resume: the
    labels party answers with that plan. Another assignment with equal part sizes
    fails the run instead of being adopted."""
    from feature_party.multistage.driver import RunFailedError, _register_plan

    dataset_id, token, _feature_set_id = _setup(services, budget=1.0)
    features, _ = _problem()
    ids = features.column("example_id").to_pylist()
    path = tmp_path / "parts.parquet"
    with LabelsPartyClient(services.labels_url, token) as client:

        def register(seed: int) -> dict[str, Any]:
            chosen, parts = assign_parts(ids, [0.4, 0.6], seed=seed, prefix="lpmst")
            path.write_bytes(parquet_bytes(pa.table({"example_id": chosen, "part": parts})))
            return _register_plan(client, dataset_id, path)

        first = register(5)
        assert register(5)["id"] == first["id"]  # the resumed run's own plan
        with pytest.raises(RunFailedError, match="another partition plan"):
            register(6)  # equal sizes, other examples in each part
        assert client.get_partition_plan(dataset_id)["id"] == first["id"]
