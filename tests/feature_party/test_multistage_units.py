"""The pieces of the LP-MST driver that need no services: the partition, the
top-k* filter and the request's checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from pydantic import ValidationError

from feature_party.multistage.driver import assign_parts
from feature_party.multistage.schemas import MultistageCreate
from feature_party.multistage.topk import in_top_k, k_star
from label_party.mechanisms.classification import top_k_sets

BASE = {"feature_set_id": "f", "labels_party_url": "http://lp", "token": "t",
        "dataset_id": "d", "epsilon": 1.0}  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    priors=arrays(np.float64, st.tuples(st.integers(1, 20), st.integers(2, 12)),
                  elements=st.floats(0.001, 1.0)),
    epsilon=st.floats(0.05, 12.0),
)  # fmt: skip
def test_k_star_is_the_labels_partys_choice(priors: np.ndarray, epsilon: float) -> None:
    """The features party's filter uses the same k* and ranking as RRWithPrior."""
    sizes, order = k_star(priors, epsilon)
    expected_sizes, expected_order = top_k_sets(priors, epsilon=epsilon)
    np.testing.assert_array_equal(sizes, expected_sizes)
    np.testing.assert_array_equal(order, expected_order)


def test_k_star_against_brute_force() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        p = rng.dirichlet(np.full(6, 0.3))
        eps = float(rng.uniform(0.1, 5))
        top = np.sort(p)[::-1].cumsum()
        objective = [top[k - 1] * np.exp(eps) / (np.exp(eps) + k - 1) for k in range(1, 7)]
        assert k_star(p[None, :], eps)[0][0] == int(np.argmax(objective)) + 1


def test_in_top_k_keeps_exactly_the_top_classes() -> None:
    priors = np.array([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25]])
    # ε = 1: k* = 1 for the confident prior, 3 for the flat one.
    assert k_star(priors, 1.0)[0].tolist() == [1, 3]
    keep = in_top_k(np.repeat(priors, 3, axis=0), np.tile([0, 1, 2], 2), 1.0)
    assert keep.tolist() == [True, False, False, True, True, True]


def test_the_partition_depends_on_ids_and_seed_only() -> None:
    ids = [f"ex-{i}" for i in range(1000)]
    ordered, parts = assign_parts(ids, [0.4, 0.6], seed=3, prefix="lpmst")
    assert ordered == sorted(ids)
    assert parts.count("lpmst-1") == 400 and parts.count("lpmst-2") == 600
    # The input order does not matter; the seed does.
    shuffled = list(np.random.default_rng(0).permutation(ids))
    assert assign_parts(shuffled, [0.4, 0.6], seed=3, prefix="lpmst") == (ordered, parts)
    assert assign_parts(ids, [0.4, 0.6], seed=4, prefix="lpmst")[1] != parts
    # Not a contiguous cut of the sorted ids.
    assert 0.3 < [p == "lpmst-1" for p in parts[:500]].count(True) / 500 < 0.5
    three = assign_parts(ids, [1 / 3] * 3, seed=1, prefix="s")[1]
    assert sorted({three.count(f"s-{t}") for t in (1, 2, 3)}) == [333, 334]


def test_request_defaults_and_checks() -> None:
    body = MultistageCreate.model_validate(BASE)
    assert body.shares() == [0.4, 0.6] and body.training.task == "classification"
    assert MultistageCreate.model_validate({**BASE, "stages": 4}).shares() == [0.25] * 4
    epochs_only = MultistageCreate.model_validate({**BASE, "training": {"epochs": 2}}).training
    assert (epochs_only.task, epochs_only.loss, epochs_only.epochs) == (
        "classification",
        "cross-entropy",
        2,
    )
    public = body.public_config(seed=7)
    assert "token" not in public and public["seed"] == 7 and public["fractions"] == [0.4, 0.6]
    for bad, message in (
        ({"fractions": [0.5, 0.6]}, "sum to 1"),
        ({"fractions": [1.0]}, "one share per stage"),
        ({"training": {"task": "regression", "loss": "squared"}}, "classification"),
        (
            {"training": {"task": "classification", "loss": "cross-entropy", "init_model_id": "m"}},
            "init_model_id",
        ),
        # Without a task the training is a classifier's: the refusal names the loss.
        ({"training": {"loss": "rr-debiased-cross-entropy"}}, "use loss cross-entropy"),
        ({"epsilon": 0}, "greater than 0"),
        # What the labels party's ledger cannot hold is refused before a partition
        # plan, which nothing replaces, is registered there.
        ({"epsilon": 1e-13}, "more than 12 decimal places"),
        ({"epsilon": 5e6}, "too large"),
        ({"labels_party_url": "ftp://x"}, "pattern"),
        # Strict: its stages spend ε, so a value of the wrong type is not coerced.
        ({"epsilon": "1"}, "valid number"),
        ({"stages": True}, "valid integer"),
        ({"training": {"epochs": "2"}}, "valid integer"),
        ({"filter_top_k": "yes"}, "valid boolean"),
    ):
        with pytest.raises(ValidationError, match=message):
            MultistageCreate.model_validate({**BASE, **bad})
