"""RR-on-Bins: the optimal ε-DP label randomizer for a regression loss.

Ghazi et al., "Regression with Label Differential Privacy"
(``papers/rr-on-bins-regression.txt``).

**Mechanism** (Algorithm 1, §3.1). A non-decreasing map Φ sends the label values
``y¹ < … < yᵏ`` to outputs ``ŷ_1, …, ŷ_d``; equivalently the values are cut into
contiguous bins ``S_1, …, S_d`` and bin ``S`` has output ``ŷ_S``. A label ``y`` is
released as ``ŷ_S`` for its own bin with probability ``e^ε / (e^ε + d − 1)`` and as
each other output with probability ``1 / (e^ε + d − 1)``.

**Privacy.** Neighbouring datasets differ in the label of one example
(feature-oblivious label DP, Definition 3). Every column of the transition matrix
holds two distinct entries whose ratio is ``e^ε``, so each released label is ε-DP;
labels are randomized independently, so a release costs ε (parallel composition,
Theorem 6). Φ is a function of the prior only; the prior must itself be DP and
charged (ε₁, Algorithm 3) or public — that is the caller's business.

**Optimality** (Theorem 5, Appendix A). For the squared, absolute and Poisson
losses (Assumption 4) some RR-on-Bins mechanism minimizes
``E_{y∼p} ℓ(M(y), y)`` over *all* ε-DP mechanisms. With ``c = e^ε`` the loss of a
partition is

    Σ_S L(S) / (c + d − 1),    L(S) = min_ŷ Σ_y p_y c^{1[y ∈ S]} ℓ(ŷ, y),

and the minimizers are the weighted mean (squared, Poisson) or the weighted
median (absolute) of the values under the weights ``p_y c^{1[y ∈ S]}``
(Appendix B).

**Algorithm.** The paper's Algorithm 2 runs a DP over (number of bins, last
index), O(k³). This module instead minimizes the ratio directly by Dinkelbach's
method (Dinkelbach 1967, "On nonlinear fractional programming"): for a guess λ of
the optimal loss, ``min_P Σ_S L(S) − λ·(c + d − 1)`` is a one-dimensional
segmentation problem with per-bin cost ``L(S) − λ``, solved exactly by an O(k²)
DP (a Python loop over the last index, vectorized over the first); λ is then
replaced by the loss of the partition found. λ strictly decreases until the
minimum is 0, at which point λ is the optimal loss; as there are finitely many
partitions this ends exactly. Seeded with the best of the two-bin splits and the
prior's quantile partitions, it takes 1–3 DP passes in practice. All bin costs
come from prefix sums in one vectorized pass over the k × k lower triangle
(weighted medians by one ``searchsorted`` over the prefix masses). The bin-cost
matrix does not satisfy the quadrangle inequality, so no SMAWK/Knuth speed-ups.

Numerics: costs are computed in units of ``c`` (weights ``p_y·(t + (1 − t)·1[y ∈ S])``
with ``t = e^{−ε}``), so nothing overflows for large ε; ε above 700 is treated as
700 for the matrix (which is then more private than asked). Prefix-sum costs are
exact up to ~1e-16 of the information-free loss, so a partition is optimal up to
that. Values with zero prior mass do not change any bin cost; they are left out of
the search and attached to the bin of their nearest lower (else upper) neighbour.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import numpy as np
from numpy.typing import NDArray

from label_party.mechanisms.base import (
    FiniteMechanism,
    FitRequest,
    FloatArray,
    IntArray,
    Loss,
    MechanismError,
    check_epsilon,
    check_params,
    pointwise_loss,
    validate_prior,
)

NAME: Final = "rr-on-bins"
SUPPORTED_LOSSES: Final = ("squared", "absolute", "poisson")

#: e^{-700} is still a normal double; beyond it the matrix is computed at ε = 700.
_MAX_EXPONENT: Final = 700.0
#: Two losses within this relative distance are treated as equal when simplifying.
_TIE_RTOL: Final = 1e-12
#: Bin costs are computed for at most this many end indices at a time, and at most
#: this many matrix entries (2 MiB per temporary), so the temporaries stay in cache.
_BLOCK_ROWS: Final = 64
_BLOCK_ELEMENTS: Final = 1 << 18
#: Dinkelbach is seeded with quantile partitions of up to this many bins.
_SEED_BINS: Final = 128
_SEED_MIN_VALUES: Final = 200


class OptimalBins(NamedTuple):
    """The optimal RR-on-Bins partition for a prior.

    ``assignment[j]`` is the bin of ``values[j]`` (bins numbered 0, 1, … in order of
    the values, each a contiguous run); ``outputs[b]`` is bin ``b``'s output ŷ_S;
    ``loss`` is ``E_{y∼prior} ℓ(M(y), y)`` with ℓ as in
    :func:`~label_party.mechanisms.base.pointwise_loss`.
    """

    assignment: IntArray
    outputs: FloatArray
    loss: float


@dataclass(frozen=True)
class _Support:
    """The values of positive prior mass, with prefix sums for O(1) bin statistics."""

    x: FloatArray  # values ((v − shift)·scale for squared/absolute)
    q: FloatArray  # their prior masses
    shift: float
    scale: float  # a power of two: exact both ways
    t: float  # e^{-ε}
    P: FloatArray  # P[j] = Σ_{l<j} q_l, length n + 1
    PY: FloatArray  # Σ_{l<j} q_l x_l
    P2: FloatArray  # Σ_{l<j} q_l x_l² (squared) or Σ_{l<j} q_l x_l log x_l (Poisson)
    spread: FloatArray  # spread[m] = Σ_l q_l |x_m − x_l| (absolute)

    @property
    def n(self) -> int:
        return int(self.x.size)


def _support(values: FloatArray, prior: FloatArray, loss: str, t: float) -> _Support:
    keep = prior > 0
    x, q = values[keep], prior[keep]
    if loss == "squared":
        shift = float(np.dot(q, x) / q.sum())  # centring keeps the prefix sums small
    elif loss == "absolute":
        shift = float(x[np.searchsorted(np.cumsum(q), 0.5 * q.sum())])
    else:
        shift = 0.0  # the Poisson loss is not shift-invariant
    x = x - shift
    # Squared and absolute bins are scale-invariant: scaled near 1 by a power of two,
    # x² stays finite. Unscaled, values past 1.5e153 made every cost inf and the fit
    # one bin, silently (helper-77). The Poisson loss is not scale-invariant.
    top = float(np.abs(x).max())
    scale = math.ldexp(1.0, -math.frexp(top)[1]) if loss != "poisson" and top > 0 else 1.0
    x = x * scale
    zero = np.zeros(1)
    P = np.concatenate([zero, np.cumsum(q)])
    PY = np.concatenate([zero, np.cumsum(q * x)])
    if loss == "poisson":
        xlogx = np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)
        P2 = np.concatenate([zero, np.cumsum(q * xlogx)])
    else:
        P2 = np.concatenate([zero, np.cumsum(q * x * x)])
    spread = x * (2.0 * P[1:] - P[-1]) - (2.0 * PY[1:] - PY[-1])
    return _Support(x, q, shift, scale, t, P, PY, P2, spread)


class _Scratch:
    """Reusable buffers: fresh large arrays cost a page fault per 4 KiB, so the k×k
    pass allocates its temporaries once."""

    def __init__(self, size: int) -> None:
        self._floats = [np.empty(size) for _ in range(3)]
        self._flags = np.empty(size, dtype=np.bool_)

    def floats(self, j: int, shape: tuple[int, ...]) -> FloatArray:
        return self._floats[j][: math.prod(shape)].reshape(shape)

    def flags(self, shape: tuple[int, ...]) -> NDArray[np.bool_]:
        return self._flags[: math.prod(shape)].reshape(shape)


# -- bin costs ------------------------------------------------------------------
#
# Each function takes start indices ``r`` and end indices ``i`` (inclusive, into the
# support; broadcastable shapes) and writes into ``out`` the normalized bin cost
# L̃(S) = L(S)/c = min_ŷ Σ_y w_y ℓ(ŷ, y), w_y = q_y·(t + (1 − t)·1[y ∈ S]).


def _weighted(s: _Support, prefix: FloatArray, r: IntArray, i: IntArray, out: FloatArray) -> None:
    """Σ_y w_y f_y for every bin, from the prefix sums of q·f: one k×k operation."""
    t = s.t
    np.subtract((1.0 - t) * prefix[i + 1] + t * prefix[-1], (1.0 - t) * prefix[r], out=out)


def _squared_costs(
    s: _Support, r: IntArray, i: IntArray, out: FloatArray, scratch: _Scratch
) -> None:
    # L̃ = Σ w y² − (Σ w y)² / Σ w, at the weighted mean (Appendix B, squared loss).
    W = scratch.floats(0, out.shape)
    WY = scratch.floats(1, out.shape)
    _weighted(s, s.P, r, i, W)
    _weighted(s, s.PY, r, i, WY)
    _weighted(s, s.P2, r, i, out)
    np.multiply(WY, WY, out=WY)
    np.divide(WY, W, out=WY)
    np.subtract(out, WY, out=out)
    np.maximum(out, 0.0, out=out)


def _poisson_costs(
    s: _Support, r: IntArray, i: IntArray, out: FloatArray, scratch: _Scratch
) -> None:
    # Minimizer: the weighted mean (Appendix B, Poisson log loss). The cost is kept
    # in deviance form Σ w (y log(y/ŷ) − y + ŷ) = Σ w y log y − (Σ w y)·log ŷ ≥ 0,
    # which differs from Σ w (ŷ − y log ŷ) by Σ w (y log y − y): a term in y alone
    # that changes the loss of every partition by the same E_p[y log y − y].
    W = scratch.floats(0, out.shape)
    WY = scratch.floats(1, out.shape)
    _weighted(s, s.P, r, i, W)
    _weighted(s, s.PY, r, i, WY)
    _weighted(s, s.P2, r, i, out)
    np.divide(WY, W, out=W)
    # Σ w y = 0 only when all mass sits on y = 0: the cost is then 0 (at ŷ = 0).
    np.maximum(W, np.finfo(np.float64).tiny, out=W)
    np.log(W, out=W)
    np.multiply(WY, W, out=WY)
    np.subtract(out, WY, out=out)
    np.maximum(out, 0.0, out=out)


def _median_index(s: _Support, r: IntArray, i: IntArray, scratch: _Scratch) -> IntArray:
    """Weighted median of every bin: the first value whose cumulative weight reaches
    half the total (Appendix B, absolute loss).

    As a function of the prefix mass x = P[m + 1], the cumulative weight up to value
    m is the increasing piecewise-linear f(x) = t·x (m < r); x − (1 − t)·P[r]
    (r ≤ m ≤ i); t·x + (1 − t)·q(S) (m > i). Inverting f at half the total weight
    and one ``searchsorted`` over P give every bin's median at once.
    """
    t = s.t
    shape = np.broadcast_shapes(r.shape, i.shape)
    Pr, Pi = s.P[r], s.P[i + 1]
    half = scratch.floats(0, shape)
    target = scratch.floats(1, shape)
    other = scratch.floats(2, shape)
    flag = scratch.flags(shape)
    _weighted(s, s.P, r, i, half)
    half *= 0.5
    np.subtract((1.0 - t) * Pi, (1.0 - t) * Pr, out=target)
    np.subtract(half, target, out=target)
    target /= t  # the median lies after the bin
    np.add(half, (1.0 - t) * Pr, out=other)
    np.less_equal(other, Pi, out=flag)
    np.copyto(target, other, where=flag)  # ... inside the bin
    np.less_equal(half, t * Pr, out=flag)
    np.divide(half, t, out=other)
    np.copyto(target, other, where=flag)  # ... before the bin
    m: IntArray = np.searchsorted(s.P[1:], target, side="left")
    np.minimum(m, s.n - 1, out=m)
    return m


def _absolute_costs(
    s: _Support, r: IntArray, i: IntArray, out: FloatArray, scratch: _Scratch
) -> None:
    # L̃ = t·Σ_y q_y |ŷ − y| + (1 − t)·Σ_{y∈S} q_y |ŷ − y|, the bin's sum split at ŷ.
    t = s.t
    m = _median_index(s, r, i, scratch)
    med = scratch.floats(0, out.shape)
    everywhere = scratch.floats(1, out.shape)
    part = scratch.floats(2, out.shape)
    np.take(s.x, m, out=med)
    np.take(s.spread, m, out=everywhere)
    m += 1
    np.clip(m, r, i + 1, out=m)  # first index of the bin above the median
    np.take(s.P, m, out=part)
    part *= 2.0
    part -= s.P[r]
    part -= s.P[i + 1]
    part *= med
    np.take(s.PY, m, out=out)
    out *= 2.0
    out -= s.PY[r]
    out -= s.PY[i + 1]
    np.subtract(part, out, out=out)
    out *= 1.0 - t
    everywhere *= t
    out += everywhere
    np.maximum(out, 0.0, out=out)


_CostFunction = Callable[[_Support, IntArray, IntArray, FloatArray, _Scratch], None]
_COSTS: Final[dict[str, _CostFunction]] = {
    "squared": _squared_costs,
    "absolute": _absolute_costs,
    "poisson": _poisson_costs,
}


def _cost_matrix(s: _Support, loss: str) -> FloatArray:
    """``C[i, r]`` = L̃(bin from support index r to i) for r ≤ i (other entries unused).

    Filled in blocks of rows, each only up to the block's last end index, so the
    temporaries stay in cache and only the lower triangle is computed.
    """
    n = s.n
    idx = np.arange(n, dtype=np.int64)
    C = np.empty((n, n))
    costs = _COSTS[loss]
    block = max(1, min(_BLOCK_ROWS, _BLOCK_ELEMENTS // n))
    scratch = _Scratch(min(n, block) * n)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for i0 in range(0, n, block):
            i1 = min(n, i0 + block)
            costs(s, idx[None, :i1], idx[i0:i1, None], C[i0:i1, :i1], scratch)
    return C


def _minimizers(s: _Support, bins: list[tuple[int, int]], loss: str) -> FloatArray:
    """ŷ_S of each bin, in the original (unshifted) coordinates."""
    r = np.array([b[0] for b in bins], dtype=np.int64)
    i = np.array([b[1] for b in bins], dtype=np.int64)
    if loss == "absolute":
        out: FloatArray = s.x[_median_index(s, r, i, _Scratch(r.size))]
    else:
        W, WY = np.empty(r.size), np.empty(r.size)
        _weighted(s, s.P, r, i, W)
        _weighted(s, s.PY, r, i, WY)
        out = WY / W
        if loss == "poisson":  # all mass on y = 0: Σ w y = 0 and ŷ = 0 (_poisson_costs)
            out[WY <= 0] = 0.0
    return out / s.scale + s.shift


# -- the ratio objective ------------------------------------------------------------


def _segment(C: FloatArray, penalty: float) -> list[tuple[int, int]]:
    """Exact minimizer of Σ_S (C[S] − penalty) over contiguous partitions.

    ``F[i + 1] = min_{r ≤ i} F[r] + C[i, r] − penalty``: a Python loop over the end
    index i, vectorized over the start r — O(k²) work in k numpy calls. Ties go to
    the smallest r (fewer bins).
    """
    n = C.shape[0]
    F = np.empty(n + 1)
    F[0] = 0.0
    back = np.empty(n, dtype=np.int64)
    buf = np.empty(n)
    for i in range(n):
        row = buf[: i + 1]
        np.add(F[: i + 1], C[i, : i + 1], out=row)
        r = int(row.argmin())
        F[i + 1] = row[r] - penalty
        back[i] = r
    bins: list[tuple[int, int]] = []
    end = n - 1
    while end >= 0:
        start = int(back[end])
        bins.append((start, end))
        end = start - 1
    bins.reverse()
    return bins


def _ratio(C: FloatArray, bins: list[tuple[int, int]], t: float) -> float:
    """Normalized loss Σ_S L̃(S) / (1 + (d − 1)·t) of a partition."""
    total = math.fsum(float(C[end, start]) for start, end in bins)
    return total / (1.0 + (len(bins) - 1) * t)


def _seed(C: FloatArray, cdf: FloatArray, t: float) -> list[tuple[int, int]]:
    """A good partition to start Dinkelbach from, in O(k + D²) (D = ``_SEED_BINS``).

    The best of: one bin; the best split into two bins (every split point); and, from
    ``_SEED_MIN_VALUES`` values on (below, a DP pass costs less than this), for each
    d ≤ D the partition cutting the prior at its quantiles j/d. Any partition is a
    valid start; a good one saves DP passes (at moderate ε it is often optimal, and
    then a single DP pass certifies it).
    """
    n = C.shape[0]
    candidates: list[list[tuple[int, int]]] = [[(0, n - 1)]]
    if n > 1:
        ends = np.arange(n - 1)
        split = int((C[ends, 0] + C[n - 1, ends + 1]).argmin())
        candidates.append([(0, split), (split + 1, n - 1)])
    if n >= _SEED_MIN_VALUES:
        # Quantile partitions for d = 2 … D, all at once: group g has d = g + 2 bins.
        d = np.arange(2, min(n, _SEED_BINS) + 1)
        offsets = np.concatenate([[0], np.cumsum(d)])
        group = np.repeat(np.arange(d.size), d)
        j = np.arange(offsets[-1]) - offsets[group]  # bin index within its partition
        cut = np.searchsorted(cdf, j / d[group], side="left") - 1  # end of the bin before
        np.clip(cut, -1, n - 2, out=cut)
        starts = cut + 1
        ends_all = np.empty_like(starts)
        ends_all[:-1] = starts[1:] - 1
        ends_all[offsets[1:] - 1] = n - 1
        valid = ends_all >= starts  # repeated quantiles give empty bins: skip them
        cost = np.where(valid, C[ends_all, starts], 0.0)
        bins = np.add.reduceat(valid.astype(np.float64), offsets[:-1])
        ratio = np.add.reduceat(cost, offsets[:-1]) / (1.0 + (bins - 1.0) * t)
        g = int(ratio.argmin())
        sel = slice(offsets[g], offsets[g + 1])
        keep = valid[sel]
        firsts, lasts = starts[sel][keep].tolist(), ends_all[sel][keep].tolist()
        candidates.append(list(zip(firsts, lasts, strict=True)))
    return min(candidates, key=lambda bins: _ratio(C, bins, t))


def _dinkelbach(
    C: FloatArray, t: float, start: list[tuple[int, int]]
) -> tuple[list[tuple[int, int]], float, int]:
    """Minimize Σ_S L̃(S) / (1 + (d − 1)t) over contiguous partitions, from ``start``.

    Each step solves ``min_P Σ_S L̃(S) − λ(1 + (d − 1)t) = min_P Σ_S (L̃(S) − λt) −
    λ(1 − t)`` and moves λ to the ratio of the partition found. Stops when λ no
    longer strictly decreases (the minimum is then 0 up to rounding) and returns the
    best partition, its ratio and the number of DP passes.
    """
    n = C.shape[0]
    best = start
    lam = _ratio(C, best, t)
    passes = 0
    for _ in range(n + 2):  # λ strictly decreases; a handful of steps in practice
        passes += 1
        bins = _segment(C, lam * t)
        value = _ratio(C, bins, t)
        if not value < lam or bins == best:
            break
        best, lam = bins, value
    return best, lam, passes


def _simplify(
    s: _Support, C: FloatArray, bins: list[tuple[int, int]], loss: str
) -> tuple[list[tuple[int, int]], FloatArray]:
    """Merge neighbouring bins whose outputs coincide when that does not raise the loss.

    With N = Σ_S L(S) and D = c + d − 1, merging two bins that share the output ŷ
    gives N' ≤ N − L0(ŷ), D' = D − 1, where L0(ŷ) = Σ_y p_y ℓ(ŷ, y) is at least the
    loss N/D of any RR-on-Bins (one bin already achieves min L0); so N'/D' ≤ N/D and
    at an optimum a merge only resolves a tie — e.g. for the absolute loss at small ε
    every bin's median is the prior's median and one bin is as good as several. The
    same argument makes one bin the answer whenever it is within ``_TIE_RTOL``.
    """
    t = s.t
    lam = _ratio(C, bins, t)
    one = [(0, s.n - 1)]
    if _ratio(C, one, t) <= lam * (1.0 + _TIE_RTOL):
        bins = one
    else:
        span = float(s.x[-1] - s.x[0]) or 1.0
        outputs = _minimizers(s, bins, loss)
        b = 0
        while b + 1 < len(bins):
            if abs(outputs[b + 1] - outputs[b]) <= _TIE_RTOL * span:
                merged = [*bins[:b], (bins[b][0], bins[b + 1][1]), *bins[b + 2 :]]
                new = _ratio(C, merged, t)
                if new <= lam * (1.0 + _TIE_RTOL):
                    bins, lam = merged, min(lam, new)
                    outputs = _minimizers(s, bins, loss)
                    continue
            b += 1
    return bins, _minimizers(s, bins, loss)


def _check_loss(loss: str) -> None:
    if loss not in SUPPORTED_LOSSES:
        raise MechanismError(
            f"{NAME} supports the losses {', '.join(SUPPORTED_LOSSES)}; got {loss!r}"
        )


def optimal_bins(
    values: FloatArray,
    prior: FloatArray,
    *,
    epsilon: float,
    loss: Loss = "squared",
) -> OptimalBins:
    """The loss-minimizing RR-on-Bins partition of ``values`` at ``epsilon``.

    ``values`` sorted increasing, ``prior`` a probability vector over them;
    ``loss`` one of squared, absolute, poisson (Poisson needs non-negative values).
    O(k²) time and memory per Dinkelbach step (module docstring).
    """
    eps = check_epsilon(epsilon)
    _check_loss(loss)
    v, p = validate_prior(values, prior)
    if loss == "poisson" and v[0] < 0:
        raise MechanismError("the Poisson loss needs non-negative values")
    t = math.exp(-min(eps, _MAX_EXPONENT))
    s = _support(v, p, loss, t)
    C = _cost_matrix(s, loss)
    bins, _, _ = _dinkelbach(C, t, _seed(C, s.P[1:] / s.P[-1], t))
    bins, outputs = _simplify(s, C, bins, loss)
    d = len(bins)

    # Bin of each support value, then of every value (zero-mass values join the bin
    # of the nearest lower support value, or the first bin).
    lengths = np.array([end - start + 1 for start, end in bins], dtype=np.int64)
    support_bin = np.repeat(np.arange(d, dtype=np.int64), lengths)
    support_idx = np.flatnonzero(p > 0)
    nearest = np.searchsorted(support_idx, np.arange(v.size), side="right") - 1
    assignment: IntArray = support_bin[np.maximum(nearest, 0)]

    # The loss of the mechanism itself, evaluated directly over the support, in the
    # scaled units (finite) and then in the values' own (inf past the float range).
    scaled = (outputs - s.shift) * s.scale
    cost = pointwise_loss(scaled[None, :], s.x[:, None], loss)
    own = cost[np.arange(s.n), support_bin]
    per_value = (t * cost.sum(axis=1) + (1.0 - t) * own) / (1.0 + (d - 1) * t)
    power = 2 if loss == "squared" else 1
    with np.errstate(over="ignore", under="ignore"):  # a power of two: np.ldexp is exact
        value = np.ldexp(np.dot(s.q, per_value), -power * (math.frexp(s.scale)[1] - 1))
    return OptimalBins(assignment, outputs, float(value))


def rr_on_bins_matrix(assignment: IntArray, num_bins: int, *, epsilon: float) -> FloatArray:
    """Algorithm 1's transition matrix: ``e^ε/(e^ε + d − 1)`` on a value's own bin,
    ``1/(e^ε + d − 1)`` on every other (columns in bin order)."""
    t = math.exp(-min(check_epsilon(epsilon), _MAX_EXPONENT))
    scale = 1.0 / (1.0 + (num_bins - 1) * t)
    matrix = np.full((assignment.size, num_bins), t * scale)
    matrix[np.arange(assignment.size), assignment] = scale
    return matrix


def from_request(request: FitRequest) -> FiniteMechanism:
    """Fit RR-on-Bins (registry name ``rr-on-bins``): Theorem 5's optimal mechanism.

    Takes no parameters. Outputs are sorted ascending; ``describe()`` lists the loss
    and, per bin in order of values, its lowest and highest value and its output.
    """
    check_params(request.params, (), NAME)
    _check_loss(request.loss)
    fitted = optimal_bins(request.values, request.prior, epsilon=request.epsilon, loss=request.loss)
    values = np.asarray(request.values, dtype=np.float64)
    d = fitted.outputs.size
    order = np.argsort(fitted.outputs, kind="stable")
    column = np.empty(d, dtype=np.int64)
    column[order] = np.arange(d, dtype=np.int64)
    matrix = rr_on_bins_matrix(column[fitted.assignment], d, epsilon=request.epsilon)
    first = np.searchsorted(fitted.assignment, np.arange(d), side="left")
    last = np.searchsorted(fitted.assignment, np.arange(d), side="right") - 1
    bins: list[dict[str, Any]] = [
        {
            "lower": float(values[first[b]]),
            "upper": float(values[last[b]]),
            "output": float(fitted.outputs[b]),
        }
        for b in range(d)
    ]
    return FiniteMechanism(
        name=NAME,
        epsilon=float(request.epsilon),
        inputs=values,
        outputs=fitted.outputs[order],
        matrix=matrix,
        params={"loss": request.loss, "bins": bins},
    )
