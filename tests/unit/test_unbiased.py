"""ε-dbRR, Algorithm 2's grid and the optimal unbiased randomizer (Algorithm 1).

The optimum is checked against the paper's LP written out in full, with every
pairwise DP row ``M[y', o] ≤ e^ε·M[y, o]``, solved here independently with HiGHS.
"""

from __future__ import annotations

import itertools
import math
import time

import highspy
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from label_party.mechanisms.base import (
    FiniteMechanism,
    FitRequest,
    FitTimeLimitError,
    MechanismError,
)
from label_party.mechanisms.registry import fit
from label_party.mechanisms.unbiased import (
    MAX_EPSILON,
    MAX_MESH,
    MIN_EPSILON,
    debiased_rr,
    debiased_rr_from_request,
    default_mesh,
    feasible_output_set,
    from_request,
    optimal_unbiased,
    solve_unbiased,
)

VALUES_IRREGULAR = np.array([0.0, 0.5, 2.0, 3.0, 7.5, 10.0, 30.0])


def _dirichlet(k: int, seed: int, alpha: float = 0.7) -> np.ndarray:
    p = np.random.default_rng(seed).dirichlet(np.full(k, alpha))
    return p / p.sum()


def _point_mass(k: int, i: int) -> np.ndarray:
    p = np.zeros(k)
    p[i] = 1.0
    return p


def _assert_dp(m: np.ndarray, epsilon: float) -> None:
    bound = math.exp(epsilon) * (1 + 1e-12)
    assert np.all(m >= 0)
    assert np.all(m.max(axis=0) <= bound * m.min(axis=0))


def _assert_unbiased(mech: FiniteMechanism) -> None:
    width = mech.inputs[-1] - mech.inputs[0]
    np.testing.assert_allclose(mech.matrix.sum(axis=1), 1.0, atol=1e-12)
    assert np.max(np.abs(mech.matrix @ mech.outputs - mech.inputs)) <= 1e-7 * width


def _all_pairs_lp(values: np.ndarray, prior: np.ndarray, epsilon: float, grid: np.ndarray) -> float:
    """Algorithm 1 as printed: variables M[y, o], all k(k−1)·|O| DP rows."""
    k, n = values.size, grid.size
    e = math.exp(epsilon)
    var = np.arange(k * n).reshape(k, n)  # M[y, o] is variable y·n + o
    rows = []
    rows.append(sp.csr_matrix((np.ones(k * n), (np.repeat(np.arange(k), n), var.ravel()))))
    rows.append(
        sp.csr_matrix(
            (np.tile(grid, k), (np.repeat(np.arange(k), n), var.ravel())), shape=(k, k * n)
        )
    )
    pairs = [(y, z) for y in range(k) for z in range(k) if y != z]
    r = np.arange(len(pairs) * n)
    yy = np.repeat([y for y, _ in pairs], n)
    zz = np.repeat([z for _, z in pairs], n)
    oo = np.tile(np.arange(n), len(pairs))
    dp = sp.csr_matrix(
        (
            np.concatenate([np.ones(r.size), np.full(r.size, -e)]),
            (np.concatenate([r, r]), np.concatenate([var[zz, oo], var[yy, oo]])),
        ),
        shape=(r.size, k * n),
    )
    a = sp.vstack([rows[0], rows[1], dp]).tocsc()
    lp = highspy.HighsLp()
    lp.num_col_ = k * n
    lp.num_row_ = a.shape[0]
    cost = (prior[:, None] * np.square(grid[None, :] - values[:, None])).ravel()
    # HiGHS' dual feasibility tolerance is absolute: with tiny costs (a sparse prior
    # at high ε) it stopped 1.3e-6 above the optimum. Scale the objective to about 1
    # by dividing by the loss of dbRR, which is feasible (Proposition 7) and so of
    # the optimum's order or above.
    scale = debiased_rr(values, epsilon=epsilon).noisy_label_loss(values, prior, "squared")
    lp.col_cost_ = cost / scale
    lp.col_lower_ = np.zeros(k * n)
    lp.col_upper_ = np.full(k * n, highspy.kHighsInf)
    lp.row_lower_ = np.concatenate([np.ones(k), values, np.full(r.size, -highspy.kHighsInf)])
    lp.row_upper_ = np.concatenate([np.ones(k), values, np.zeros(r.size)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = a.indptr.astype(np.int32)
    lp.a_matrix_.index_ = a.indices.astype(np.int32)
    lp.a_matrix_.value_ = a.data.astype(np.float64)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("solver", "simplex")
    h.setOptionValue("primal_feasibility_tolerance", 1e-10)
    h.setOptionValue("dual_feasibility_tolerance", 1e-10)
    h.passModel(lp)
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return float(h.getInfo().objective_function_value) * scale


# -- ε-dbRR -------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 4.0])
@pytest.mark.parametrize("values", [np.arange(1.0, 53.0), VALUES_IRREGULAR, np.array([2.0, 5.0])])
def test_dbrr_is_unbiased_and_dp(values: np.ndarray, epsilon: float) -> None:
    mech = debiased_rr(values, epsilon=epsilon)
    k, e = values.size, math.exp(epsilon)
    # Definition 23, written out independently.
    phi = ((e + k - 1) * values - values.sum()) / (e - 1)
    np.testing.assert_allclose(mech.outputs, phi, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(np.diag(mech.matrix), e / (e + k - 1), rtol=1e-14)
    off = mech.matrix[~np.eye(k, dtype=bool)]
    np.testing.assert_allclose(off, 1 / (e + k - 1), rtol=1e-14)
    _assert_dp(mech.matrix, epsilon)
    _assert_unbiased(mech)
    assert np.max(np.abs(mech.bias())) <= 1e-12 * np.max(np.abs(phi))


def test_dbrr_takes_no_params() -> None:
    request = FitRequest(1.0, VALUES_IRREGULAR, _dirichlet(7, 1), params={"mesh": 3})
    with pytest.raises(MechanismError, match="allowed: none"):
        debiased_rr_from_request(request)


# -- Algorithm 2 --------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 4.0])
@pytest.mark.parametrize("mesh", [2, 3, 52, 416])
def test_feasible_output_set_spans_the_dbrr_outputs(epsilon: float, mesh: int) -> None:
    values = VALUES_IRREGULAR
    grid = feasible_output_set(values, epsilon=epsilon, mesh=mesh)
    phi = debiased_rr(values, epsilon=epsilon).outputs
    assert grid.size == mesh
    assert grid[0] == phi.min() and grid[-1] == phi.max()
    np.testing.assert_allclose(np.diff(grid), (grid[-1] - grid[0]) / (mesh - 1), rtol=1e-9)
    # Algorithm 2's formulas for L and U.
    e, k = math.exp(epsilon), values.size
    lo = ((e + k - 1) * values.min() - values.sum()) / (e - 1)
    hi = ((e + k - 1) * values.max() - values.sum()) / (e - 1)
    np.testing.assert_allclose([grid[0], grid[-1]], [lo, hi], rtol=1e-12)


@pytest.mark.parametrize("mesh", [1, 0, -3, True, 2.5, "8", MAX_MESH + 1])
def test_bad_mesh_is_refused(mesh: object) -> None:
    with pytest.raises(MechanismError, match="mesh"):
        feasible_output_set(VALUES_IRREGULAR, epsilon=1.0, mesh=mesh)  # type: ignore[arg-type]


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 4.0])
def test_lp_is_feasible_at_mesh_2(epsilon: float) -> None:
    values = VALUES_IRREGULAR
    mech = optimal_unbiased(values, _dirichlet(7, 3), epsilon=epsilon, mesh=2)
    _assert_dp(mech.matrix, epsilon)
    _assert_unbiased(mech)
    # Only one unbiased mechanism lives on two points: Proposition 7's.
    lo, hi = feasible_output_set(values, epsilon=epsilon, mesh=2)
    np.testing.assert_allclose(mech.matrix[:, 0], (hi - values) / (hi - lo), rtol=1e-9)


# -- Algorithm 1 --------------------------------------------------------------------

PRIORS = {
    "dirichlet": lambda k: _dirichlet(k, 11),
    "uniform": lambda k: np.full(k, 1.0 / k),
    "point-at-max": lambda k: _point_mass(k, k - 1),
    "sparse": lambda k: _dirichlet(k, 12, alpha=0.05),
}


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 4.0])
@pytest.mark.parametrize("prior_name", sorted(PRIORS))
def test_optimal_unbiased_is_unbiased_and_dp(prior_name: str, epsilon: float) -> None:
    values = np.arange(1.0, 21.0)
    prior = PRIORS[prior_name](values.size)
    prior = prior / prior.sum()
    mech = optimal_unbiased(values, prior, epsilon=epsilon, mesh=80)
    assert mech.name == "unbiased"
    _assert_dp(mech.matrix, epsilon)
    _assert_unbiased(mech)
    assert np.all(mech.matrix.max(axis=0) > 0), "unused outputs are dropped"
    assert np.all(np.isin(mech.outputs, feasible_output_set(values, epsilon=epsilon, mesh=80)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(st.integers(-10, 30), min_size=2, max_size=6, unique=True),
    weights=st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),
    epsilon=st.sampled_from([0.1, 0.5, 1.0, 2.0, 4.0, 8.0]),
    mesh=st.integers(2, 30),
)
def test_loss_equals_the_all_pairs_lp(
    values: list[int], weights: list[float], epsilon: float, mesh: int
) -> None:
    v = np.sort(np.asarray(values, dtype=np.float64))
    w = np.asarray(weights[: v.size]) + 1e-3
    prior = w / w.sum()
    grid = feasible_output_set(v, epsilon=epsilon, mesh=mesh)
    expected = _all_pairs_lp(v, prior, epsilon, grid)
    mech = optimal_unbiased(v, prior, epsilon=epsilon, mesh=mesh)
    got = mech.noisy_label_loss(v, prior, "squared")
    assert got == pytest.approx(expected, rel=1e-7)
    _assert_dp(mech.matrix, epsilon)
    _assert_unbiased(mech)


def test_loss_equals_the_all_pairs_lp_fixed_case() -> None:
    values = VALUES_IRREGULAR[:6]
    prior = _dirichlet(6, 5)
    grid = feasible_output_set(values, epsilon=1.0, mesh=30)
    sol = solve_unbiased(values, prior, epsilon=1.0, outputs=grid)
    expected = _all_pairs_lp(values, prior, 1.0, grid)
    assert sol.loss == pytest.approx(expected, rel=1e-7)
    assert sol.lower_bound <= sol.loss * (1 + 1e-12)
    assert sol.loss - sol.lower_bound <= 1e-9 * sol.loss
    # A wrong mechanism would not pass: dbRR is feasible for the LP but worse here.
    dbrr = debiased_rr(values, epsilon=1.0).noisy_label_loss(values, prior, "squared")
    assert dbrr > expected * (1 + 1e-3)


@pytest.mark.parametrize("epsilon", [6.0, 8.0, 10.0])
@pytest.mark.parametrize("alpha", [0.7, 0.05])
def test_high_epsilon_equals_the_all_pairs_lp(alpha: float, epsilon: float) -> None:
    # High ε: e^ε in the thousands in the coupling rows, many outputs used, cells
    # of the restricted LP added over several rounds. Still the LP's optimum.
    values = np.arange(0.0, 8.0)
    prior = _dirichlet(values.size, 11, alpha=alpha)
    grid = feasible_output_set(values, epsilon=epsilon, mesh=40)
    sol = solve_unbiased(values, prior, epsilon=epsilon, outputs=grid)
    expected = _all_pairs_lp(values, prior, epsilon, grid)
    assert sol.loss == pytest.approx(expected, rel=1e-7)
    assert sol.lower_bound <= expected * (1 + 1e-9)
    _assert_dp(sol.matrix, epsilon)
    width = values[-1] - values[0]
    assert np.max(np.abs(sol.matrix @ sol.outputs - values)) <= 1e-7 * width
    np.testing.assert_allclose(sol.matrix.sum(axis=1), 1.0, atol=1e-12)


def test_high_epsilon_on_a_wide_grid_is_certified_optimal() -> None:
    # The shape of the slow case (ε = 8, a sparse noisy prior, many outputs used),
    # small enough for a unit test: the certified gap is what proves optimality.
    values = np.arange(0.0, 240.0, 4.0)
    prior = _dirichlet(values.size, 21, alpha=0.3)
    mech = optimal_unbiased(values, prior, epsilon=8.0)
    _assert_dp(mech.matrix, 8.0)
    _assert_unbiased(mech)
    sol = solve_unbiased(
        values, prior, epsilon=8.0, outputs=feasible_output_set(values, epsilon=8.0, mesh=240)
    )
    assert sol.loss - sol.lower_bound <= 1e-9 * sol.loss
    assert sol.outputs.size > 20  # near-identity regime: many outputs, not a handful
    assert sol.rounds < 40


def test_loss_decreases_as_epsilon_grows_on_a_fixed_output_set() -> None:
    values = np.arange(0.0, 12.0)
    prior = _dirichlet(values.size, 9)
    grid = feasible_output_set(values, epsilon=0.25, mesh=200)  # feasible for all ε ≥ 0.25
    losses = [
        solve_unbiased(values, prior, epsilon=eps, outputs=grid).loss
        for eps in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    ]
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(losses))
    assert losses[-1] < losses[0] / 10


def test_grid_plus_dbrr_is_never_worse_than_dbrr() -> None:
    values = np.arange(1.0, 11.0)
    prior = _dirichlet(values.size, 4)
    mech = optimal_unbiased(values, prior, epsilon=6.0, mesh=3, output_set="grid+dbrr")
    dbrr = debiased_rr(values, epsilon=6.0)
    assert mech.noisy_label_loss(values, prior, "squared") <= dbrr.noisy_label_loss(
        values, prior, "squared"
    ) * (1 + 1e-9)
    _assert_unbiased(mech)


def test_infeasible_output_set_is_refused() -> None:
    values = np.arange(0.0, 5.0)
    narrow = np.linspace(-1.0, 5.0, 20)  # far inside [L, U]: no ε=1 unbiased mechanism
    with pytest.raises(MechanismError, match="infeasible"):
        solve_unbiased(values, np.full(5, 0.2), epsilon=1.0, outputs=narrow)


def test_a_deadline_stops_the_lp_and_a_distant_one_changes_nothing() -> None:
    """A fit over 1,000 values takes seconds (minutes past a few thousand): a preview
    bounds it by a deadline, checked by HiGHS within a solve and between rounds."""
    values = np.linspace(0.0, 1.0, 1000)
    prior = np.full(1000, 1e-3)
    start = time.monotonic()
    with pytest.raises(FitTimeLimitError, match="time allowed"):
        optimal_unbiased(values, prior, epsilon=1.0, deadline=start + 0.2)
    with pytest.raises(FitTimeLimitError):  # already past: no solve at all
        optimal_unbiased(values, prior, epsilon=1.0, deadline=start - 1)
    small, p = np.arange(0.0, 8.0), np.full(8, 0.125)
    bounded = optimal_unbiased(small, p, epsilon=1.0, deadline=time.monotonic() + 3600)
    free = optimal_unbiased(small, p, epsilon=1.0)
    assert np.array_equal(bounded.matrix, free.matrix)
    with pytest.raises(FitTimeLimitError):  # the registry passes it on
        fit("unbiased", epsilon=1.0, values=values, prior=prior, deadline=start - 1)


def test_above_its_epsilon_ceiling_unbiased_is_refused_and_auto_picks_dbrr() -> None:
    """A reviewer's prior: at ε = 20 the uniform prior's fit (a release's free
    preflight) passed and this one failed ("not a transition matrix") after the
    budget was reserved. Past MAX_EPSILON the refusal depends on ε alone."""
    values = np.arange(20.0)
    counts = np.array([5015, 4532, 4066, 3681, 3347, 3047, 2767, 2484, 2255, 2029, 1850,
                       1674, 1487, 1389, 1229, 1105, 1010, 916, 793, 736.0])  # fmt: skip
    for prior in (np.full(20, 0.05), counts / counts.sum()):
        with pytest.raises(MechanismError, match="not solved reliably above ε = 12"):
            fit("unbiased", epsilon=20.0, values=values, prior=prior)
        chosen = fit("auto", epsilon=20.0, values=values, prior=prior, loss="squared")
        assert isinstance(chosen, FiniteMechanism) and chosen.name == "debiased-rr"
        assert "above ε = 12" in chosen.params["reason"]
        _assert_unbiased(chosen)
    at_ceiling = fit("auto", epsilon=MAX_EPSILON, values=values, prior=counts / counts.sum(),
                     loss="squared")  # fmt: skip
    assert isinstance(at_ceiling, FiniteMechanism) and at_ceiling.name == "unbiased"
    _assert_dp(at_ceiling.matrix, MAX_EPSILON)


def _noisy_prior(k: int, seed: int) -> np.ndarray:
    """A release's prior at a tiny ε₁: 400 labels' counts under Laplace noise."""
    rng = np.random.default_rng(seed)
    counts = np.bincount(rng.integers(0, k, 400), minlength=k).astype(float)
    noisy = np.maximum(counts + rng.laplace(0, 2 / 5e-7, k), 0)
    return noisy / noisy.sum() if noisy.sum() > 0 else np.full(k, 1 / k)


def test_below_its_epsilon_floor_unbiased_is_refused_for_free_and_auto_picks_dbrr() -> None:
    """At ε = 5·10⁻⁷ (k = 101, mesh 2) the uniform prior's fit, a release's free
    preflight, passed and half of the noisy priors a release fits failed the
    unbiasedness check after the budget was reserved (helper-87). Below MIN_EPSILON
    the refusal depends on ε alone; at it, those priors fit."""
    values = np.linspace(0.0, 10.0, 101)
    for prior in (np.full(101, 1 / 101), _noisy_prior(101, 0)):
        with pytest.raises(MechanismError, match=r"not solved reliably below ε = 0\.001"):
            optimal_unbiased(values, prior, epsilon=5e-7, mesh=2)
        chosen = fit("auto", epsilon=5e-7, values=values, prior=prior, loss="squared")
        assert isinstance(chosen, FiniteMechanism) and chosen.name == "debiased-rr"
        assert "below ε = 0.001" in chosen.params["reason"]
    for k in (101, 1001):  # 1001 values failed up to ε = 3·10⁻⁵
        grid = np.linspace(0.0, 10.0, k)
        for seed in range(3):
            mech = optimal_unbiased(grid, _noisy_prior(k, seed), epsilon=MIN_EPSILON, mesh=2)
            _assert_dp(mech.matrix, MIN_EPSILON)
    assert fit("auto", epsilon=MIN_EPSILON, values=values, prior=_noisy_prior(101, 1),
               loss="squared").name == "unbiased"  # fmt: skip


def test_single_value_is_returned_as_is() -> None:
    mech = optimal_unbiased(np.array([3.0]), np.array([1.0]), epsilon=1.0, mesh=10)
    assert mech.outputs.tolist() == [3.0]
    assert mech.matrix.tolist() == [[1.0]]


# -- the registry entry points -----------------------------------------------------


def test_from_request_records_its_params() -> None:
    values = VALUES_IRREGULAR
    mech = fit("unbiased", epsilon=1.0, values=values, prior=_dirichlet(7, 2))
    assert isinstance(mech, FiniteMechanism)
    assert mech.params == {
        "mesh": default_mesh(values.size),
        "output_set": "grid",
        "objective": "squared",
    }
    # The training loss does not change the objective (g = ℓ_sq, §3.1).
    other = fit("unbiased", epsilon=1.0, values=values, prior=_dirichlet(7, 2), loss="poisson")
    assert isinstance(other, FiniteMechanism)
    np.testing.assert_allclose(other.matrix, mech.matrix)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"mesh": 1}, "mesh"),
        ({"mesh": "40"}, "mesh"),
        ({"output_set": "staircase"}, "output_set"),
        ({"output_set": 3}, "output_set"),
        ({"grid": 5}, "unknown parameter"),
    ],
)
def test_from_request_refuses_bad_params(params: dict[str, object], match: str) -> None:
    request = FitRequest(1.0, VALUES_IRREGULAR, _dirichlet(7, 1), params=params)
    with pytest.raises(MechanismError, match=match):
        from_request(request)


def test_dense_matrices_are_bounded_where_they_travel() -> None:
    """debiased-rr's K×K matrix: refused past 4096 values (a reviewer's 6000-value
    preview peaked at 4.5 GB); left out of previews past 10⁶ entries and out of
    descriptions (every release's manifest) past 250,000 (2001 values: 84 MB each)."""
    from label_party.mechanisms.base import DESCRIBED_MATRIX_MAX_ENTRIES
    from label_party.mechanisms.preview import PREVIEW_MAX_MATRIX_ENTRIES, preview
    from label_party.mechanisms.unbiased import DEBIASED_RR_MAX_VALUES

    with pytest.raises(MechanismError, match="at most 4096 values"):
        debiased_rr(np.arange(DEBIASED_RR_MAX_VALUES + 1, dtype=float), epsilon=1.0)
    small = debiased_rr(np.arange(500, dtype=float), epsilon=1.0)
    assert small.matrix.size == DESCRIBED_MATRIX_MAX_ENTRIES
    assert small.describe()["matrix"] is not None
    large = debiased_rr(np.arange(501, dtype=float), epsilon=1.0)
    described = large.describe()
    assert described["matrix"] is None and len(described["outputs"]) == 501
    for k, shown in ((1000, True), (1001, False)):
        assert (k * k <= PREVIEW_MAX_MATRIX_ENTRIES) == shown
        values = list(range(k))
        out = preview(mechanism="debiased-rr", epsilon=1.0, values=values, prior=[1 / k] * k)
        assert (out["matrix"] is not None) == shown and (out["outputs"] is not None) == shown
        assert out["max_abs_bias"] < 1e-6  # still computed from the fitted mechanism


def test_a_preview_refuses_two_different_meshes() -> None:
    """``mesh`` and ``params.mesh`` together: the top-level one silently won (helper-70)."""
    from label_party.mechanisms.preview import preview

    ask = {"mechanism": "unbiased", "epsilon": 1.0, "values": [0.0, 1.0], "prior": [0.5, 0.5]}
    with pytest.raises(MechanismError, match="mesh is given twice"):
        preview(**ask, mesh=8, params={"mesh": 16})
    assert preview(**ask, mesh=8, params={"mesh": 8})["outputs"] is not None


def test_a_domain_far_from_zero_is_checked_for_bias_around_its_centre() -> None:
    """On [6e9, 6e9 + 10] the products' rounding alone (2e-6) passed the 1e-7 · width
    tolerance: 55 of 150 priors failed "not unbiased" at ε = 4 while the uniform
    prior (a release's free preflight) passed, so those releases failed after their
    charge (helper-77)."""
    values = np.linspace(6e9, 6e9 + 10, 11)
    rng = np.random.default_rng(0)
    for _ in range(12):
        prior = rng.dirichlet(np.full(11, 0.5))
        fitted = optimal_unbiased(values, prior, epsilon=4.0)
        centre = 6e9 + 5
        bias = fitted.matrix @ (fitted.outputs - centre) - (values - centre)
        assert np.max(np.abs(bias)) < 1e-9 * 10
        _assert_dp(fitted.matrix, 4.0)


@pytest.mark.parametrize(
    ("values", "prior", "epsilon"),
    [
        (np.arange(3.0), np.array([5.0, 2, 1]) / 8, 15.65),
        (np.array([0.0, 500, 1000]), np.array([5.0, 2, 1]) / 8, 15.47836015960458),
        (np.arange(6.0), np.array([0.329814109275391, 0.07444746055978528,
                                   0.14893573991693346, 0.046129703533974005,
                                   0.3794644149202634, 0.021208571793652774]),
         13.059025760366737),
    ],
)  # fmt: skip
def test_priors_highs_cannot_solve_are_past_the_ceiling_and_refused_for_free(
    values: np.ndarray, prior: np.ndarray, epsilon: float
) -> None:
    """HiGHS answered "Solve error" or "Unknown" for these priors below the old
    ceiling of 16 (the lowest at ε = 13.06), after a release's preflight on the
    uniform prior passed: a charge for nothing (helper-77). 12 is below them all."""
    with pytest.raises(MechanismError, match="not solved reliably above ε = 12"):
        optimal_unbiased(values, prior, epsilon=epsilon)
