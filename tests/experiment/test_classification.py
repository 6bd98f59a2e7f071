"""``labeldp experiment`` on Fashion-MNIST through the real services: one tiny
configuration (600 images, 1 epoch of the small CNN) per classification method,
its ``--json`` shape (accuracy, not MSE), and the refusals of methods that do not
fit the task or have not been wired yet."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from labeldp.datasets import load
from labeldp.experiment import CLASSIFICATION, feature_clusters, main, methods_for, subsample
from labeldp.harness import Endpoints

pytestmark = pytest.mark.slow

TINY = ["--dataset", "fashion-mnist", "--max-examples", "600", "--epochs", "1", "--json"]
EPSILON = 2.0


def _run(argv: list[str], endpoints: Endpoints, capsys: pytest.CaptureFixture[str]) -> Any:
    services = [
        "--labels-party", endpoints.labels_url, "--labels-token", endpoints.labels_admin_token,
        "--features-party", endpoints.features_url, "--features-token", endpoints.features_token,
    ]  # fmt: skip
    code = main([*argv, *services])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_the_classification_methods() -> None:
    assert methods_for(CLASSIFICATION) == ["non-private", "rr", "rr-debiased",
                                           "rr-with-prior-groups", "lp-2st", "dp-sgd",
                                           "labeldp-pro"]  # fmt: skip


@pytest.mark.parametrize("method", ["rr", "rr-debiased", "rr-with-prior-groups"])
def test_private_method(
    method: str, endpoints: Endpoints, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _run([*TINY, "--method", method, "--epsilon", str(EPSILON)], endpoints, capsys)
    assert set(result) >= {"dataset", "method", "epsilon", "seeds", "mechanism_mse", "test",
                           "epsilon_spent", "seconds"}  # fmt: skip
    assert result["dataset"] == "fashion-mnist" and result["method"] == method
    assert result["task"] == "classification" and result["mechanism_metric"] == "accuracy"
    assert set(result["test"]) == {"accuracy", "accuracy_std"}
    assert 0 <= result["test"]["accuracy"] <= 1 and result["test"]["accuracy_std"] == 0
    # K-ary RR at ε = 2 keeps a label with probability e²/(e² + 9) ≈ 0.45; the
    # group priors (clusters of the pixels) can only raise that.
    kept = math.exp(EPSILON) / (math.exp(EPSILON) + 9)
    noisy = result["mechanism_mse"]
    if method == "rr-with-prior-groups":
        assert noisy > kept
    else:
        assert abs(noisy - kept) < 0.1
    assert result["epsilon_spent"] == pytest.approx(EPSILON)
    assert result["examples"] == 600 and result["seconds"] > 0


def test_lp_2st(endpoints: Endpoints, capsys: pytest.CaptureFixture[str]) -> None:
    result = _run([*TINY, "--method", "lp-2st", "--epsilon", str(EPSILON)], endpoints, capsys)
    assert result["method"] == "lp-2st" and set(result["test"]) == {"accuracy", "accuracy_std"}
    assert result["mechanism_mse"] is None  # two releases: no single noisy-label accuracy
    # Two stages on disjoint parts: the dataset is charged ε once per example.
    assert result["epsilon_spent"] == pytest.approx(EPSILON)


@pytest.mark.parametrize("method", ["dp-sgd", "labeldp-pro"])
def test_central_method(
    method: str, endpoints: Endpoints, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model is the release: trained by the labels party's worker at (ε, δ)."""
    result = _run([*TINY, "--method", method, "--epsilon", str(EPSILON)], endpoints, capsys)
    assert result["method"] == method and 0 <= result["test"]["accuracy"] <= 1
    assert result["mechanism_mse"] is None  # no labels are released
    assert result["epsilon_spent"] == pytest.approx(EPSILON)


def test_non_private_learns(endpoints: Endpoints, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--dataset", "fashion-mnist", "--max-examples", "1000", "--epochs", "3", "--json",
            "--method", "non-private"]  # fmt: skip
    result = _run(argv, endpoints, capsys)
    assert result["epsilon"] == "inf" and result["mechanism_mse"] == 1.0
    assert result["test"]["accuracy"] > 0.3  # chance is 0.1
    assert result["epsilon_spent"] == 0


def test_clusters_use_features_only() -> None:
    data = subsample(load("fashion-mnist"), 500)
    groups = feature_clusters(data, 8)
    assert groups.shape == (500,) and set(np.unique(groups)) <= set(range(8))
    assert len(np.unique(groups)) >= 4
    shuffled = data.__class__(**{**data.__dict__, "labels": np.zeros_like(data.labels)})
    assert (feature_clusters(shuffled, 8) == groups).all()  # labels play no part


@pytest.mark.parametrize(
    ("method", "needle"),
    [
        ("laplace", "does not fit classification dataset 'fashion-mnist'; choose one of: "
                    "non-private, rr,"),
    ],
)  # fmt: skip
def test_refused(method: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--dataset", "fashion-mnist", "--method", method, "--epsilon", "1"])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_regression_refuses_a_classification_method(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--dataset", "rand-hie-spend", "--method", "rr", "--epsilon", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "laplace, laplace-clipped" in err


def test_the_mnist_subset_runs_end_to_end(
    endpoints: Endpoints, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--dataset", "mnist-5k", "--max-examples", "600", "--epochs", "1", "--json",
            "--method", "rr", "--epsilon", str(EPSILON)]  # fmt: skip
    result = _run(argv, endpoints, capsys)
    assert result["dataset"] == "mnist-5k" and result["task"] == "classification"
    kept = math.exp(EPSILON) / (math.exp(EPSILON) + 9)
    assert abs(result["mechanism_mse"] - kept) < 0.1
    assert 0 <= result["test"]["accuracy"] <= 1


def test_every_method_at_infinite_epsilon_is_the_non_private_baseline(
    endpoints: Endpoints, capsys: pytest.CaptureFixture[str]
) -> None:
    """At ε = ∞ nothing is released: RR-debiased's loss is plain cross-entropy there
    (it used to fail, asking for a release's matrix), so it trains the same model."""
    tiny = [*TINY[:-3], "--epochs", "1", "--json", "--epsilon", "inf"]
    base = _run([*tiny, "--method", "non-private"], endpoints, capsys)
    debiased = _run([*tiny, "--method", "rr-debiased"], endpoints, capsys)
    assert debiased["test"]["accuracy"] == base["test"]["accuracy"]
    assert debiased["epsilon_spent"] == 0
