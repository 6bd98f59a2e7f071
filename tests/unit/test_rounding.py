"""Unbiased randomized rounding onto a grid (label_party.mechanisms.rounding)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from label_party.mechanisms.base import FiniteMechanism, FitRequest, MechanismError
from label_party.mechanisms.rounding import (
    RoundingMechanism,
    from_request,
    round_to_grid,
    rounding_probabilities,
)

GRID = np.array([0.0, 0.5, 2.0, 3.0, 7.5, 10.0])


def _request(params: dict[str, Any], values: np.ndarray | None = None) -> FitRequest:
    v = np.array([0.0, 1.0, 2.5, 7.5, 10.0]) if values is None else values
    return FitRequest(
        epsilon=1.0,
        values=v,
        prior=np.full(v.size, 1.0 / v.size),
        domain=(0.0, 10.0),
        params=params,
    )


def test_expectation_is_the_label_exactly() -> None:
    labels = np.random.default_rng(0).uniform(0.0, 10.0, 100_000)
    labels[:6] = GRID
    j, p = rounding_probabilities(labels, GRID)
    assert np.all((p >= 0) & (p <= 1))
    assert np.all((GRID[j] <= labels) & (labels <= GRID[j + 1]))
    expected = (1 - p) * GRID[j] + p * GRID[j + 1]
    np.testing.assert_allclose(expected, labels, rtol=0, atol=1e-14)


def test_probabilities_are_the_papers_interpolation_weights() -> None:
    j, p = rounding_probabilities(np.array([1.0, 2.75, 9.0]), GRID)
    np.testing.assert_array_equal(j, [1, 2, 4])
    np.testing.assert_allclose(p, [(1.0 - 0.5) / 1.5, 0.75 / 1.0, 1.5 / 2.5])


def test_empirical_mean_within_standard_error() -> None:
    rng = np.random.default_rng(7)
    n = 400_000
    for y in (0.2, 1.7, 2.5, 8.123):
        out = GRID[round_to_grid(np.full(n, y), GRID, rng=rng, chunk_size=300_000)]
        assert set(np.unique(out)) <= set(GRID)
        se = out.std() / math.sqrt(n)
        assert abs(out.mean() - y) < 5 * se
        j, p = rounding_probabilities(np.array([y]), GRID)
        # Only the two neighbours, in the right proportion.
        assert np.all((out == GRID[j[0]]) | (out == GRID[j[0] + 1]))
        frac_up = np.mean(out == GRID[j[0] + 1])
        assert abs(frac_up - p[0]) < 5 * math.sqrt(p[0] * (1 - p[0]) / n)


def test_labels_on_grid_points_stay_put() -> None:
    labels = np.tile(GRID, 10_000)
    idx = round_to_grid(labels, GRID, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(GRID[idx], labels)
    assert idx.dtype == np.int64


@pytest.mark.parametrize("bad", [-0.001, 10.001, np.nan, np.inf])
def test_out_of_range_labels_are_refused_without_echoing_them(bad: float) -> None:
    with pytest.raises(MechanismError) as info:
        round_to_grid(np.array([1.0, bad]), GRID, rng=np.random.default_rng(0))
    assert "10.001" not in str(info.value) and "0.001" not in str(info.value)


@pytest.mark.parametrize(
    ("grid", "match"),
    [([1.0], "at least two"), ([0.0, 0.0, 1.0], "increasing"), ([0.0, np.nan], "finite")],
)
def test_bad_grids_are_refused(grid: list[float], match: str) -> None:
    with pytest.raises(MechanismError, match=match):
        round_to_grid(np.array([0.0]), grid)


def test_chunking_and_default_generator() -> None:
    labels = np.random.default_rng(2).uniform(0.0, 10.0, 10_001)
    a = round_to_grid(labels, GRID, rng=np.random.default_rng(3), chunk_size=777)
    b = round_to_grid(labels, GRID, rng=np.random.default_rng(3), chunk_size=777)
    np.testing.assert_array_equal(a, b)
    c = round_to_grid(labels, GRID)
    assert c.shape == labels.shape
    with pytest.raises(MechanismError, match="chunk_size"):
        round_to_grid(labels, GRID, chunk_size=0)


def test_from_request_with_grid_size_spans_the_bounds() -> None:
    mech = from_request(_request({"grid_size": 5}))
    assert isinstance(mech, FiniteMechanism) and isinstance(mech, RoundingMechanism)
    assert mech.name == "randomized-rounding"
    np.testing.assert_allclose(mech.outputs, [0.0, 2.5, 5.0, 7.5, 10.0])
    np.testing.assert_allclose(mech.matrix.sum(axis=1), 1.0)
    np.testing.assert_allclose(mech.bias(), 0.0, atol=1e-12)
    # value 1.0 → 0 w.p. 0.6, 2.5 w.p. 0.4; 2.5 and 7.5 sit on grid points.
    np.testing.assert_allclose(mech.matrix[1], [0.6, 0.4, 0, 0, 0])
    np.testing.assert_allclose(mech.matrix[2], [0, 1, 0, 0, 0])
    # Not private: no finite epsilon, and the matrix says so.
    assert mech.epsilon == math.inf
    assert mech.dp_ratio() == math.inf
    assert mech.params["private"] is False


def test_from_request_with_explicit_grid_and_continuous_sampling() -> None:
    mech = from_request(_request({"grid": GRID.tolist()}))
    assert isinstance(mech, RoundingMechanism)
    np.testing.assert_array_equal(mech.outputs, GRID)
    labels = np.random.default_rng(4).uniform(0.0, 10.0, 200_000)  # not input values
    out = mech.sample(labels, rng=np.random.default_rng(5))
    assert np.isin(out, GRID).all()
    assert abs(float(np.mean(out - labels))) < 5 * float(np.std(out - labels)) / math.sqrt(out.size)
    # squared loss of the matrix equals the closed form Σ p (1−p) (gap)²
    v, prior = mech.inputs, np.full(mech.inputs.size, 1 / mech.inputs.size)
    j, p = rounding_probabilities(v, GRID)
    gap = GRID[j + 1] - GRID[j]
    assert mech.noisy_label_loss(v, prior, "squared") == pytest.approx(
        float(np.mean(p * (1 - p) * gap**2))
    )


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({}, "grid or grid_size"),
        ({"grid": [0.0, 10.0], "grid_size": 3}, "grid or grid_size"),
        ({"grid_size": 1}, "grid_size"),
        ({"grid_size": 2.5}, "grid_size"),
        ({"grid_size": True}, "grid_size"),
        ({"grid": "0,1"}, "grid"),
        ({"grid": [0.0, 5.0]}, "cover"),
        ({"grid": [0.0, 5.0, 4.0, 10.0]}, "increasing"),
        ({"grid": [0.0, "a", 10.0]}, "grid"),
        ({"grid_size": 4, "epsilon": 2}, "epsilon"),
    ],
)
def test_bad_params_name_the_parameter(params: dict[str, Any], match: str) -> None:
    with pytest.raises(MechanismError, match=match):
        from_request(_request(params))
