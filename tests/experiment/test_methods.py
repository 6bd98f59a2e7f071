"""``labeldp experiment`` through the real services, one small configuration per
regression method, all in ONE set of services started once for the session
(``conftest.endpoints``) and passed by URL and token, as a user would."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from labeldp.datasets import Dataset, load
from labeldp.experiment import REGRESSION, main, methods_for, subsample
from labeldp.harness import Endpoints, non_private_baseline

pytestmark = pytest.mark.slow

SMALL = ["--dataset", "rand-hie-spend", "--epochs", "2", "--max-examples", "4000", "--json"]
EPSILON = 1.0


def _run(
    argv: list[str], endpoints: Endpoints | None, capsys: pytest.CaptureFixture[str]
) -> dict[str, Any]:
    services = [] if endpoints is None else [
        "--labels-party", endpoints.labels_url, "--labels-token", endpoints.labels_admin_token,
        "--features-party", endpoints.features_url, "--features-token", endpoints.features_token,
    ]  # fmt: skip
    code = main([*argv, *services])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result: dict[str, Any] = json.loads(captured.out)  # --json: only the object on stdout
    assert set(result) >= {"dataset", "method", "epsilon", "seeds", "mechanism_mse", "test",
                           "epsilon_spent", "seconds"}  # fmt: skip
    assert set(result["test"]) == {"mse", "mse_std"}
    assert math.isfinite(result["test"]["mse"]) and result["test"]["mse"] > 0
    assert math.isfinite(result["test"]["mse_std"]) and result["test"]["mse_std"] >= 0
    assert result["seconds"] > 0
    return result


PRIVATE = [m for m in methods_for(REGRESSION) if m != "non-private"]


def test_every_regression_method_is_covered() -> None:
    assert PRIVATE == ["laplace", "laplace-clipped", "staircase", "staircase-clipped",
                       "exponential", "rr-on-bins", "unbiased"]  # fmt: skip


@pytest.mark.parametrize("method", PRIVATE)
def test_private_method(
    method: str, endpoints: Endpoints, capsys: pytest.CaptureFixture[str]
) -> None:
    seeds = 2 if method == "laplace-clipped" else 1
    extra = ["--mesh", "60"] if method == "unbiased" else []
    argv = [*SMALL, "--method", method, "--epsilon", str(EPSILON), "--seeds", str(seeds), *extra]
    result = _run(argv, endpoints, capsys)
    assert result["dataset"] == "rand-hie-spend" and result["method"] == method
    assert result["epsilon"] == EPSILON and result["seeds"] == seeds
    assert result["mechanism_mse"] > 0 and math.isfinite(result["mechanism_mse"])
    assert result["epsilon_spent"] == pytest.approx(EPSILON * seeds)
    assert len(result["per_seed"]) == seeds
    assert len({r["dataset_id"] for r in result["per_seed"]}) == seeds  # a dataset per seed


def test_non_private_equals_the_baseline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = _run([*SMALL, "--method", "non-private"], None, capsys)
    assert result["epsilon"] == "inf" and result["mechanism_mse"] == 0
    assert result["epsilon_spent"] == 0
    at_infinity = _run([*SMALL, "--method", "laplace", "--epsilon", "inf"], None, capsys)
    assert at_infinity["test"] == result["test"] and at_infinity["epsilon_spent"] == 0

    data = subsample(load("rand-hie-spend"), 4000)
    train_rows, test_rows = data.split(seed=0)
    training = {"task": "regression", "loss": "squared", "epochs": 2, "batch_size": 512,
                "learning_rate": 3e-3, "seed": 0}  # fmt: skip
    baseline = non_private_baseline(data, train_rows, test_rows, training, tmp_path)
    assert result["test"]["mse"] == pytest.approx(baseline)


def _revocations(endpoints: Endpoints) -> int:
    """``client.revoked`` entries in the labels party's whole audit chain."""
    count, after = 0, 0
    headers = {"Authorization": f"Bearer {endpoints.labels_admin_token}"}
    while after is not None:
        page = httpx.get(f"{endpoints.labels_url}/v1/audit", headers=headers,
                         params={"after": after, "limit": 1000}).json()  # fmt: skip
        count += sum(e["action"] == "client.revoked" for e in page["entries"])
        after = page["next_after"]
    return count


def _own_files(data: Dataset, directory: Path, domain: dict[str, Any]) -> list[str]:
    """``data`` written as the user's two files → the experiment's options for them."""
    pq.write_table(data.labels_table(), directory / "labels.parquet")
    pq.write_table(data.features_table(), directory / "features.parquet")
    return ["--labels", str(directory / "labels.parquet"),
            "--features", str(directory / "features.parquet"), "--task", "regression",
            "--domain", json.dumps(domain)]  # fmt: skip


def test_own_files(
    endpoints: Endpoints, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = subsample(load("rand-hie-spend"), 2000)
    argv = [*_own_files(data, tmp_path, data.label_domain),
            "--categorical", ",".join(data.categorical),
            "--method", "rr-on-bins", "--epsilon", "2", "--epochs", "2", "--json"]  # fmt: skip
    revoked_before = _revocations(endpoints)
    result = _run(argv, endpoints, capsys)
    # Each seed's client token is revoked when the seed ends: none stays valid.
    assert _revocations(endpoints) - revoked_before == result["seeds"]
    assert result["dataset"] == "labels" and result["examples"] == len(data)
    assert result["epsilon_spent"] == pytest.approx(2.0)
    assert 0 < result["mechanism_mse"] < np.var(data.labels) * 10


def test_refused_labels_show_their_rows_and_leave_no_features(
    endpoints: Endpoints, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = subsample(load("rand-hie-spend"), 200)
    top = float(np.max(data.labels))
    domain = {"min": 0.0, "max": top / 2, "clip": False}  # labels above top/2 are refused
    argv = [*_own_files(data, tmp_path, domain), "--method", "laplace", "--epsilon", "1",
            "--labels-party", endpoints.labels_url, "--labels-token", endpoints.labels_admin_token,
            "--features-party", endpoints.features_url,
            "--features-token", endpoints.features_token]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "invalid_labels" in err
    assert re.search(r'\{"row": \d+, "reason": "label is outside the declared domain"\}', err)
    assert "feature rows" not in err  # the labels were refused before any feature upload
