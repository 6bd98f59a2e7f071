"""RR-on-Bins (``label_party.mechanisms.rr_on_bins``) against independent ground truth.

* the LP over *all* ε-DP mechanisms (Appendix A, LP (2) of
  ``rr-on-bins-regression.txt``) on an output grid that contains every interval's
  loss minimizer, solved with HiGHS at tight tolerances;
* brute force over all contiguous partitions (k ≤ 7);
* the paper's O(k³) dynamic program (Algorithm 2) for larger k;
* the loss it reports against the loss of the matrix it builds.

Why the LP comparison is exact: every mechanism the LP allows is ε-DP, so
LP_opt ≥ OPT (the optimum over all ε-DP mechanisms). By Theorem 5 OPT is attained
by an RR-on-Bins mechanism whose outputs are the loss minimizers of its bins
(Appendix B); the grid holds the minimizer of every interval of values, computed
here independently of the module, so that mechanism is feasible and LP_opt ≤ OPT.
Hence LP_opt = OPT and the module's loss must equal it: a wrong partition, a wrong
bin output or a wrong loss formula all show up as a gap.
"""

from __future__ import annotations

import itertools
import math
import warnings

import highspy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from label_party.mechanisms.base import (
    FiniteMechanism,
    FitRequest,
    Loss,
    MechanismError,
    pointwise_loss,
)
from label_party.mechanisms.rr_on_bins import from_request, optimal_bins, rr_on_bins_matrix

LOSSES: tuple[Loss, ...] = ("squared", "absolute", "poisson")
Array = np.ndarray


# -- independent references ----------------------------------------------------------


def _g(values: Array) -> Array:
    """y·log y − y: adding it to the Poisson loss gives the (non-negative) deviance."""
    safe = np.where(values > 0, values, 1.0)
    return np.where(values > 0, values * np.log(safe), 0.0) - values


def _ell(outputs: Array, values: Array, loss: Loss) -> Array:
    """ℓ(o, y) as a |values| × |outputs| matrix; Poisson in deviance form (≥ 0)."""
    cost = pointwise_loss(outputs[None, :], values[:, None], loss)
    if loss == "poisson":
        cost = cost + _g(values)[:, None]
    return cost


def _interval_minimizer(
    values: Array, prior: Array, eps: float, lo: int, hi: int, loss: Loss
) -> float:
    """argmin_ŷ Σ_y p_y e^{ε·1[y ∈ values[lo:hi]]} ℓ(ŷ, y) from the explicit weights."""
    w = prior * np.where(
        (np.arange(values.size) >= lo) & (np.arange(values.size) < hi), math.exp(eps), 1.0
    )
    if loss == "absolute":
        # A weighted median is one of the values: try them all.
        return float(values[np.argmin(w @ _ell(values, values, loss))])
    return float(np.dot(w, values) / w.sum())  # weighted mean (squared, Poisson)


def _partition_loss(values: Array, prior: Array, eps: float, edges: list[int], loss: Loss) -> float:
    """E ℓ(M(y), y) of RR-on-Bins with bins values[edges[b]:edges[b+1]] (deviance form)."""
    k, d = values.size, len(edges) - 1
    outputs = np.array(
        [_interval_minimizer(values, prior, eps, edges[b], edges[b + 1], loss) for b in range(d)]
    )
    assign = np.repeat(np.arange(d), np.diff(edges))
    c = math.exp(eps)
    m = np.full((k, d), 1.0 / (c + d - 1))
    m[np.arange(k), assign] = c / (c + d - 1)
    keep = prior > 0
    return float(prior[keep] @ (m[keep] * _ell(outputs, values[keep], loss)).sum(axis=1))


def _lp_optimum(values: Array, prior: Array, eps: float, grid: Array, loss: Loss) -> float:
    """min Σ_y p_y Σ_o M[y,o] ℓ(o,y) s.t. rows of M sum to 1, M ≥ 0 and
    M[y',o] ≤ e^ε M[y,o] for all y ≠ y' and o (LP (2), Appendix A)."""
    k, m = values.size, grid.size
    cost = prior[:, None] * _ell(grid, values, loss)
    c = math.exp(eps)
    starts, index, value = [0], [], []
    for y in range(k):  # Σ_o M[y, o] = 1
        index.extend(y * m + o for o in range(m))
        value.extend([1.0] * m)
        starts.append(len(index))
    for o in range(m):  # M[y', o] − e^ε M[y, o] ≤ 0
        for y, y2 in itertools.permutations(range(k), 2):
            index.extend([y2 * m + o, y * m + o])
            value.extend([1.0, -c])
            starts.append(len(index))
    num_rows = len(starts) - 1
    lp = highspy.HighsLp()
    lp.num_col_ = k * m
    lp.num_row_ = num_rows
    lp.col_cost_ = cost.ravel()
    lp.col_lower_ = np.zeros(k * m)
    lp.col_upper_ = np.full(k * m, highspy.kHighsInf)
    lp.row_lower_ = np.concatenate([np.ones(k), np.full(num_rows - k, -highspy.kHighsInf)])
    lp.row_upper_ = np.concatenate([np.ones(k), np.zeros(num_rows - k)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("solver", "simplex")
    h.setOptionValue("primal_feasibility_tolerance", 1e-10)
    h.setOptionValue("dual_feasibility_tolerance", 1e-10)
    h.setOptionValue("ipm_optimality_tolerance", 1e-12)
    h.passModel(lp)
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return float(h.getInfo().objective_function_value)


def _module_loss(values: Array, prior: Array, eps: float, loss: Loss) -> tuple[float, Array]:
    """The module's loss (deviance form for Poisson) and its outputs."""
    fitted = optimal_bins(values, prior, epsilon=eps, loss=loss)
    shift = float(prior @ _g(values)) if loss == "poisson" else 0.0
    return fitted.loss + shift, fitted.outputs


# -- the LP over all ε-DP mechanisms ------------------------------------------------


@st.composite
def _problems(draw: st.DrawFn, loss: Loss) -> tuple[Array, Array, float]:
    k = draw(st.integers(1, 8))
    low = 0.0 if loss == "poisson" else -20.0
    start = draw(st.one_of(st.just(low), st.floats(low, 20.0, allow_subnormal=False)))
    gaps = draw(st.lists(st.floats(0.1, 10.0), min_size=k - 1, max_size=k - 1))
    values = start + np.concatenate([[0.0], np.cumsum(gaps)])
    weights = np.array(
        draw(st.lists(st.one_of(st.just(0.0), st.floats(0.01, 1.0)), min_size=k, max_size=k))
    )
    if loss == "poisson" and values[-1] == 0:
        values = values + 1.0
    if loss == "poisson" and not np.any(weights[values > 0] > 0):
        weights[-1] = 1.0  # all mass on y = 0 is a separate edge case
    if weights.sum() == 0:
        weights[0] = 1.0
    eps = draw(st.floats(0.05, 4.0))
    return values, weights / weights.sum(), eps


def _check_against_lp(values: Array, prior: Array, eps: float, loss: Loss) -> None:
    ours, outputs = _module_loss(values, prior, eps, loss)
    k = values.size
    minimizers = [
        _interval_minimizer(values, prior, eps, lo, hi, loss)
        for lo in range(k)
        for hi in range(lo + 1, k + 1)
    ]
    grid = np.unique(
        np.concatenate([values, np.linspace(values[0], values[-1], 41), minimizers, outputs])
    )
    if loss == "poisson":
        grid = grid[grid > 0]
    lp = _lp_optimum(values, prior, eps, grid, loss)
    scale = max(abs(lp), 1e-6)  # k = 1 has loss 0, up to rounding
    assert lp <= ours + 1e-7 * scale, "the module's own mechanism is feasible in the LP"
    assert ours <= lp + 1e-7 * scale, f"not optimal: {ours} vs LP {lp}"


_LP_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("loss", LOSSES)
def test_matches_the_lp_over_all_dp_mechanisms(loss: Loss) -> None:
    @_LP_SETTINGS
    @given(_problems(loss))
    def check(problem: tuple[Array, Array, float]) -> None:
        _check_against_lp(*problem, loss)

    check()


def test_lp_check_detects_a_suboptimal_mechanism() -> None:
    """The LP ground truth is sharp enough to reject a one-bin (constant) mechanism."""
    values = np.array([0.0, 1.0, 3.0, 4.0])
    prior = np.array([0.3, 0.2, 0.2, 0.3])
    grid = np.unique(np.concatenate([values, np.linspace(0.0, 4.0, 41)]))
    lp = _lp_optimum(values, prior, 2.0, grid, "squared")
    constant = _partition_loss(values, prior, 2.0, [0, 4], "squared")
    assert constant > lp * (1 + 1e-3)


# -- brute force and the paper's dynamic program -------------------------------------


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("seed", range(6))
def test_brute_force_over_all_contiguous_partitions(loss: Loss, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for k in range(1, 8):
        values = np.sort(rng.choice(np.arange(0.0, 40.0), size=k, replace=False))
        prior = rng.dirichlet(np.full(k, 0.6))
        if seed % 2 and k > 2:
            prior[rng.integers(k)] = 0.0
            prior /= prior.sum()
        eps = float(rng.choice([0.1, 0.7, 2.0, 5.0]))
        best = min(
            _partition_loss(values, prior, eps, [0, *cut, k], loss)
            for d in range(k)
            for cut in itertools.combinations(range(1, k), d)
        )
        ours, _ = _module_loss(values, prior, eps, loss)
        assert ours == pytest.approx(best, rel=1e-10, abs=1e-12)


def _algorithm_2(values: Array, prior: Array, eps: float, loss: Loss) -> float:
    """The paper's DP: A[i][j] = min_r A[r][j−1] + L[r+1][i]; loss min_d A[k][d]/(c+d−1)."""
    k = values.size
    c = math.exp(eps)
    L = np.full((k + 1, k + 1), np.inf)  # L[r, i]: bin values[r:i]
    for r in range(k):
        for i in range(r + 1, k + 1):
            w = prior * np.where((np.arange(k) >= r) & (np.arange(k) < i), c, 1.0)
            o = _interval_minimizer(values, prior, eps, r, i, loss)
            keep = prior > 0
            L[r, i] = float(w[keep] @ _ell(np.array([o]), values[keep], loss)[:, 0])
    A = np.full(k + 1, np.inf)
    A[0] = 0.0
    best = np.inf
    for d in range(1, k + 1):
        A = np.min(A[:, None] + L, axis=0)  # A_d[i] = min_r A_{d-1}[r] + L[r, i]
        best = min(best, A[k] / (c + d - 1))
    return float(best)


@pytest.mark.parametrize("loss", LOSSES)
def test_agrees_with_algorithm_2_for_larger_k(loss: Loss) -> None:
    rng = np.random.default_rng(7)
    for k, eps in [(25, 0.5), (30, 2.0), (40, 6.0)]:
        values = np.cumsum(rng.uniform(0.2, 3.0, size=k))
        prior = rng.dirichlet(np.full(k, 0.3))
        prior[prior < 0.005] = 0.0
        prior /= prior.sum()
        ours, _ = _module_loss(values, prior, eps, loss)
        assert ours == pytest.approx(_algorithm_2(values, prior, eps, loss), rel=1e-9)


# -- the mechanism it builds ---------------------------------------------------------


def _fit(values: Array, prior: Array, eps: float, loss: Loss, **params: object) -> FiniteMechanism:
    request = FitRequest(epsilon=eps, values=values, prior=prior, loss=loss, params=params)
    return from_request(request)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("eps", [0.2, 1.0, 3.0, 8.0])
def test_reported_loss_is_the_loss_of_the_matrix(loss: Loss, eps: float) -> None:
    rng = np.random.default_rng(int(eps * 10))
    values = np.unique(rng.integers(0, 200, size=60)).astype(float)
    prior = rng.dirichlet(np.full(values.size, 0.5))
    fitted = optimal_bins(values, prior, epsilon=eps, loss=loss)
    mech = _fit(values, prior, eps, loss)
    assert mech.noisy_label_loss(values, prior, loss) == pytest.approx(fitted.loss, rel=1e-12)
    # The matrix is Algorithm 1's: e^ε/(e^ε+d−1) on a value's own bin, 1/(e^ε+d−1) elsewhere.
    d = mech.outputs.size
    c = math.exp(eps)
    scaled = mech.matrix * (c + d - 1)
    assert np.all(np.isclose(scaled, 1.0, rtol=1e-12) | np.isclose(scaled, c, rtol=1e-12))
    assert np.all(np.diff(mech.outputs) > 0), "outputs sorted, no duplicates"
    np.testing.assert_allclose(np.sort(fitted.outputs), mech.outputs)
    own = mech.outputs[mech.matrix.argmax(axis=1)]
    np.testing.assert_array_equal(own, fitted.outputs[fitted.assignment])


@pytest.mark.parametrize("loss", LOSSES)
def test_bins_are_contiguous_and_described(loss: Loss) -> None:
    values = np.arange(1.0, 53.0)
    prior = np.random.default_rng(1).dirichlet(np.full(52, 0.7))
    fitted = optimal_bins(values, prior, epsilon=1.5, loss=loss)
    assert fitted.assignment[0] == 0
    assert set(np.diff(fitted.assignment)) <= {0, 1}
    assert fitted.assignment[-1] == fitted.outputs.size - 1
    described = _fit(values, prior, 1.5, loss).describe()
    assert described["name"] == "rr-on-bins"
    assert described["params"]["loss"] == loss
    bins = described["params"]["bins"]
    assert [b["output"] for b in bins] == fitted.outputs.tolist()
    assert bins[0]["lower"] == 1.0 and bins[-1]["upper"] == 52.0


# -- edge cases ---------------------------------------------------------------------


@pytest.mark.parametrize("loss", LOSSES)
def test_single_value(loss: Loss) -> None:
    mech = _fit(np.array([3.0]), np.array([1.0]), 1.0, loss)
    assert mech.outputs.tolist() == [3.0]
    assert mech.matrix.tolist() == [[1.0]]
    expected = 3.0 - 3.0 * math.log(3.0) if loss == "poisson" else 0.0
    fitted = optimal_bins(np.array([3.0]), np.array([1.0]), epsilon=1.0, loss=loss)
    assert fitted.loss == pytest.approx(expected)


@pytest.mark.parametrize("loss", LOSSES)
def test_zero_mass_values_join_a_bin_without_changing_the_optimum(loss: Loss) -> None:
    values = np.array([0.0, 1.0, 2.0, 4.0, 5.0, 7.0, 9.0, 12.0])
    prior = np.array([0.0, 0.3, 0.0, 0.2, 0.0, 0.0, 0.5, 0.0])
    keep = prior > 0
    for eps in (0.5, 2.0, 6.0):
        full = optimal_bins(values, prior, epsilon=eps, loss=loss)
        support = optimal_bins(values[keep], prior[keep], epsilon=eps, loss=loss)
        assert full.loss == pytest.approx(support.loss, rel=1e-12)
        np.testing.assert_allclose(full.outputs, support.outputs)
        assert full.assignment.size == values.size
        assert set(np.diff(full.assignment)) <= {0, 1}
        mech = _fit(values, prior, eps, loss)
        np.testing.assert_allclose(mech.matrix.sum(axis=1), 1.0)
        assert mech.dp_ratio() <= math.exp(eps) * (1 + 1e-12)


def test_poisson_with_all_mass_on_zero() -> None:
    """Σ w y = 0: the infimum of the Poisson loss is at ŷ = 0 (0·log 0 = 0)."""
    fitted = optimal_bins(np.array([0.0]), np.array([1.0]), epsilon=1.0, loss="poisson")
    assert fitted.outputs.tolist() == [0.0]
    assert fitted.loss == 0.0


@pytest.mark.parametrize("loss", LOSSES)
def test_huge_epsilon_is_the_identity_on_the_support(loss: Loss) -> None:
    values = np.array([0.0, 0.5, 2.0, 3.0, 7.5, 10.0, 30.0])
    prior = np.random.default_rng(2).dirichlet(np.full(7, 0.7))
    baseline = optimal_bins(values, prior, epsilon=1e-3, loss=loss).loss
    offset = float(prior @ _g(values)) if loss == "poisson" else 0.0
    for eps in (40.0, 2000.0):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fitted = optimal_bins(values, prior, epsilon=eps, loss=loss)
            mech = _fit(values, prior, eps, loss)
        np.testing.assert_allclose(fitted.outputs, values, atol=1e-12)
        np.testing.assert_array_equal(fitted.assignment, np.arange(7))
        assert abs(fitted.loss + offset) <= 1e-12 * abs(baseline + offset)
        np.testing.assert_allclose(mech.matrix, np.eye(7), atol=1e-15)
        np.testing.assert_allclose(mech.matrix.sum(axis=1), 1.0)
        assert mech.matrix.min() > 0, "never exactly deterministic"


@pytest.mark.parametrize("loss", LOSSES)
def test_tiny_epsilon_collapses_to_the_prior_minimizer(loss: Loss) -> None:
    values = np.array([0.0, 0.5, 2.0, 3.0, 7.5, 10.0, 30.0])
    prior = np.random.default_rng(3).dirichlet(np.full(7, 0.7))
    constant = _partition_loss(values, prior, 1e-6, [0, 7], loss)
    minimizer = _interval_minimizer(values, prior, 0.0, 0, 0, loss)
    offset = float(prior @ _g(values)) if loss == "poisson" else 0.0
    for eps in (1e-3, 1e-6):
        fitted = optimal_bins(values, prior, epsilon=eps, loss=loss)
        # The loss tends to the constant output's; the outputs to the prior's minimizer.
        assert fitted.loss + offset == pytest.approx(constant, rel=10 * eps)
        np.testing.assert_allclose(fitted.outputs, minimizer, atol=30.0 * 10 * eps)
    # Gains shrink like ε², below the 1e-12 tie tolerance: one bin, and for the absolute
    # loss every bin's median is the prior's median well before that.
    assert optimal_bins(values, prior, epsilon=1e-7, loss=loss).outputs.size == 1
    if loss == "absolute":
        assert optimal_bins(values, prior, epsilon=0.05, loss=loss).outputs.tolist() == [minimizer]


def test_matrix_of_algorithm_1() -> None:
    m = rr_on_bins_matrix(np.array([0, 0, 1, 2]), 3, epsilon=math.log(2.0))
    np.testing.assert_allclose(m, np.array([[2, 1, 1], [2, 1, 1], [1, 2, 1], [1, 1, 2]]) / 4)


# -- errors -------------------------------------------------------------------------


def test_rejects_what_it_cannot_do() -> None:
    values, prior = np.array([1.0, 2.0]), np.array([0.5, 0.5])
    with pytest.raises(MechanismError, match="zero-one"):
        _fit(values, prior, 1.0, "zero-one")
    with pytest.raises(MechanismError, match="losses"):
        optimal_bins(values, prior, epsilon=1.0, loss="hinge")  # type: ignore[arg-type]
    with pytest.raises(MechanismError, match="allowed: none"):
        _fit(values, prior, 1.0, "squared", mesh=10)
    with pytest.raises(MechanismError, match="non-negative"):
        optimal_bins(np.array([-1.0, 2.0]), prior, epsilon=1.0, loss="poisson")
    with pytest.raises(MechanismError, match="epsilon"):
        optimal_bins(values, prior, epsilon=0.0)
    with pytest.raises(MechanismError, match="sorted"):
        optimal_bins(np.array([2.0, 1.0]), prior, epsilon=1.0)


@pytest.mark.parametrize("loss", ["squared", "absolute"])
@pytest.mark.parametrize("scale", [1e-300, 1e154, 1e200, 1e307])
def test_the_partition_does_not_depend_on_the_values_scale(loss: Loss, scale: float) -> None:
    """Both losses' bins are scale-invariant, but x² overflowed past 1.5e153: every
    cost was inf and the fit one bin, silently (helper-77). The loss is the unit
    one's times scale² (or scale), inf where that passes the float range."""
    values, prior = np.linspace(-8, 8, 11), np.full(11, 1 / 11)
    unit = optimal_bins(values, prior, epsilon=4.0, loss=loss)
    scaled = optimal_bins(values * scale, prior, epsilon=4.0, loss=loss)
    assert np.array_equal(scaled.assignment, unit.assignment) and unit.outputs.size > 1
    np.testing.assert_allclose(scaled.outputs / scale, unit.outputs, rtol=1e-12)
    power = 2 if loss == "squared" else 1
    with np.errstate(over="ignore", under="ignore"):
        expected = unit.loss * np.float64(scale) ** power
    assert scaled.loss == pytest.approx(expected, rel=1e-12, abs=1e-300)
