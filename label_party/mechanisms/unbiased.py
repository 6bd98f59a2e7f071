"""Unbiased label randomizers for regression: ε-dbRR and the optimal unbiased LP.

Source: Badanidiyuru et al., "Optimal Unbiased Randomizers for Regression with
Label Differential Privacy" (``optimal-unbiased-randomizers.txt``).

* :func:`debiased_rr` — ε-dbRR, Definition 23 (Appendix F): randomized response over
  the points ``Φ(y) = ((e^ε + k − 1)·y − Σ_y' y') / (e^ε − 1)``, which makes
  ``E[M(y)] = y`` exactly.
* :func:`feasible_output_set` — Algorithm 2 (FeasibleOutputSet, §3.1): ``mesh``
  evenly spaced outputs between the smallest and largest dbRR output.
* :func:`optimal_unbiased` — Algorithm 1 (ComputeOptUnbiasedRand, §3.1): the ε-DP
  randomizer onto a finite output set that minimizes the expected squared error
  ``Σ_y p_y Σ_o M[y, o]·(o − y)²`` subject to ``E[M(y)] = y`` for every ``y``.

Neighbouring relation: two datasets differ in the label of one example
(feature-oblivious label DP). Each mechanism is ε-DP in that relation and spends ε
per release. The optimal unbiased randomizer is fitted to a prior, which must itself
be ε₁-DP and charged separately (DESIGN.md §3.2); fitting is post-processing of it.

The objective is the squared error ``g = ℓ_sq`` whatever the training loss, as in
the paper (§3.1: "we will only consider g = ℓ_sq henceforth (irrespective of the
training loss ℓ)"); unbiasedness is what makes the noisy labels useful for training
(Theorem 5, §2), so ``request.loss`` does not change the mechanism.

How the LP is solved
--------------------
The paper's LP has ``k·|O|`` variables and ``k(k−1)·|O|`` pairwise DP rows
``M[y', o] ≤ e^ε·M[y, o]``. We write ``M[y, o] = m_o + s[y, o]`` with
``0 ≤ s[y, o] ≤ (e^ε − 1)·m_o``: the column of output ``o`` is ε-DP exactly when it
has this form (``m_o`` is its minimum), so this is the same LP with ``k·|O|`` DP rows.
The dense coupling of ``m_o`` to every row-sum and unbiasedness row is removed with
two free aggregate variables ``T = Σ_o m_o`` and ``T₁ = Σ_o o·m_o``.

The optimum uses few outputs (at most ``2k``, Theorem 6; 14 of 416 grid points for
the 52-week example, 5 of 401 for a 0..400 count label), so the LP is solved by
column generation over outputs:

1. solve the LP on a small subset of the grid (4 evenly spaced points, which
   include both ends, so it is feasible: Proposition 7);
2. with the duals ``λ_y`` (row sums) and ``μ_y`` (unbiasedness) and
   ``r_y(o) = p_y (o − y)² − λ_y − μ_y·o``, the most negative reduced cost of output
   ``o`` per unit of ``m_o`` is ``ρ(o) = Σ_y r_y(o) + (e^ε − 1)·Σ_y min(r_y(o), 0)``
   (its best column is the staircase pattern that puts ``s`` at its upper bound
   where ``r_y(o) < 0``; Appendix B, Claim 12) — one vectorized ``k × |O|`` pass;
3. any feasible mechanism has ``Σ_o m_o ≤ 1``, so ``Σ_y λ_y + Σ_y μ_y·y + min(0,
   min_o ρ(o))`` is a lower bound on the LP over the *whole* grid. Stop when the
   objective is within ``rel_gap`` of it; otherwise add the local minima of ``ρ``
   that are negative, drop outputs the current optimum does not use, and repeat.

The result is the optimum of the paper's LP over the whole grid (certified by the
bound), not a heuristic (``rel_gap`` 1e-10; tests compare it with the all-pairs LP).
The restricted LPs use HiGHS' dual simplex with 1e-10 feasibility tolerances:
measured while building this (2 cores), on the compact LP of the full 416-point
52-value grid it took 4.8 s against 19.8 s for interior point, and on a 39-output
restricted LP of the 0..400 example 3.8 s against 105 s for primal simplex and
13.6 s for interior point (which ended "Unknown"). Column generation over
(output, pattern) columns with a 2k-row master was tried first and abandoned: its
master is massively degenerate and needed over a thousand rounds.

Finally the solution is repaired so that the returned matrix is exactly ε-DP: the
vertex is refined with the pattern of every ``s[y, o]`` (at 0, at its bound, or in
between) held fixed so that the equalities hold to rounding, ``s`` is clipped into
``[0, (e^ε − 1)·m_o]``, and each column is clamped to ``e^ε·min``; rows are not
rescaled afterwards. :func:`_check` refuses any result that is not a transition
matrix, unbiased to ``1e-7·(max − min)`` and ε-DP to ``1e-13`` relative.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np
from numpy.typing import NDArray

from label_party.mechanisms.base import (
    FiniteMechanism,
    FitRequest,
    FloatArray,
    MechanismError,
    check_epsilon,
    validate_prior,
)

#: Default grid size: Algorithm 2 with ``n = 4·k`` (at least 64).
DEFAULT_MESH_PER_VALUE = 4
MIN_DEFAULT_MESH = 64
#: Largest grid accepted, so that a request cannot ask for unbounded work.
MAX_MESH = 1 << 16
#: Output-set strategies: Algorithm 2's grid, or that grid together with the dbRR
#: outputs (so that the optimum is never worse than ε-dbRR).
OUTPUT_SETS = ("grid", "grid+dbrr")
#: Relative optimality gap at which column generation stops.
DEFAULT_REL_GAP = 1e-10
#: Column generation gives up (MechanismError) after this many rounds.
MAX_ROUNDS = 500

_PARAMS = frozenset({"mesh", "output_set"})
#: Outputs in the first restricted LP.
_INITIAL_OUTPUTS = 4
#: At most this many outputs are added per round.
_ADD_PER_ROUND = 32
#: Pricing works on at most this many (value, output) cells at a time.
_PRICE_CELLS = 1 << 20
#: Relative tolerance that classifies ``s[y, o]`` as at a bound during the repair.
_AT_BOUND = 1e-9
_INF = highspy.kHighsInf


# -- ε-dbRR (Definition 23) -------------------------------------------------------


def _checked_values(values: FloatArray) -> FloatArray:
    v = np.asarray(values, dtype=np.float64)
    uniform = np.full(v.shape, 1.0 / max(v.size, 1))
    checked, _ = validate_prior(v, uniform)
    return checked


def dbrr_outputs(values: FloatArray, *, epsilon: float) -> FloatArray:
    """Φ(y) of ε-dbRR for each value (Definition 23), increasing in y.

    ``Φ(y) = ((e^ε + k − 1)·y − Σ_y' y') / (e^ε − 1)``, computed with ``expm1`` so
    that a small ε keeps its precision.
    """
    eps = check_epsilon(epsilon)
    v = _checked_values(values)
    if v.size == 1:
        return v.copy()  # Φ(y) = y; avoid the rounding of (e^ε − 1)·y / (e^ε − 1)
    em1 = math.expm1(eps)
    phi: FloatArray = ((em1 + v.size) * v - v.sum()) / em1
    return phi


def debiased_rr(values: FloatArray, *, epsilon: float) -> FiniteMechanism:
    """ε-dbRR (Definition 23): randomized response over ``(Φ(y))_y``.

    ``P[Φ(y) | y] = e^ε/(e^ε + k − 1)`` and every other ``Φ(y')`` has probability
    ``1/(e^ε + k − 1)``; unbiased because ``Σ_y Φ(y) = Σ_y y``. ε-DP when one label
    changes; spends ε; uses no prior.
    """
    eps = check_epsilon(epsilon)
    v = _checked_values(values)
    k = v.size
    e = math.exp(eps)
    matrix = np.full((k, k), 1.0 / (e + k - 1))
    np.fill_diagonal(matrix, e / (e + k - 1))
    return FiniteMechanism(
        name="debiased-rr",
        epsilon=eps,
        inputs=v.copy(),
        outputs=dbrr_outputs(v, epsilon=eps),
        matrix=matrix,
        params={},
    )


def debiased_rr_from_request(request: FitRequest) -> FiniteMechanism:
    """Registry factory for ``debiased-rr``; it takes no parameters."""
    if request.params:
        unknown = ", ".join(sorted(map(str, request.params)))
        raise MechanismError(f"debiased-rr takes no parameters, got: {unknown}")
    return debiased_rr(request.values, epsilon=request.epsilon)


# -- Algorithm 2 --------------------------------------------------------------------


def _check_mesh(mesh: object) -> int:
    if isinstance(mesh, bool) or not isinstance(mesh, int | np.integer) or mesh < 2:
        raise MechanismError(f"mesh must be an integer >= 2, got {mesh!r}")
    if mesh > MAX_MESH:
        raise MechanismError(f"mesh must be at most {MAX_MESH}, got {mesh}")
    return int(mesh)


def feasible_output_set(values: FloatArray, *, epsilon: float, mesh: int) -> FloatArray:
    """FeasibleOutputSet (Algorithm 2): ``mesh`` evenly spaced points on ``[L, U]``.

    ``L = Φ(min Y)`` and ``U = Φ(max Y)`` are the smallest and largest ε-dbRR
    outputs; both are included exactly. Algorithm 1 is feasible on this set
    (Proposition 7). A single label value ``y`` gives the one-point set ``{y}``.
    """
    n = _check_mesh(mesh)
    phi = dbrr_outputs(values, epsilon=epsilon)
    if phi.size == 1:
        return phi
    grid: FloatArray = np.linspace(phi[0], phi[-1], n)
    grid[0], grid[-1] = phi[0], phi[-1]
    return grid


# -- Algorithm 1 --------------------------------------------------------------------


@dataclass(frozen=True)
class UnbiasedSolution:
    """The LP optimum and how it was found.

    ``outputs``/``matrix`` keep only the outputs the optimum uses. ``loss`` is
    ``Σ_y p_y E[(M(y) − y)²]`` of the returned (repaired) matrix; ``lower_bound`` is
    a certified lower bound on the LP optimum over the whole output set, so
    ``loss − lower_bound`` bounds the suboptimality.
    """

    outputs: FloatArray
    matrix: FloatArray
    loss: float
    lower_bound: float
    grid_size: int
    rounds: int


@dataclass(frozen=True)
class _Restricted:
    objective: float
    lam: FloatArray
    mu: FloatArray
    m: FloatArray  # (n,)
    s: FloatArray  # (n, k)


def _solve_restricted(
    v_hat: FloatArray, prior: FloatArray, o_hat: FloatArray, em1: float
) -> _Restricted:
    """The LP on outputs ``o_hat`` (normalized coordinates), with HiGHS dual simplex.

    Columns: ``T``, ``T₁``, ``m_o`` (n), ``s[o, y]`` (n·k, o-major). Rows: row sums
    (k), unbiasedness (k), ``T = Σ m``, ``T₁ = Σ o·m``, coupling ``s − (e^ε−1)m ≤ 0``.
    """
    k, n = v_hat.size, o_hat.size
    ys = np.arange(k)
    r_t, r_t1 = 2 * k, 2 * k + 1
    coupling = 2 * k + 2 + np.arange(n)[:, None] * k + ys[None, :]  # (n, k)
    m_index = np.concatenate(
        [np.full((n, 1), r_t), np.full((n, 1), r_t1), coupling], axis=1
    ).ravel()
    m_value = np.concatenate(
        [np.ones((n, 1)), o_hat[:, None], np.full((n, k), -em1)], axis=1
    ).ravel()
    s_index = np.stack([np.broadcast_to(ys, (n, k)), k + np.broadcast_to(ys, (n, k)), coupling], 2)
    s_value = np.stack(
        [np.ones((n, k)), np.broadcast_to(o_hat[:, None], (n, k)), np.ones((n, k))], 2
    )
    index = np.concatenate([ys, [r_t], k + ys, [r_t1], m_index, s_index.ravel()]).astype(np.int32)
    value = np.concatenate([np.ones(k), [-1.0], np.ones(k), [-1.0], m_value, s_value.ravel()])
    lengths = np.concatenate([[k + 1, k + 1], np.full(n, k + 2), np.full(n * k, 3)])
    cost_yo = prior[:, None] * np.square(o_hat[None, :] - v_hat[:, None])  # (k, n)
    ncol, nrow = 2 + n + n * k, 2 * k + 2 + n * k

    lp = highspy.HighsLp()
    lp.num_col_ = ncol
    lp.num_row_ = nrow
    lp.col_cost_ = np.concatenate([[0.0, 0.0], cost_yo.sum(axis=0), cost_yo.T.ravel()])
    lp.col_lower_ = np.concatenate([[-_INF, -_INF], np.zeros(n + n * k)])
    lp.col_upper_ = np.full(ncol, _INF)
    rhs = np.concatenate([np.ones(k), v_hat, [0.0, 0.0]])
    lp.row_lower_ = np.concatenate([rhs, np.full(n * k, -_INF)])
    lp.row_upper_ = np.concatenate([rhs, np.zeros(n * k)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value

    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("solver", "simplex")
    h.setOptionValue("primal_feasibility_tolerance", 1e-10)
    h.setOptionValue("dual_feasibility_tolerance", 1e-10)
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise MechanismError(
            "the unbiased-randomizer LP was not solved to optimality "
            f"(HiGHS: {h.modelStatusToString(status)})"
        )
    sol = h.getSolution()
    x = np.asarray(sol.col_value, dtype=np.float64)
    duals = np.asarray(sol.row_dual, dtype=np.float64)
    return _Restricted(
        objective=float(h.getInfo().objective_function_value),
        lam=duals[:k].copy(),
        mu=duals[k : 2 * k].copy(),
        m=x[2 : 2 + n].copy(),
        s=x[2 + n :].reshape(n, k).copy(),
    )


def _price(
    v_hat: FloatArray,
    prior: FloatArray,
    o_hat: FloatArray,
    lam: FloatArray,
    mu: FloatArray,
    em1: float,
) -> FloatArray:
    """ρ(o): the best reduced cost of output ``o`` per unit of ``m_o``."""
    k, n = v_hat.size, o_hat.size
    out = np.empty(n)
    step = max(1, _PRICE_CELLS // k)
    for start in range(0, n, step):
        o = o_hat[start : start + step]
        r = prior[:, None] * np.square(o[None, :] - v_hat[:, None])
        r -= lam[:, None]
        r -= mu[:, None] * o[None, :]
        out[start : start + step] = r.sum(axis=0) + em1 * np.minimum(r, 0.0).sum(axis=0)
    return out


def _two_point_is_dp(values: FloatArray, a: float, b: float, e: float) -> bool:
    """Is the unbiased mechanism on ``{a, b}`` ε-DP? (Feasibility, Proposition 7.)"""
    if not (a < values[0] and values[-1] < b):
        return False
    ratio = max((b - values[0]) / (b - values[-1]), (values[-1] - a) / (values[0] - a))
    return bool(ratio <= e * (1 + 1e-9))


def solve_unbiased(
    values: FloatArray,
    prior: FloatArray,
    *,
    epsilon: float,
    outputs: FloatArray,
    rel_gap: float = DEFAULT_REL_GAP,
) -> UnbiasedSolution:
    """ComputeOptUnbiasedRand (Algorithm 1) with ``g = ℓ_sq`` over ``outputs``.

    The LP is feasible exactly when the unbiased two-point mechanism on the
    smallest and largest output is ε-DP (averaging any feasible mechanism onto those
    two points gives it; Proposition 7 for Algorithm 2's grid). Raises
    :class:`MechanismError` when it is not, when HiGHS does not report an optimum, or
    when column generation does not converge.
    """
    eps = check_epsilon(epsilon)
    v, p = validate_prior(values, prior)
    grid = np.unique(np.asarray(outputs, dtype=np.float64))
    if grid.size == 0 or not np.all(np.isfinite(grid)):
        raise MechanismError("the output set must hold finite numbers")
    k, n = v.size, grid.size
    e, em1 = math.exp(eps), math.expm1(eps)
    if k == 1:
        if not np.any(grid == v[0]):
            raise MechanismError("the unbiased LP is infeasible: one value needs itself as output")
        return UnbiasedSolution(v.copy(), np.ones((1, 1)), 0.0, 0.0, n, 0)
    a, b = float(grid[0]), float(grid[-1])
    if n < 2 or not _two_point_is_dp(v, a, b, e):
        raise MechanismError(
            "the unbiased LP is infeasible on this output set at this epsilon; "
            "use the Algorithm 2 grid (output_set='grid')"
        )

    # Normalized coordinates: the output set spans [-1, 1].
    center, half = 0.5 * (a + b), 0.5 * (b - a)
    o_hat = (grid - center) / half
    v_hat = (v - center) / half

    current = np.unique(np.round(np.linspace(0, n - 1, min(n, _INITIAL_OUTPUTS))).astype(np.int64))
    lower = -math.inf
    previous = math.inf
    drop = True
    rounds = 0
    while True:
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise MechanismError(
                f"the unbiased LP did not converge in {MAX_ROUNDS} column-generation rounds"
            )
        sol = _solve_restricted(v_hat, p, o_hat[current], em1)
        rho = _price(v_hat, p, o_hat, sol.lam, sol.mu, em1)
        dual = float(sol.lam.sum() + sol.mu @ v_hat)
        lower = max(lower, dual + min(0.0, float(rho.min())))
        rho[current] = np.maximum(rho[current], 0.0)  # in the LP already: never re-added
        if sol.objective - lower <= rel_gap * abs(sol.objective):
            break
        neg = rho < -0.01 * rel_gap * abs(sol.objective)
        left = np.concatenate([[np.inf], rho[:-1]])
        right = np.concatenate([rho[1:], [np.inf]])
        cand = np.flatnonzero(neg & (rho <= left) & (rho <= right))
        if cand.size == 0:
            break
        cand = cand[np.argsort(rho[cand], kind="stable")][:_ADD_PER_ROUND]
        # Dropping unused outputs keeps the LP small; stop dropping if a round fails
        # to improve, which rules out cycling.
        if sol.objective >= previous * (1 - 1e-12):
            drop = False
        previous = sol.objective
        kept = current[sol.m > 0] if drop else current
        current = np.union1d(kept, cand)

    matrix, used = _repair(sol, v_hat, o_hat[current], em1, e)
    out = grid[current][used]
    loss = float(p @ (matrix * np.square(out[None, :] - v[:, None])).sum(axis=1))
    _check(matrix, out, v, e)
    return UnbiasedSolution(
        outputs=out,
        matrix=matrix,
        loss=loss,
        lower_bound=lower * half * half,
        grid_size=n,
        rounds=rounds,
    )


def _repair(
    sol: _Restricted, v_hat: FloatArray, o_hat: FloatArray, em1: float, e: float
) -> tuple[FloatArray, NDArray[np.int64]]:
    """An exactly ε-DP matrix on the used outputs, refined to satisfy the equalities.

    Keeps the vertex's pattern (each ``s[y, o]`` at 0, at ``(e^ε−1)·m_o``, or free),
    corrects ``m`` and the free ``s`` so that the 2k equalities hold to rounding
    (:func:`_refine`), clips ``s`` back into ``[0, (e^ε−1)·m_o]`` and clamps each
    column to ``e^ε·min``. No row is rescaled afterwards, so the DP ratio is exact.
    """
    m = np.maximum(sol.m, 0.0)
    used = np.flatnonzero(m > 0)
    m = m[used]
    s = np.clip(sol.s[used], 0.0, None)
    o = o_hat[used]
    cap = em1 * m[:, None]
    upper = s >= (1 - _AT_BOUND) * cap
    free = ~upper & (s > _AT_BOUND * cap)
    fo, fy = np.nonzero(free)
    shape_m: FloatArray = np.where(upper, 1.0 + em1, 1.0)  # (u, k): m_o's row-sum column
    m, s_free = _refine(shape_m, o, fo, fy, m, s[fo, fy], v_hat)
    m = np.maximum(m, 0.0)
    s_new = np.where(upper, em1 * m[:, None], 0.0)
    s_new[fo, fy] = np.clip(s_free, 0.0, em1 * m[fo])
    matrix: FloatArray = (m[:, None] + s_new).T  # (k, u)
    keep = matrix.max(axis=0) > 0
    matrix = matrix[:, keep]
    matrix = np.ascontiguousarray(np.minimum(matrix, e * matrix.min(axis=0)[None, :]))
    return matrix, used[keep]


def _refine(
    shape_m: FloatArray,
    o: FloatArray,
    fo: NDArray[np.int64],
    fy: NDArray[np.int64],
    m: FloatArray,
    s_free: FloatArray,
    v_hat: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Small correction of ``(m, s_free)`` so that rows sum to 1 and means are ``v_hat``.

    The free ``s[o, y]`` of value ``y`` appear only in y's two equations, so: first
    ``m`` absorbs what the free entries of a row cannot (rows with fewer than two
    free entries; a min-norm solve with ``|used|`` unknowns), then each row fixes
    its residual with its own free entries (a 2×2 solve per row). Two passes.
    """
    k = v_hat.size
    a_sum = shape_m.T  # (k, u)
    a_mean = (shape_m * o[:, None]).T
    fo_hat = o[fo]
    count = np.bincount(fy, minlength=k).astype(np.float64)
    s1 = np.bincount(fy, weights=fo_hat, minlength=k)
    s2 = np.bincount(fy, weights=fo_hat * fo_hat, minlength=k)
    one = count == 1
    none = count == 0
    f = np.where(one, s1, 0.0)  # the output of the only free entry, where there is one
    for _ in range(2):
        r_sum = 1.0 - a_sum @ m - np.bincount(fy, weights=s_free, minlength=k)
        r_mean = v_hat - a_mean @ m - np.bincount(fy, weights=s_free * fo_hat, minlength=k)
        # m must fix the component the row's free entries do not span.
        eq_rows = [
            a_mean[one] - f[one, None] * a_sum[one],
            a_sum[none],
            a_mean[none],
        ]
        eq_rhs = [r_mean[one] - f[one] * r_sum[one], r_sum[none], r_mean[none]]
        lhs = np.concatenate(eq_rows)
        if lhs.shape[0] > 0:
            dm, *_ = np.linalg.lstsq(lhs, np.concatenate(eq_rhs), rcond=None)
            m = m + dm
            r_sum -= a_sum @ dm
            r_mean -= a_mean @ dm
        # Each row: min-norm δs = α + β·o over its free entries.
        det = count * s2 - s1 * s1
        two = count >= 2
        safe = np.where(two, det, 1.0)
        alpha = np.where(two, (s2 * r_sum - s1 * r_mean) / safe, 0.0)
        beta = np.where(two, (count * r_mean - s1 * r_sum) / safe, 0.0)
        # A single free entry at output f moves (sum, mean) along (1, f).
        single = (r_sum + f * r_mean) / (1.0 + f * f)
        delta = np.where(one[fy], single[fy], alpha[fy] + beta[fy] * fo_hat)
        s_free = s_free + delta
    return m, s_free


def _check(matrix: FloatArray, outputs: FloatArray, values: FloatArray, e: float) -> None:
    """Refuse to return a matrix that is not a proper, unbiased, ε-DP mechanism."""
    width = float(values[-1] - values[0])
    if not np.all(matrix >= 0) or np.max(np.abs(matrix.sum(axis=1) - 1.0)) > 1e-9:
        raise MechanismError("the unbiased LP solution is not a transition matrix")
    if np.max(np.abs(matrix @ outputs - values)) > 1e-7 * width:
        raise MechanismError("the unbiased LP solution is not unbiased to 1e-7")
    if np.any(matrix.max(axis=0) > e * (1 + 1e-13) * matrix.min(axis=0)):
        raise MechanismError("the unbiased LP solution is not ε-DP")


def _output_set(values: FloatArray, epsilon: float, mesh: int, strategy: str) -> FloatArray:
    grid = feasible_output_set(values, epsilon=epsilon, mesh=mesh)
    if strategy == "grid":
        return grid
    combined: FloatArray = np.union1d(grid, dbrr_outputs(values, epsilon=epsilon))
    return combined


def default_mesh(k: int) -> int:
    """Algorithm 2's ``n`` when none is given: ``max(4·k, 64)``, at most ``MAX_MESH``."""
    return min(MAX_MESH, max(DEFAULT_MESH_PER_VALUE * k, MIN_DEFAULT_MESH))


def optimal_unbiased(
    values: FloatArray,
    prior: FloatArray,
    *,
    epsilon: float,
    mesh: int | None = None,
    output_set: str = "grid",
) -> FiniteMechanism:
    """The optimal ε-DP unbiased randomizer on Algorithm 2's grid (Algorithm 1).

    ``mesh`` is the grid size ``n`` (default :func:`default_mesh`); ``output_set``
    is ``"grid"`` (Algorithm 2) or ``"grid+dbrr"`` (the grid plus the ε-dbRR
    outputs). ε-DP when one label changes; spends ε; ``prior`` must be DP already.
    """
    eps = check_epsilon(epsilon)
    v, p = validate_prior(values, prior)
    n = default_mesh(v.size) if mesh is None else _check_mesh(mesh)
    if output_set not in OUTPUT_SETS:
        raise MechanismError(
            f"output_set must be one of {', '.join(OUTPUT_SETS)}, got {output_set!r}"
        )
    sol = solve_unbiased(v, p, epsilon=eps, outputs=_output_set(v, eps, n, output_set))
    return FiniteMechanism(
        name="unbiased",
        epsilon=eps,
        inputs=v.copy(),
        outputs=sol.outputs,
        matrix=sol.matrix,
        params={"mesh": n, "output_set": output_set, "objective": "squared"},
    )


def from_request(request: FitRequest) -> FiniteMechanism:
    """Registry factory for ``unbiased``: params ``mesh`` and ``output_set``."""
    params: Mapping[str, Any] = request.params
    unknown = set(map(str, params)) - _PARAMS
    if unknown:
        raise MechanismError(
            f"unknown parameter(s) for unbiased: {', '.join(sorted(unknown))}; "
            f"expected {', '.join(sorted(_PARAMS))}"
        )
    mesh = params.get("mesh")
    strategy = params.get("output_set", "grid")
    if not isinstance(strategy, str):
        raise MechanismError(f"output_set must be one of {', '.join(OUTPUT_SETS)}")
    return optimal_unbiased(
        request.values,
        request.prior,
        epsilon=request.epsilon,
        mesh=None if mesh is None else _check_mesh(mesh),
        output_set=strategy,
    )
