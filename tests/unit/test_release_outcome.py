"""Whether a release succeeds must not depend on the labels' values (DESIGN.md
§3.1): a refusal that did was a query of them. Every mechanism, with its options,
on label vectors anywhere in the declared domain, fractional ones included: the
same outcome, and a sample inside the output range. (A fit to a *noisy* prior may
still fail; that failure is a function of a DP histogram, and it is charged:
``test_privacy.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from label_party.datasets.domain import parse_domain
from label_party.exceptions import InvalidRequestError
from label_party.labels.validation import LABELS_SCHEMA
from label_party.mechanisms.additive import AdditiveMechanism
from label_party.releases import pipeline
from label_party.releases.pipeline import (
    Randomized,
    ReleasePlan,
    check_plan,
    preflight,
    randomize,
)

N = 60
REGRESSION = {"min": 0, "max": 10, "step": 1}
CLASSES = {"num_classes": 5}

#: (task, mechanism, options, ε, prior ε)
CONFIGS: list[tuple[str, str, dict[str, Any], str, str | None]] = [
    ("regression", "rr-on-bins", {}, "1", None),
    ("regression", "unbiased", {}, "2", "0.5"),
    ("regression", "auto", {}, "2", "0.5"),
    ("regression", "debiased-rr", {}, "1", None),
    ("regression", "laplace", {}, "1", None),
    ("regression", "laplace", {"discrete": True}, "1", None),
    ("regression", "laplace", {"discrete": True, "clip": True}, "1", None),
    ("regression", "staircase", {"discrete": True, "r": 3}, "1", None),
    ("regression", "staircase", {"clip": True}, "1", None),
    ("regression", "exponential", {}, "1", None),
    # 1 − e^{−ε} rounds to 1 past ε ≈ 37.4; ε/Δ for the discrete Laplace (Δ = 10).
    ("regression", "staircase", {}, "40", None),
    ("regression", "staircase", {"discrete": True}, "40", None),
    ("regression", "laplace", {"discrete": True}, "400", None),
    ("regression", "auto", {}, "17", None),  # debiased-rr, with no prior
    ("classification", "rr", {}, "1", None),
    ("classification", "rr-with-prior", {}, "1", "0.25"),
]


def _label_vectors(task: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    if task == "classification":
        return {
            "all 0": np.zeros(N),
            "all 4": np.full(N, 4.0),
            "mixed": rng.integers(0, 5, N).astype(float),
        }
    return {
        "all min": np.zeros(N),
        "all max": np.full(N, 10.0),
        "integers": rng.integers(0, 11, N).astype(float),
        "fractional": rng.uniform(0, 10, N),
    }


def _randomize(plan: ReleasePlan, labels: np.ndarray, tmp: Path) -> Randomized:
    src = tmp / "labels.parquet"
    ids = pa.array([f"e{i}" for i in range(labels.size)])
    pq.write_table(pa.table([ids, pa.array(labels)], schema=LABELS_SCHEMA), src)
    return randomize(
        plan,
        labels_file=src,
        out_file=tmp / "out.parquet",
        selected=None,
        rng=np.random.default_rng(1),
        prior_rng=None,
        chunk_size=17,
    )


def _outcome(plan: ReleasePlan, labels: np.ndarray, tmp: Path) -> str:
    try:
        _randomize(plan, labels, tmp)
    except Exception as exc:  # the outcome itself is what is compared
        return f"{type(exc).__name__}: {exc}"
    noisy = pq.read_table(tmp / "out.parquet").column("label").to_numpy()
    assert noisy.size == labels.size and np.all(np.isfinite(noisy))
    return "released"


@pytest.mark.parametrize(("task", "mechanism", "options", "epsilon", "prior"), CONFIGS)
def test_whether_a_release_succeeds_does_not_depend_on_the_labels(
    task: str,
    mechanism: str,
    options: dict[str, Any],
    epsilon: str,
    prior: str | None,
    tmp_path: Path,
) -> None:
    plan = ReleasePlan(
        mechanism=mechanism,
        params=dict(options),
        loss="zero-one" if task == "classification" else "squared",
        epsilon=Decimal(epsilon),
        prior_epsilon=None if prior is None else Decimal(prior),
        domain=parse_domain(task, REGRESSION if task == "regression" else CLASSES),
    )
    check_plan(plan, task)
    plan = preflight(plan, N)
    outcomes = {
        name: _outcome(plan, labels, tmp_path) for name, labels in _label_vectors(task).items()
    }
    assert set(outcomes.values()) == {"released"}, outcomes


def _regression_plan(mechanism: str, epsilon: str, prior: str | None = None) -> ReleasePlan:
    return ReleasePlan(
        mechanism=mechanism,
        params={},
        loss="squared",
        epsilon=Decimal(epsilon),
        prior_epsilon=None if prior is None else Decimal(prior),
        domain=parse_domain("regression", REGRESSION),
    )


def test_auto_above_epsilon_12_spends_all_of_it_on_debiased_rr(tmp_path: Path) -> None:
    """``auto`` picks ``debiased-rr`` above ε = 12, which reads no prior: splitting
    off ε₁ for one (it did) wasted it."""
    plan = preflight(_regression_plan("auto", "13"), N)
    assert plan.prior_epsilon is None
    result = _randomize(plan, np.arange(N) % 11.0, tmp_path)
    assert (result.prior, result.prior_epsilon) == (None, 0)
    assert (result.description["name"], result.description["epsilon"]) == ("debiased-rr", 13.0)
    # At ε = 12 it picks the unbiased LP, which reads a prior: ε₁ is split off.
    assert preflight(_regression_plan("auto", "12"), N).prior_epsilon


def test_auto_refuses_a_prior_epsilon_that_its_choice_would_not_use() -> None:
    with pytest.raises(InvalidRequestError, match=r"uses no prior at ε − prior_epsilon = 19\.5;"):
        check_plan(_regression_plan("auto", "20", prior="0.5"), "regression")
    check_plan(_regression_plan("auto", "12.4", prior="0.5"), "regression")  # unbiased at 11.9


@pytest.fixture
def fresh_preflight_cache() -> Iterator[None]:
    pipeline._uniform_fit_problem.cache_clear()
    yield
    pipeline._uniform_fit_problem.cache_clear()


@pytest.mark.usefixtures("fresh_preflight_cache")
def test_preflight_refuses_a_sampler_that_fails_whatever_the_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sampling failure that no label causes must be a free refusal, before ε is
    reserved: after it, every failure is charged."""

    def broken(self: AdditiveMechanism, *args: object, **kwargs: object) -> np.ndarray:
        raise ValueError("math domain error")

    monkeypatch.setattr(AdditiveMechanism, "sample", broken)
    with pytest.raises(InvalidRequestError, match=r"staircase cannot sample .* \(ValueError\)"):
        preflight(_regression_plan("staircase", "2"), N)
    monkeypatch.undo()
    pipeline._uniform_fit_problem.cache_clear()  # it caches the verdict
    assert preflight(_regression_plan("staircase", "2"), N) is not None
