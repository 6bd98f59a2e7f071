"""Whether a release succeeds must not depend on the labels' values (DESIGN.md
§3.1): a refusal that did was a query of them. Every mechanism, with its options,
on label vectors anywhere in the declared domain, fractional ones included: the
same outcome, and a sample inside the output range. (A fit to a *noisy* prior may
still fail; that failure is a function of a DP histogram, and it is charged:
``test_privacy.py``.)"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from label_party.datasets.domain import parse_domain
from label_party.labels.validation import LABELS_SCHEMA
from label_party.releases.pipeline import ReleasePlan, check_plan, preflight, randomize

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


def _outcome(plan: ReleasePlan, labels: np.ndarray, tmp: Path) -> str:
    src, out = tmp / "labels.parquet", tmp / "out.parquet"
    ids = pa.array([f"e{i}" for i in range(labels.size)])
    pq.write_table(pa.table([ids, pa.array(labels)], schema=LABELS_SCHEMA), src)
    try:
        randomize(
            plan,
            labels_file=src,
            out_file=out,
            selected=None,
            rng=np.random.default_rng(1),
            prior_rng=None,
            chunk_size=17,
        )
    except Exception as exc:  # the outcome itself is what is compared
        return f"{type(exc).__name__}: {exc}"
    noisy = pq.read_table(out).column("label").to_numpy()
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
