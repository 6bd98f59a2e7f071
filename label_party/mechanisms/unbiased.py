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

The optimum uses at most ``2k`` outputs (Theorem 6; 14 of 416 grid points for the
52-week example, 5 of 401 for a 0..400 count label, but ~270 of 756 for 189 values
at ε = 8), so the LP is solved by column generation over outputs *and* cells:

1. solve the LP on a small subset of the grid (4 evenly spaced points, which
   include both ends, with all their cells, so it is feasible: Proposition 7);
2. with the duals ``λ_y`` (row sums) and ``μ_y`` (unbiasedness) and
   ``r_y(o) = p_y (o − y)² − λ_y − μ_y·o``, the most negative reduced cost of output
   ``o`` per unit of ``m_o`` is ``ρ(o) = Σ_y r_y(o) + (e^ε − 1)·Σ_y min(r_y(o), 0)``
   (its best column is the staircase pattern that puts ``s`` at its upper bound
   where ``r_y(o) < 0``; Appendix B, Claim 12) — one vectorized ``k × |O|`` pass;
3. every mechanism has total column mass ``Σ_o Σ_y M[y, o] = k``, so
   ``Σ_y λ_y + Σ_y μ_y·y + k·min(0, min_o κ(o))`` is a lower bound on the LP over
   the *whole* grid with every cell, where ``κ(o)`` is the best reduced cost per unit
   of column mass (:func:`_price`; the first version used ``Σ_o m_o ≤ 1``, which
   at high ε is loose by about ``e^ε/k``). Stop when the objective is within
   ``rel_gap`` of it; otherwise add the (at most 64) most negative local minima of
   ``ρ``, and the missing cells of the staircase pattern of any output already in
   the LP whose ``ρ`` is negative, and repeat.

Only some cells ``s[y, o]`` of an output are in the LP (the others are held at 0,
which restricts the LP, so the bound of step 3 still certifies the result): a new
output gets its staircase pattern and the values between the supports of the used
outputs either side of it (:func:`_sandwich`; the intervals of Appendix B,
Claims 13–14, move forward with the output). The LP lives in one HiGHS instance
(:class:`_Master`): adding outputs and cells keeps the last basis primal feasible,
so each round is a warm primal-simplex re-solve rather than a cold solve; the LP is
rebuilt without its unused outputs only when they outnumber the used ones. The
costs are scaled so that dbRR's loss is 1 (HiGHS' tolerances are absolute; in
normalized coordinates a wide grid at ε = 1 has an objective near 1e-5, where
warm primal simplex stopped 1.4e-7 above the optimum, uncertified).

The result is the optimum of the paper's LP over the whole grid (certified by the
bound), not a heuristic (``rel_gap`` 1e-10; tests compare it with the all-pairs LP).
Why it is done this way (measured on 2 shared cores, 189 values, default mesh 756,
a Laplace-histogram prior like the service fits): the first version solved every
restricted LP from scratch with dual simplex, with all k cells per output, and
dropped unused outputs every round. That is fast at ε ≤ 2, but at high ε the
optimum has hundreds of outputs (their at-bound intervals are 2–50 values wide,
not near-identity): 35–63 s at ε = 4, and at ε = 8 11 minutes to more than 15
(17–24 rounds of LPs with 200–300 outputs × 189 cells, 20–60 s each; a cold solve
of one 199-output LP took 20k dual-simplex iterations). Rescaling ``m`` by ``e^ε − 1``
(so the coupling coefficients are ±1) did not help (13 s against 17 s on that LP),
nor did interior point (22 s) or primal simplex (18 s) cold: the cost is the LP's
size and the number of cold solves, not its scaling. At ε = 8: warm starts with
all cells, 145 s; with the staircase pattern only, 91 s (700 outputs, 33 rounds);
cold solves with the sandwich cells, 57 s; warm with the sandwich cells, as now,
15–20 s (2.5–4 s at ε = 4). A warm *dual* simplex start was slower than a cold one
(adding columns leaves the basis dual infeasible). Column generation over
(output, pattern) columns with a 2k-row master was tried first and abandoned: its
master is massively degenerate (tried again here: no progress in 30 rounds).

Finally the solution is repaired so that the returned matrix is exactly ε-DP: the
vertex is refined with the pattern of every ``s[y, o]`` (at 0, at its bound, or in
between) held fixed so that the equalities hold to rounding, ``s`` is clipped into
``[0, (e^ε − 1)·m_o]``, and each column is clamped to ``e^ε·min``; rows are not
rescaled afterwards. :func:`_check` refuses any result that is not a transition
matrix, unbiased to ``1e-7·(max − min)`` and ε-DP to ``1e-13`` relative.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np
from numpy.typing import ArrayLike, NDArray

from label_party.mechanisms.base import (
    FiniteMechanism,
    FitRequest,
    FitTimeLimitError,
    FloatArray,
    MechanismError,
    check_epsilon,
    check_params,
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
#: Above this ε the LP's coefficients (±(e^ε − 1)) defeat HiGHS on some priors: a
#: reviewer's fits failed from ε = 20 on a prior-dependent subset (so a release
#: whose label-independent preflight passed failed after it was charged), and on
#: every prior from ε = 35; another's failed 32 of 15,310 fits at ε in [12, 16],
#: from ε = 13.06, none below (helper-77). Refused up front (label-independent,
#: free); ``auto`` picks ε-dbRR there, which the optimum approaches as ε grows.
MAX_EPSILON = 12.0
#: Below this ε the coefficients e^ε − 1 vanish beside 1 and HiGHS returns
#: solutions that fail the unbiasedness check on some priors (helper-87: 21-29 of
#: 40 noisy priors at ε = 5·10⁻⁷, k = 101, mesh 2, while the uniform preflight
#: passed, so the release failed after it was charged). Measured here, random and
#: noisy priors, mesh 2: failures at k = 101 up to ε = 10⁻⁶, at k = 401 at 10⁻⁵, at
#: k = 1001 at 3·10⁻⁵; none at 10⁻⁴ or 10⁻³ (k ≤ 1001). Refused up front, free;
#: ``auto`` picks ε-dbRR there, unbiased at any ε.
MIN_EPSILON = 1e-3

_PARAMS = frozenset({"mesh", "output_set"})
#: Outputs in the first restricted LP.
_INITIAL_OUTPUTS = 4
#: At most this many outputs are added per round (measured on the 189-value grid at
#: ε = 8: 32 → 17 s, 64 → 14 s, 128 → 17 s, 256 → 16 s; fewer rounds against a larger LP).
_ADD_PER_ROUND = 64
#: Pricing works on at most this many (value, output) cells at a time.
_PRICE_CELLS = 1 << 20
#: Relative tolerance that classifies ``s[y, o]`` as at a bound during the repair.
_AT_BOUND = 1e-9
#: The LP is rebuilt without its unused outputs (a cold start) when it has more of
#: them than used ones and than this; otherwise it grows and is re-solved warm.
_KEEP_UNUSED = 8
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
    with np.errstate(over="ignore", invalid="ignore"):  # a domain too wide: callers check
        phi: FloatArray = ((em1 + v.size) * v - v.sum()) / em1
    return phi


#: debiased-rr's matrix is dense K×K (8 bytes an entry, and as many again to sample).
DEBIASED_RR_MAX_VALUES = 4096


def debiased_rr(values: FloatArray, *, epsilon: float) -> FiniteMechanism:
    """ε-dbRR (Definition 23): randomized response over ``(Φ(y))_y``.

    ``P[Φ(y) | y] = e^ε/(e^ε + k − 1)`` and every other ``Φ(y')`` has probability
    ``1/(e^ε + k − 1)``; unbiased because ``Σ_y Φ(y) = Σ_y y``. ε-DP when one label
    changes; spends ε; uses no prior.
    """
    eps = check_epsilon(epsilon)
    v = _checked_values(values)
    k = v.size
    if k > DEBIASED_RR_MAX_VALUES:
        raise MechanismError(
            f"debiased-rr builds a dense {k}×{k} matrix: at most {DEBIASED_RR_MAX_VALUES} "
            "values; use a coarser grid, rr-on-bins or unbiased"
        )
    outputs = dbrr_outputs(v, epsilon=eps)
    if not np.isfinite(outputs).all():
        # Known from the values alone, so the preflight makes it a free 422 (it
        # released ±inf, which no file or manifest can carry).
        raise MechanismError(
            "debiased-rr's outputs overflow on this domain (they reach beyond ±1.8e308): "
            "narrow it, or use rr-on-bins or unbiased"
        )
    e = math.exp(eps)
    matrix = np.full((k, k), 1.0 / (e + k - 1))
    np.fill_diagonal(matrix, e / (e + k - 1))
    return FiniteMechanism(
        name="debiased-rr",
        epsilon=eps,
        inputs=v.copy(),
        outputs=outputs,
        matrix=matrix,
        params={},
    )


def debiased_rr_from_request(request: FitRequest) -> FiniteMechanism:
    """Registry factory for ``debiased-rr``; it takes no parameters."""
    check_params(request.params, (), "debiased-rr")
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
    s: FloatArray  # (n, k); zero where the cell is not in the LP


def _int32(a: ArrayLike) -> NDArray[np.int32]:
    return np.ascontiguousarray(a, dtype=np.int32)


class _Master:
    """The restricted LP, kept in one HiGHS instance across column-generation rounds.

    Columns: ``T``, ``T₁``, then per output ``m_o`` and its ``s[o, y]`` cells, in the
    order added. Rows: row sums (k), unbiasedness (k), ``T = Σ m``, ``T₁ = Σ o·m``,
    then one coupling row ``s[o, y] − (e^ε−1)·m_o ≤ 0`` per cell. A cell that is not
    in the LP is held at ``s = 0``, which is a restriction of the LP, so the LP value
    is an upper bound on the optimum and the pricing bound certifies it.

    Adding outputs or cells appends columns at 0 and coupling rows with basic
    slacks, so the last optimal basis stays a valid, primal feasible basis: each
    round re-solves from it with primal simplex (a warm start). Measured on the
    189-value grid at ε = 8: cold dual simplex on a 199-output LP took 20k
    iterations (17 s); warm primal rounds take a few thousand, and a warm *dual*
    start was slower than cold (the basis is dual infeasible after adding columns).
    """

    def __init__(self, v_hat: FloatArray, prior: FloatArray, em1: float) -> None:
        k = v_hat.size
        self.v_hat, self.prior, self.em1, self.k = v_hat, prior, em1, k
        self.outputs = np.empty(0)  # normalized outputs, in the order added
        self.m_col = np.empty(0, np.int64)
        self.cell_out = np.empty(0, np.int64)  # position (in self.outputs) of each cell
        self.cell_y = np.empty(0, np.int64)
        self.cell_col = np.empty(0, np.int64)
        self.h = highspy.Highs()  # type: ignore[no-untyped-call]
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("solver", "simplex")
        self.h.setOptionValue("primal_feasibility_tolerance", 1e-10)
        self.h.setOptionValue("dual_feasibility_tolerance", 1e-10)
        rhs = np.concatenate([np.ones(k), v_hat, [0.0, 0.0]])
        self.h.addRows(2 * k + 2, rhs, rhs, 0, _int32([0]), _int32([]), np.zeros(0))
        # T enters the row sums and its definition row; T₁ the means and its row.
        ys = np.arange(k)
        index = _int32(np.concatenate([ys, [2 * k], k + ys, [2 * k + 1]]))
        value = np.concatenate([np.ones(k), [-1.0], np.ones(k), [-1.0]])
        free = np.full(2, _INF)
        self.h.addCols(2, np.zeros(2), -free, free, index.size, _int32([0, k + 1]), index, value)
        self.num_col = 2
        self.warm = False  # whether a basis from an earlier solve is there to start from

    def add(self, o_new: FloatArray, cells: NDArray[np.bool_]) -> None:
        """Add outputs ``o_new`` (normalized) with the ``s`` cells where ``cells`` is set."""
        k, n0, n = self.k, self.outputs.size, o_new.size
        if n == 0:
            return
        cost = self.prior @ np.square(o_new[None, :] - self.v_hat[:, None])
        index = _int32(np.tile([2 * k, 2 * k + 1], n))
        value = np.stack([np.ones(n), o_new], 1).ravel()
        self.h.addCols(n, cost, np.zeros(n), np.full(n, _INF), 2 * n, _int32(2 * np.arange(n)),
                       index, value)  # fmt: skip
        self.m_col = np.concatenate([self.m_col, self.num_col + np.arange(n)])
        self.num_col += n
        self.outputs = np.concatenate([self.outputs, o_new])
        out, ys = np.nonzero(cells)
        self.add_cells(n0 + out, ys)

    def add_cells(self, out: NDArray[np.int64], ys: NDArray[np.int64]) -> None:
        """Add the cells ``s[out[i], ys[i]]`` (``out``: positions in ``self.outputs``)."""
        c = out.size
        if c == 0:
            return
        o = self.outputs[out]
        cost = self.prior[ys] * np.square(o - self.v_hat[ys])
        col = self.num_col + np.arange(c)
        starts = _int32(2 * np.arange(c))
        self.h.addCols(c, cost, np.zeros(c), np.full(c, _INF), 2 * c, starts,
                       _int32(np.stack([ys, self.k + ys], 1).ravel()),
                       np.stack([np.ones(c), o], 1).ravel())  # fmt: skip
        self.num_col += c
        self.h.addRows(c, np.full(c, -_INF), np.zeros(c), 2 * c, starts,
                       _int32(np.stack([col, self.m_col[out]], 1).ravel()),
                       np.tile([1.0, -self.em1], c))  # fmt: skip
        self.cell_out = np.concatenate([self.cell_out, out])
        self.cell_y = np.concatenate([self.cell_y, ys])
        self.cell_col = np.concatenate([self.cell_col, col])

    def cells(self) -> NDArray[np.bool_]:
        """Which cells are in the LP: ``(outputs, k)`` in the order added."""
        have = np.zeros((self.outputs.size, self.k), dtype=bool)
        have[self.cell_out, self.cell_y] = True
        return have

    def solve(self, deadline: float | None) -> _Restricted:
        """Re-solve from the last basis; the solution over the outputs in added order.
        Past ``deadline`` (``time.monotonic()``): :class:`FitTimeLimitError`."""
        h, k = self.h, self.k
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _out_of_time()
            # HiGHS 1.x compares time_limit with its clock summed over every run.
            h.setOptionValue("time_limit", h.getRunTime() + left)
        # Cold: dual simplex; warm: primal simplex (see the class docstring).
        h.setOptionValue("simplex_strategy", 4 if self.warm else 1)
        h.run()
        self.warm = True
        status = h.getModelStatus()
        if status == highspy.HighsModelStatus.kTimeLimit:
            raise _out_of_time()
        if status != highspy.HighsModelStatus.kOptimal:
            raise MechanismError(
                "the unbiased-randomizer LP was not solved to optimality "
                f"(HiGHS: {h.modelStatusToString(status)})"
            )
        sol = h.getSolution()
        x = np.asarray(sol.col_value, dtype=np.float64)
        duals = np.asarray(sol.row_dual, dtype=np.float64)
        s = np.zeros((self.outputs.size, k))
        s[self.cell_out, self.cell_y] = x[self.cell_col]
        return _Restricted(
            objective=float(h.getInfo().objective_function_value),
            lam=duals[:k].copy(),
            mu=duals[k : 2 * k].copy(),
            m=x[self.m_col].copy(),
            s=s,
        )


def _out_of_time() -> FitTimeLimitError:
    return FitTimeLimitError(
        "the unbiased LP was not solved in the time allowed: ask with a smaller mesh, "
        "fewer values or a larger epsilon"
    )


def _reduced(
    v_hat: FloatArray, prior: FloatArray, o: FloatArray, lam: FloatArray, mu: FloatArray
) -> FloatArray:
    """``r_y(o) = p_y (o − y)² − λ_y − μ_y·o`` for the outputs ``o``: shape ``(k, |o|)``."""
    r = prior[:, None] * np.square(o[None, :] - v_hat[:, None])
    r -= lam[:, None]
    r -= mu[:, None] * o[None, :]
    return r


@dataclass(frozen=True)
class _Prices:
    rho: FloatArray  # ρ(o): best reduced cost per unit of m_o
    per_mass: FloatArray  # best reduced cost per unit of column mass Σ_y M[y, o]


def _price(
    v_hat: FloatArray,
    prior: FloatArray,
    o_hat: FloatArray,
    lam: FloatArray,
    mu: FloatArray,
    em1: float,
) -> _Prices:
    """ρ(o) and the best reduced cost of output ``o`` per unit of column mass.

    A column with ``s`` at its bound on a set ``S`` of values has mass
    ``(k + (e^ε−1)|S|)·m_o``; for a fixed ``|S| = j`` the best ``S`` holds the ``j``
    smallest ``r_y(o)``, so the best ratio is a minimum over the prefix sums of the
    sorted ``r_y(o)`` (a linear-fractional program attains its minimum at a vertex).
    """
    k, n = v_hat.size, o_hat.size
    rho, per_mass = np.empty(n), np.empty(n)
    step = max(1, _PRICE_CELLS // k)
    sizes = k + em1 * np.arange(k + 1)[:, None]
    for start in range(0, n, step):
        r = _reduced(v_hat, prior, o_hat[start : start + step], lam, mu)
        total = r.sum(axis=0)
        rho[start : start + step] = total + em1 * np.minimum(r, 0.0).sum(axis=0)
        prefix = np.concatenate([np.zeros((1, r.shape[1])), np.cumsum(np.sort(r, axis=0), 0)])
        per_mass[start : start + step] = ((total + em1 * prefix) / sizes).min(axis=0)
    return _Prices(rho=rho, per_mass=per_mass)


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
    deadline: float | None = None,
) -> UnbiasedSolution:
    """ComputeOptUnbiasedRand (Algorithm 1) with ``g = ℓ_sq`` over ``outputs``.

    The LP is feasible exactly when the unbiased two-point mechanism on the
    smallest and largest output is ε-DP (averaging any feasible mechanism onto those
    two points gives it; Proposition 7 for Algorithm 2's grid). Raises
    :class:`MechanismError` when it is not, when HiGHS does not report an optimum, or
    when column generation does not converge; :class:`FitTimeLimitError` past
    ``deadline`` (a ``time.monotonic()`` instant).
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
            "the unbiased LP is infeasible on this output set at this epsilon: its ends "
            "must lie beyond the values by the margin ε-DP needs, as Algorithm 2's grid "
            "(output_set='grid') does unless the domain sits so far from 0 against its "
            "width (as [1e15, 1e15 + 10] at ε = 8) that rounding takes the margin: then "
            "give the labels relative to an offset"
        )

    # Normalized coordinates: the output set spans [-1, 1].
    center, half = 0.5 * (a + b), 0.5 * (b - a)
    o_hat = (grid - center) / half
    v_hat = (v - center) / half

    sol, current, lower, rounds = _column_generation(v_hat, p, o_hat, em1, rel_gap, deadline)
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


def _column_generation(
    v_hat: FloatArray,
    prior: FloatArray,
    o_hat: FloatArray,
    em1: float,
    rel_gap: float,
    deadline: float | None,
) -> tuple[_Restricted, NDArray[np.int64], float, int]:
    """Column generation over outputs and cells (module docstring, steps 1–3).

    Returns the last restricted optimum and its outputs (indices into ``o_hat``),
    both sorted by output, the certified lower bound and the number of rounds.
    """
    k, n = v_hat.size, o_hat.size
    # HiGHS' tolerances are absolute; the objective in normalized coordinates can be
    # 1e-5 (a wide grid at small ε), where a 1e-10 dual tolerance stops 1e-7 above
    # the optimum. Scaling the costs so that dbRR's loss is 1 makes them relative.
    scale = 1.0 / _dbrr_loss(v_hat, prior, em1)
    prior = prior * scale
    current = np.unique(np.round(np.linspace(0, n - 1, min(n, _INITIAL_OUTPUTS))).astype(np.int64))
    master = _Master(v_hat, prior, em1)
    # All cells of the two ends: the LP is feasible from the first round (Proposition 7).
    master.add(o_hat[current], np.ones((current.size, k), dtype=bool))
    lower, previous, drop = -math.inf, math.inf, True
    rounds = 0
    while True:
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise MechanismError(
                f"the unbiased LP did not converge in {MAX_ROUNDS} column-generation rounds"
            )
        sol = master.solve(deadline)
        prices = _price(v_hat, prior, o_hat, sol.lam, sol.mu, em1)
        dual = float(sol.lam.sum() + sol.mu @ v_hat)
        lower = max(lower, dual + k * min(0.0, float(prices.per_mass.min())))
        if sol.objective - lower <= rel_gap * abs(sol.objective):
            break
        threshold = -0.01 * rel_gap * abs(sol.objective)
        # Outputs in the LP whose staircase pattern lacks cells get those cells.
        inside = np.flatnonzero(prices.rho[current] < threshold)
        grow = _pattern(v_hat, prior, o_hat[current[inside]], sol.lam, sol.mu)
        grow &= ~master.cells()[inside]
        cand = _candidates(prices.rho, current, threshold)
        if cand.size == 0 and not grow.any():
            break
        new_cells = _pattern(v_hat, prior, o_hat[cand], sol.lam, sol.mu)
        new_cells |= _sandwich(current, sol, cand, k)
        have = master.cells()
        have[inside] |= grow
        # Unused outputs only slow the LP down: when they outnumber the used ones,
        # rebuild it without them (cold). Stop dropping once a round fails to
        # improve, which rules out cycling.
        drop &= sol.objective < previous * (1 - 1e-12)
        previous = sol.objective
        used = sol.m > 0
        if drop and _rebuild(used):
            master = _Master(v_hat, prior, em1)
            master.add(o_hat[current[used]], have[used])
            current = current[used]
        else:
            out, ys = np.nonzero(grow)
            master.add_cells(inside[out], ys)
        master.add(o_hat[cand], new_cells)
        current = np.concatenate([current, cand])
    order = np.argsort(current)
    ordered = _Restricted(
        sol.objective / scale, sol.lam / scale, sol.mu / scale, sol.m[order], sol.s[order]
    )
    return ordered, current[order], lower / scale, rounds


def _rebuild(used: NDArray[np.bool_]) -> bool:
    """Whether to rebuild the LP without its unused outputs (see ``_KEEP_UNUSED``).

    Measured (2 cores): rebuilding cold whenever the LP is small (≤ 24 outputs)
    made ε = 1 on 401 values 3× faster (0.7 → 0.25 s) but ε = 4 on 189 values 3×
    slower (2.6 → 8.5 s); rebuilding every round, as the first version did, took
    57 s at ε = 8 against 15–18 s warm.
    """
    unused = int(np.count_nonzero(~used))
    return unused > max(int(np.count_nonzero(used)), _KEEP_UNUSED)


def _dbrr_loss(v_hat: FloatArray, prior: FloatArray, em1: float) -> float:
    """The squared-error loss of ε-dbRR (Definition 23) on ``v_hat``: a feasible
    unbiased mechanism, so of the LP optimum's order or above; only a cost scale."""
    k = v_hat.size
    phi = ((em1 + k) * v_hat - v_hat.sum()) / em1
    spread = np.square(phi).sum() - 2.0 * v_hat * phi.sum() + k * np.square(v_hat)
    loss = (spread + em1 * np.square(phi - v_hat)) / (em1 + k)
    return float(max(prior @ loss, np.finfo(np.float64).tiny))


def _candidates(rho: FloatArray, current: NDArray[np.int64], threshold: float) -> NDArray[np.int64]:
    """New outputs: the local minima of ρ below ``threshold``, most negative first."""
    rho = rho.copy()
    rho[current] = np.maximum(rho[current], 0.0)  # in the LP already: never re-added
    left = np.concatenate([[np.inf], rho[:-1]])
    right = np.concatenate([rho[1:], [np.inf]])
    cand = np.flatnonzero((rho < threshold) & (rho <= left) & (rho <= right))
    return cand[np.argsort(rho[cand], kind="stable")][:_ADD_PER_ROUND]


def _pattern(
    v_hat: FloatArray, prior: FloatArray, o: FloatArray, lam: FloatArray, mu: FloatArray
) -> NDArray[np.bool_]:
    """The staircase pattern of outputs ``o``: cells with ``r_y(o) < 0``, ``(|o|, k)``."""
    pattern: NDArray[np.bool_] = (_reduced(v_hat, prior, o, lam, mu) < 0).T
    return pattern


def _sandwich(
    current: NDArray[np.int64], sol: _Restricted, cand: NDArray[np.int64], k: int
) -> NDArray[np.bool_]:
    """Cells of new outputs: the values between the supports of their used neighbours.

    In an optimal mechanism the values where a column is at its upper bound form an
    interval whose ends move forward with the output (Appendix B, Claims 13–14), so
    an output between two used outputs ``o₁ < o < o₂`` needs at most the values from
    the first of ``o₁``'s support to the last of ``o₂``'s. This is only a guess of
    which cells to add (the pricing adds any missing one later), but a good one: on
    the 189-value grid at ε = 8, the staircase pattern alone needed 33 rounds and
    700 outputs (91 s), all k cells per output 16 rounds (145 s), this 12–13 rounds
    (15–20 s).
    """
    used = sol.m > 0
    if not used.any():  # a degenerate solution (ε in the 30s): no neighbours to go by
        return np.ones((np.size(cand), k), dtype=bool)
    pos, support = current[used], sol.s[used] > 0
    order = np.argsort(pos)
    pos, support = pos[order], support[order]
    first = np.where(support.any(axis=1), np.argmax(support, axis=1), 0)
    last = np.where(support.any(axis=1), k - 1 - np.argmax(support[:, ::-1], axis=1), k - 1)
    right = np.searchsorted(pos, cand)
    lo = np.where(right > 0, first[np.maximum(right - 1, 0)], 0)
    hi = np.where(right < pos.size, last[np.minimum(right, pos.size - 1)], k - 1)
    ys = np.arange(k)
    mask: NDArray[np.bool_] = (ys[None, :] >= lo[:, None]) & (ys[None, :] <= hi[:, None])
    return mask


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
    # Around the domain's centre: at 6e9 the products' rounding alone is 2e-6, above
    # 1e-7 of a width of 10, and a prior-dependent fit failed after its charge
    # (helper-77); the rows sum to 1, so the centre moves both sides alike.
    centre = float(values[0]) + width / 2
    if np.max(np.abs(matrix @ (outputs - centre) - (values - centre))) > 1e-7 * width:
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
    deadline: float | None = None,
) -> FiniteMechanism:
    """The optimal ε-DP unbiased randomizer on Algorithm 2's grid (Algorithm 1).

    ``mesh`` is the grid size ``n`` (default :func:`default_mesh`); ``output_set``
    is ``"grid"`` (Algorithm 2) or ``"grid+dbrr"`` (the grid plus the ε-dbRR
    outputs). ε-DP when one label changes; spends ε; ``prior`` must be DP already.
    ``deadline`` (``time.monotonic()``) bounds the solve: :class:`FitTimeLimitError`.
    """
    eps = check_epsilon(epsilon)
    if eps > MAX_EPSILON:
        raise MechanismError(
            f"the unbiased LP is not solved reliably above ε = {MAX_EPSILON:g} (its "
            "coefficients reach e^ε); use debiased-rr, which its optimum approaches as ε "
            "grows, or auto, which does"
        )
    if eps < MIN_EPSILON:
        raise MechanismError(
            f"the unbiased LP is not solved reliably below ε = {MIN_EPSILON:g} (its "
            "coefficients e^ε − 1 vanish); use debiased-rr, unbiased at any ε, or auto, "
            "which does"
        )
    v, p = validate_prior(values, prior)
    n = default_mesh(v.size) if mesh is None else _check_mesh(mesh)
    if output_set not in OUTPUT_SETS:
        raise MechanismError(
            f"output_set must be one of {', '.join(OUTPUT_SETS)}, got {output_set!r}"
        )
    outputs = _output_set(v, eps, n, output_set)
    sol = solve_unbiased(v, p, epsilon=eps, outputs=outputs, deadline=deadline)
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
    check_params(params, _PARAMS, "unbiased")
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
        deadline=request.deadline,
    )
