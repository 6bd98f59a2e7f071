"""The law a sampler realizes, not the matrix it was built from, is what must be
ε-DP. Float draws realized every probability as a whole number of 2⁻⁵³ quanta:
an LP column of 10⁻¹⁵ came out with ratio 7.97 > e² at ε = 2, and at ε ≳ 37 an
e^{−ε} rounded to no draw at all (an output no label could reach, a label never
flipped). Each test reads the realized law exactly, in integers."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from typing import Any

import numpy as np
import pytest

from label_party.mechanisms.base import (
    COIN_QUANTA,
    TABLE_QUANTA,
    FiniteMechanism,
    MechanismError,
    rare_draws,
)
from label_party.mechanisms.classification import RRTopK, rr_sample, rr_with_prior_sample
from label_party.mechanisms.registry import fit


def _within(high: int, low: int, epsilon: float) -> bool:
    """high ≤ e^ε·low, decided in 60-digit decimals."""
    with localcontext() as context:
        context.prec = 60
        return Decimal(high) <= Decimal(epsilon).exp() * Decimal(low)


def _realized(mechanism: FiniteMechanism) -> np.ndarray:
    """The sampler's law in quanta: each row's draws per output column."""
    cumulative, _ = mechanism._sampling_tables
    table = cumulative.reshape(mechanism.inputs.size, mechanism.outputs.size)
    return np.diff(table, axis=1, prepend=0)


class _Draws:
    """A generator whose integer draws are given (the sampler's only randomness)."""

    def __init__(self, values: list[int]) -> None:
        self.values = values

    def integers(self, low: Any, high: Any, size: Any = None, dtype: Any = None) -> np.ndarray:
        shape = np.shape(high) if size is None else size  # numpy's: high's shape
        return np.resize(np.asarray(self.values, dtype=np.int64), shape)


def _reviewer_case() -> tuple[np.ndarray, np.ndarray, float]:
    """The 54th draw of a random sweep over grids, priors and ε (k = 41, ε = 2),
    whose unbiased LP leaves a column of entries between 4·10⁻¹⁵ and 3·10⁻¹⁴."""
    rng = np.random.default_rng(1)
    for _ in range(54):
        k = int(rng.choice([7, 15, 41]))
        if rng.random() < 0.5:
            values = np.sort(np.concatenate([[0.0], np.cumsum(rng.exponential(1, k - 1))]))
        else:
            values = np.linspace(0, 10, k)
        kind = int(rng.integers(4))
        prior = {0: np.full(k, 1 / k), 1: rng.dirichlet(np.ones(k)),
                 2: rng.dirichlet(np.full(k, 0.05)), 3: None}[kind]  # fmt: skip
        if prior is None:
            prior = np.zeros(k)
            prior[rng.integers(k)] = 1
        epsilon = float(rng.choice([0.5, 1, 2, 3, 5, 7, 10]))
    return values, prior, epsilon


def test_an_lp_column_of_negligible_mass_is_sampled_within_epsilon() -> None:
    values, prior, epsilon = _reviewer_case()
    mechanism = fit("unbiased", epsilon=epsilon, values=values, prior=prior)
    assert isinstance(mechanism, FiniteMechanism)
    tiny = int(np.argmin(mechanism.matrix.min(axis=0)))
    assert (values.size, epsilon) == (41, 2.0) and mechanism.matrix[:, tiny].max() < 1e-13
    law = _realized(mechanism)
    assert np.all(law.sum(axis=1) == TABLE_QUANTA) and np.all(law > 0)
    for column in law.T:
        assert _within(int(column.max()), int(column.min()), epsilon)
    # The sampler draws exactly that table: the tiny column's first and last draw.
    cumulative = np.cumsum(law, axis=1)
    assert tiny > 0
    for row in (0, values.size - 1):
        first, last = int(cumulative[row, tiny - 1]), int(cumulative[row, tiny]) - 1
        drawn = mechanism.sample_indices(np.full(3, row), rng=_Draws([first, last, first - 1]))
        assert drawn.tolist() == [tiny, tiny, tiny - 1]
    # And it moved the law by a negligible amount.
    assert np.abs(law / TABLE_QUANTA - mechanism.matrix).max() < 1e-9


@pytest.mark.parametrize("epsilon", [38.0, 800.0])
def test_rr_on_bins_past_float_precision_reaches_every_output(epsilon: float) -> None:
    mechanism = fit("rr-on-bins", epsilon=epsilon, values=np.linspace(0, 10, 11),
                    prior=np.full(11, 1 / 11))  # fmt: skip
    assert isinstance(mechanism, FiniteMechanism)
    law = _realized(mechanism)
    assert np.all(law > 0)  # no output unreachable from a label
    for column in law.T:
        assert _within(int(column.max()), int(column.min()), epsilon)


@pytest.mark.parametrize("epsilon", [37.5, 40.0, 800.0])
def test_randomized_response_flips_at_any_epsilon(epsilon: float) -> None:
    """The flip is rounded up to whole quanta: at least one of the 2⁶² draws flips,
    and the realized keep/flip ratio stays within e^ε."""
    for others in (1, 9):
        flips = rare_draws(others, 1, epsilon)
        assert flips >= 1
        assert _within((COIN_QUANTA - flips) * others, flips, epsilon)
    first_draw = _Draws([0])  # the smallest draw: a flip
    assert (
        rr_sample(np.zeros(4, dtype=np.int64), 2, epsilon=epsilon, rng=first_draw).tolist()
        == [1] * 4
    )
    top = RRTopK(epsilon=epsilon, num_classes=3, top=(0, 1), k_star=2)
    assert top.sample(np.zeros(4), rng=first_draw).tolist() == [1.0] * 4
    priors = np.tile([0.5, 0.5, 0.0], (4, 1))
    drawn = rr_with_prior_sample(np.zeros(4, dtype=np.int64), priors, epsilon=epsilon,
                                 rng=first_draw)  # fmt: skip
    assert drawn.tolist() == [1] * 4


@pytest.mark.parametrize(
    ("name", "params"),
    [("staircase", {"discrete": True, "r": 3}), ("laplace", {"discrete": True}),
     ("staircase", {}), ("laplace", {}), ("exponential", {})],
)  # fmt: skip
def test_an_additive_mechanism_past_its_ceiling_runs_at_it(
    name: str, params: dict[str, Any]
) -> None:
    """Near ε = 40 a discrete staircase's low step and a discrete Laplace's nonzero
    noise rounded to no draw (some output unreachable from some label); past
    ``ADDITIVE_MAX_EPSILON`` they run at it, more private than charged."""
    from label_party.mechanisms.additive import ADDITIVE_MAX_EPSILON

    values = np.arange(11.0)
    mechanism = fit(name, epsilon=40.0, values=values, prior=np.full(11, 1 / 11),
                    domain=(0.0, 10.0), params=params)  # fmt: skip
    assert mechanism.epsilon == ADDITIVE_MAX_EPSILON
    # The rarest coin at the ceiling, e^{−25}, is far above the 2⁻⁶² quantum.
    assert math.exp(-ADDITIVE_MAX_EPSILON) * COIN_QUANTA > 1e5
    low = fit(name, epsilon=3.0, values=values, prior=np.full(11, 1 / 11),
              domain=(0.0, 10.0), params=params)  # fmt: skip
    assert low.epsilon == 3.0  # below the ceiling, as asked


@pytest.mark.parametrize(("others", "epsilon"), [(1, 0.1), (9999, 0.09), (63, 1.7), (2, 12.0)])
def test_a_coin_s_rare_side_is_counted_in_integers_not_from_a_float(
    others: int, epsilon: float
) -> None:
    """⌈fl(p)·2⁵³⌉ fell short of the exact p when fl(p)·2⁵³ was already a whole
    number below it (RR at K = 2, ε = 0.1: a ratio 1.1e-16 above e^0.1). The count
    is the least that keeps the realized law within e^ε, decided exactly."""
    flips = rare_draws(others, 1, epsilon)
    assert _within((COIN_QUANTA - flips) * others, flips, epsilon)
    assert not _within((COIN_QUANTA - flips + 1) * others, flips - 1, epsilon)  # the least


@pytest.mark.parametrize(("others", "common"), [(18_124, 1), (99_999, 1), (99_999, 7), (1, 1)])
def test_a_coin_is_within_e_eps_both_ways_at_the_ledger_s_smallest_epsilon(
    others: int, common: int
) -> None:
    """Rounded up to the least count, the rare side could pass chance: at ε = 10⁻¹²
    and 18,125 classes or more, one other class came out more likely than the label
    kept by more than e^ε (4.5·10⁻¹² against 10⁻¹² at K = 10⁵, with 2⁵³ draws)."""
    epsilon = 1e-12
    flips = rare_draws(others, common, epsilon)
    rare_each, common_each = flips * common, (COIN_QUANTA - flips) * others
    assert _within(common_each, rare_each, epsilon) and _within(rare_each, common_each, epsilon)


def test_a_coin_no_count_realizes_is_refused() -> None:
    """10¹⁵ outcomes at ε = 10⁻¹²: the counts within e^ε both ways span 0.01 of a
    quantum, so none may exist; the coin is refused, not drawn past e^ε."""
    with pytest.raises(MechanismError, match="raise ε"):
        rare_draws(10**15, 1, 1e-12)


def test_a_discrete_staircase_s_low_step_is_never_rarer_than_its_law() -> None:
    """Its step was a float coin against p_high: the low step rounded down, a
    high/low ratio above e^ε at every ε (4·10⁻⁵ of it at ε = 25)."""
    for period, split, epsilon in ((100, 13, 25.0), (65536, 13, 25.0), (10, 3, 1.0)):
        low = rare_draws(period - split, split, epsilon)
        high_each, low_each = (COIN_QUANTA - low) * (period - split), low * split
        assert _within(high_each, low_each, epsilon)  # per position, scaled by s(P − s)
    mechanism = fit("staircase", epsilon=2.0, values=np.arange(11.0), prior=np.full(11, 1 / 11),
                    domain=(0.0, 10.0), params={"discrete": True, "r": 3})  # fmt: skip
    drawn = mechanism.sample(np.full(20_000, 5.0), rng=np.random.default_rng(3))
    assert np.array_equal(drawn, np.round(drawn))


@pytest.mark.parametrize(
    # unbiased at its floor, unbiased.MIN_EPSILON (10⁻⁶ is refused since helper-87)
    ("name", "k", "epsilon"),
    [("debiased-rr", 10, 1e-8), ("unbiased", 3, 1e-3)],
)
def test_a_tiny_epsilon_still_samples(name: str, k: int, epsilon: float) -> None:
    """The check's slack, γ(e^ε − 1)·2⁶², is a few quanta at ε = 10⁻⁸: a mixing
    capped at 2⁻³⁰ refused mechanisms that sampled before."""
    mechanism = fit(name, epsilon=epsilon, values=np.arange(float(k)), prior=np.full(k, 1 / k))
    assert isinstance(mechanism, FiniteMechanism)
    law = _realized(mechanism)
    for column in law.T:
        assert _within(int(column.max()), int(column.min()), epsilon)


def test_unclipped_noise_stays_where_floats_hold_its_sums_exactly() -> None:
    """Past 2⁵³ ``y + Z`` rounded as ``y`` dictated: at ε = 10⁻¹² on 0..10000, 5 %
    of label 0's outputs were multiples of 4 plus 4 that label 2 could never give.
    Unclipped noise is now kept within a window of 2⁵¹ steps, and a sum past it
    lands on its edge, which every label reaches alike."""
    from label_party.mechanisms.additive import FAR_STEPS, AdditiveMechanism, discrete_laplace

    noise = discrete_laplace(10_000, 1e-12)  # scale 10¹⁶ > 2⁵³: built past the refusal
    mechanism = AdditiveMechanism("laplace", 1e-12, 0.0, 10_000.0, noise, False, True, {})
    low, high = mechanism.window
    assert (low, high) == (-FAR_STEPS, 10_000 + FAR_STEPS) and high < 2**53
    rng = np.random.default_rng(11)
    for label in (0.0, 2.0):
        out = mechanism.sample(np.full(50_000, label), rng=rng)
        assert out.min() >= low and out.max() <= high
        edges = np.isin(out, (low, high))
        assert 0.4 < edges.mean() < 0.95  # most of this noise is past the window
        inside = out[~edges]
        assert np.array_equal(inside, np.round(inside))


@pytest.mark.parametrize(
    ("name", "params", "epsilon"),
    [("laplace", {}, 1e-11), ("staircase", {}, 1e-11), ("laplace", {"discrete": True}, 1e-12),
     ("staircase", {"discrete": True, "r": 9093}, 1e-12)],
)  # fmt: skip
def test_unclipped_noise_that_would_reach_the_window_is_refused(
    name: str, params: dict[str, Any], epsilon: float
) -> None:
    """Its analysis (unbiased, E[Z²]) would not describe a release clipped most of
    the time; refused at the fit (free), and clipped it is fine."""
    values = np.arange(0.0, 9095.0)
    prior = np.full(values.size, 1 / values.size)
    with pytest.raises(MechanismError, match="raise ε or set clip=true"):
        fit(name, epsilon=epsilon, values=values, prior=prior, domain=(0.0, 9094.0),
            params=params)  # fmt: skip
    clipped = fit(name, epsilon=epsilon, values=values, prior=prior, domain=(0.0, 9094.0),
                  params={**params, "clip": True})  # fmt: skip
    assert clipped.epsilon == epsilon


def test_a_staircase_step_no_count_realizes_is_refused_by_the_fit() -> None:
    """The step coin was counted first when sampling: a preview (which does not
    sample) described a mechanism a release would refuse."""
    top = 10**15 + 7
    with pytest.raises(MechanismError, match="raise ε"):
        fit("staircase", epsilon=1e-6, values=np.array([0.0, float(top)]),
            prior=np.array([0.5, 0.5]), domain=(0.0, float(top)),
            params={"discrete": True, "clip": True, "r": 1})  # fmt: skip
