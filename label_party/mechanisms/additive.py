"""Additive-noise regression baselines: Laplace, staircase and the exponential mechanism.

Each mechanism releases ``M(y) = y + Z`` (optionally clipped back into the declared
label range ``[lo, hi]``) or, for the exponential mechanism, a draw from a density
on ``[lo, hi]`` that depends on ``y``. The label range is declared configuration
(``FitRequest.bounds``), never computed from the labels; the sensitivity of the
identity query on one label is ``Δ = hi − lo``.

Neighbouring relation: two datasets differ in the label of one example
(feature-oblivious label DP, Definition 3 of ``rr-on-bins-regression.txt``). Each
label is randomized once and independently, so a release with any of these
mechanisms at ``ε`` spends exactly ``ε`` (pure ε-DP, δ = 0) on every example it
touches. Clipping is post-processing and costs nothing. None of them uses a prior.

Mechanisms (``rr-on-bins-regression.txt`` Appendix D, Definitions 22–26, and
Appendix F; ``optimal-unbiased-randomizers.txt`` §4 for the clipped/unclipped
comparison):

* ``laplace`` — continuous ``Lap(Δ/ε)`` (Definition 23) or, with ``discrete=true``
  for integer bounds, the discrete Laplace ``DLap(Δ/ε)`` with pmf ∝ ``t^{|z|}``,
  ``t = e^{−ε/Δ}`` (Definition 22). A discrete mechanism first rounds each label
  to a neighbouring integer, unbiasedly (``rounding.round_to_integers``; ε-DP
  still, each output distribution being a mixture of the mechanism's rows): had it
  refused a non-integer label, whether a release succeeds would tell a client,
  for free, something about the labels.
* ``staircase`` — Geng & Viswanath (2014) staircase noise: continuous with
  parameter ``γ ∈ (0, 1)`` (Definition 25) or discrete with integer ``r ∈ [1, Δ]``
  (Definition 24, where the paper's undefined ``b`` is ``e^{−ε}``).
* ``exponential`` — McSherry & Talwar with score ``−|ŷ − y|`` of sensitivity Δ over
  outputs ``ŷ ∈ [lo, hi]`` (Definition 26, Appendix F): density
  ∝ ``exp(−ε|ŷ − y| / (2Δ))`` on the domain, i.e. a Laplace of scale ``2Δ/ε``
  truncated to ``[lo, hi]``. Sampled by exact inverse CDF of the truncated
  Laplace (not by the paper's rejection sampling, whose acceptance rate falls like
  ``ε/4`` for small ε); the distribution is the same.

Why these are ε-DP for *any* two labels ``y, y' ∈ [lo, hi]`` (not just adjacent
integers). Write ``d = y' − y ∈ [−Δ, Δ]``; the output density ratio is
``h(z) / h(z − d)``. Every noise here is symmetric, non-increasing in ``|z|`` and
satisfies ``h(z + Δ) = e^{−ε} h(z)`` for ``z ≥ 0`` (Laplace: ``h(z+Δ) = e^{−ε}h(z)``
for all ``z ≥ 0``; staircase: by construction, Definition 24/25). Hence for ``z``
and ``z − d`` on the same side of 0 the ratio lies in ``[e^{−ε}, e^{ε}]``
(monotonicity plus the decay over one period); when they straddle 0, ``|z| +
|z − d| = |d| ≤ Δ`` so both lie in the first period ``[−Δ, Δ]`` where the staircase
takes only the two values ``a`` and ``a·e^{−ε}`` (and the Laplace differs by at most
``e^{ε}``). The tests check this numerically on a fine grid of ``z`` and shifts
``d ∈ [0, Δ]``, breakpoints included. For the discrete staircase the "high" region
is ``{−(r−1), …, r−1}`` (``2r − 1`` points): the atom at 0 is counted once, which
is why the normalizer is ``2r + 2b(Δ − r) − (1 − b)`` and why the sampler below
rejects "−0" (a sign-and-magnitude sampler that does not do so puts twice the mass
on 0 — the pmf no longer matches Definition 24).

Sampling (Mironov, CCS 2012): ``fl(y + Z)`` in floats leaks ``y`` through its low
bits (a reviewer ruled a label out for certain in 14–38 % of draws on ``[0, 1]``),
so the continuous mechanisms randomize on the label-independent lattice of
:mod:`~label_party.mechanisms.lattice` and release ``lo + h·j``, a function of the
noisy integer ``j`` alone. Integer noise (lattice and ``discrete=true``) draws its
geometric variables digit by digit against 128-bit integers, without the holes of a
float-inverted geometric's tail.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from scipy import integrate, special

from label_party.mechanisms.base import (
    DEFAULT_CHUNK,
    ContinuousMechanism,
    FiniteMechanism,
    FitRequest,
    FloatArray,
    Loss,
    Mechanism,
    MechanismError,
    check_epsilon,
    check_params,
    flip_coins,
    map_chunks,
    rare_draws,
    validate_prior,
)
from label_party.mechanisms.lattice import (
    LATTICE_STEPS,
    MIN_LATTICE_STEP,
    MIN_RATE,
    geometric,
    two_sided_geometric,
)
from label_party.mechanisms.rounding import round_to_integers

__all__ = [
    "AdditiveMechanism",
    "ExponentialMechanism",
    "LaplaceNoise",
    "Noise",
    "StaircaseNoise",
    "exponential_from_request",
    "laplace_from_request",
    "optimal_gamma",
    "optimal_r",
    "staircase_from_request",
]

#: The most ε an additive mechanism is built with; asked for more, it runs at this
#: (more private than charged, and no different in use). Past it their rarest coins
#: fall toward the 2⁻⁵³ and 2⁻⁶⁴ quanta they are drawn in: near ε = 40 a discrete
#: staircase's low step rounded to no draw and a discrete Laplace's nonzero noise
#: to none, so that some output was unreachable from some label (an infinite
#: ratio). At ε = 25 the rarest, e^{−25} ≈ 1.4·10⁻¹¹, is 10⁵ quanta of 2⁻⁵³.
ADDITIVE_MAX_EPSILON = 25.0

#: Unclipped noise is kept within this many of its integer steps beyond the domain
#: (the lattice's, or the integer labels'). A float holds integers exactly only
#: below 2⁵³; past it ``y + Z`` rounded in a way that depended on ``y``, so that at
#: ε ≈ 10⁻¹¹ some outputs ruled some labels out. Every sum inside the window is
#: exact, and one beyond it still lands on the window's edge (float rounding is
#: monotone), so the release is ``clip(y + Z)`` to a label-independent window:
#: post-processing of the exact sum.
FAR_STEPS = 2**51
#: The most probability an unclipped mechanism's noise may have past the window: a
#: mechanism that reaches it more often is refused (its analysis, unbiased with
#: loss E[Z²], would not describe what it releases). About ε < 10⁻⁹ on the lattice.
FAR_MASS = 1e-12

#: The least ε the exponential mechanism runs at. Its inverse-CDF sampler, in
#: floats, gives each of the 2¹⁶ cells its share of 2⁵³ uniforms to about 3·10⁻¹¹
#: relative, whatever ε: below about 6·10⁻¹¹ that exceeds the slack its law leaves
#: (its worst ratio is about e^{ε/2}), and at ε = 10⁻¹² the realized loss was 31 ε
#: (helper-69). At 10⁻⁹ it is 0.53 ε. Below it every cell is as likely to 10⁻⁹ anyway.
EXPONENTIAL_MIN_EPSILON = 1e-9

#: Largest Δ for which a discrete clipped mechanism is turned into a matrix.
MAX_MATRIX_SIDE = 5_000


# -- noise distributions ----------------------------------------------------------


class Noise(Protocol):
    """A symmetric noise distribution ``Z`` with the tail functionals the analysis needs.

    ``c`` arguments are non-negative (integers for discrete noise).
    """

    @property
    def discrete(self) -> bool:
        """Integer-valued noise (a pmf) rather than a density."""
        ...

    def sample(self, n: int, rng: np.random.Generator) -> FloatArray:
        """``n`` independent draws."""
        ...

    def density(self, z: FloatArray) -> FloatArray:
        """pdf (continuous) or pmf (discrete) at ``z``."""
        ...

    def tail(self, c: FloatArray) -> FloatArray:
        """``P(Z > c)``."""
        ...

    def excess(self, c: FloatArray, j: int) -> FloatArray:
        """``E[Z^j − c^j ; Z > c]`` for ``j ∈ {1, 2}`` (non-negative, no cancellation)."""
        ...

    def abs_moment(self) -> float:
        """``E|Z|``."""
        ...

    def second_moment(self) -> float:
        """``E[Z²]`` (the variance: ``E[Z] = 0``)."""
        ...

    def breakpoints(self, lo: float, hi: float) -> FloatArray:
        """Points in ``(lo, hi)`` where the density is not smooth (for quadrature)."""
        ...

    def params(self) -> dict[str, Any]:
        """Public parameters."""
        ...


def _as_float(c: FloatArray | float) -> FloatArray:
    return np.asarray(c, dtype=np.float64)


@dataclass(frozen=True)
class LaplaceNoise:
    """Continuous ``Lap(scale)``: density ``e^{−|z|/s} / (2s)`` (Definition 23)."""

    scale: float
    discrete: bool = False

    def sample(self, n: int, rng: np.random.Generator) -> FloatArray:
        out: FloatArray = rng.laplace(0.0, self.scale, n)
        return out

    def density(self, z: FloatArray) -> FloatArray:
        s = self.scale
        out: FloatArray = np.exp(-np.abs(_as_float(z)) / s) / (2.0 * s)
        return out

    def tail(self, c: FloatArray) -> FloatArray:
        out: FloatArray = 0.5 * np.exp(-_as_float(c) / self.scale)
        return out

    def excess(self, c: FloatArray, j: int) -> FloatArray:
        s, c = self.scale, _as_float(c)
        e = np.exp(-c / s)
        if j == 1:  # ∫_c^∞ (z − c) e^{−z/s}/(2s) dz
            out: FloatArray = 0.5 * s * e
            return out
        if j == 2:  # ∫_c^∞ (z² − c²) e^{−z/s}/(2s) dz
            out = e * s * (c + s)
            return out
        raise ValueError(j)

    def abs_moment(self) -> float:
        return self.scale

    def second_moment(self) -> float:
        return 2.0 * self.scale**2

    def breakpoints(self, lo: float, hi: float) -> FloatArray:
        return np.array([0.0]) if lo < 0.0 < hi else np.empty(0)

    def params(self) -> dict[str, Any]:
        return {"scale": self.scale}


@dataclass(frozen=True)
class StaircaseNoise:
    """Symmetric staircase noise of period ``P``, high region ``split``, decay ``b``.

    On ``z ≥ 0`` the density (pmf) is ``a·b^k`` on ``[kP, kP + split)`` and
    ``a·b^{k+1}`` on ``[kP + split, (k+1)P)``, mirrored to ``z < 0``.

    * Continuous staircase (Definition 25): ``P = Δ``, ``split = γΔ``,
      ``b = e^{−ε}``, ``a = (1 − b) / (2Δ(γ + b(1 − γ)))``.
    * Discrete staircase (Definition 24): integer ``P = Δ``, ``split = r``,
      ``a = (1 − b) / (2r + 2b(Δ − r) − (1 − b))`` — the atom at 0 is counted once.
    * Discrete Laplace ``DLap(Δ/ε)`` (Definition 22) is the discrete staircase with
      ``P = 1``, ``split = 1``, ``b = t = e^{−ε/Δ}``: pmf ``(1−t)/(1+t)·t^{|z|}``.

    Tail functionals use self-similarity: beyond the period that contains ``c`` the
    distribution is the half-distribution shifted by a whole number of periods and
    scaled by a power of ``b``, so every sum is a finite closed form.
    """

    period: float
    split: float
    #: ``−log b``: ε (or ε/Δ), kept exact. Recovering it from ``1 − b`` failed once
    #: ``−expm1(−ε)`` rounds to 1 (ε ≳ 37.4): every such release failed after its
    #: ε was reserved.
    rate: float
    discrete: bool

    def __post_init__(self) -> None:
        if not (0.0 < self.split <= self.period):
            raise MechanismError("staircase split must lie in (0, period]")
        if not self.rate > 0.0:
            raise MechanismError("staircase rate must be > 0")

    # -- shape ----------------------------------------------------------------

    @property
    def decay(self) -> float:
        """``b = e^{−rate}`` (0 once it underflows, past rate ≈ 745)."""
        return math.exp(-self.rate)

    @property
    def one_minus_decay(self) -> float:
        """``1 − b`` without cancellation."""
        return -math.expm1(-self.rate)

    @property
    def level(self) -> float:
        """``a``: the density (pmf) on the central step."""
        b, q, P, s = self.decay, self.one_minus_decay, self.period, self.split
        if self.discrete:
            return q / (2.0 * s + 2.0 * b * (P - s) - q)
        return q / (2.0 * (s + b * (P - s)))

    def _power_sum(self, u: float, v: float, i: int) -> float:
        """``Σ_{x=u}^{v−1} x^i`` (discrete) or ``∫_u^v x^i dx`` (continuous)."""
        if self.discrete:

            def s_(n: float) -> float:
                if i == 0:
                    return n
                if i == 1:
                    return n * (n - 1) / 2.0
                return (n - 1) * n * (2 * n - 1) / 6.0

            return s_(v) - s_(u)
        return (v ** (i + 1) - u ** (i + 1)) / (i + 1)

    def half_moment(self, j: int) -> float:
        """``M_j = E[Z^j ; Z ≥ 0]`` (``M_0`` counts the discrete atom at 0 in full)."""
        a, b, q, P, s = self.level, self.decay, self.one_minus_decay, self.period, self.split
        base = [
            a * self._power_sum(0.0, s, i) + a * b * self._power_sum(s, P, i) for i in range(j + 1)
        ]
        # G_m = Σ_k k^m b^k
        g = [1.0 / q, b / q**2, b * (1.0 + b) / q**3]
        return sum(math.comb(j, i) * P ** (j - i) * base[i] * g[j - i] for i in range(j + 1))

    # -- Noise protocol -------------------------------------------------------

    def sample(self, n: int, rng: np.random.Generator) -> FloatArray:
        """Sign × (G·P + position within the period), the Geng & Viswanath (2014) sampler.

        ``G ~ Geometric``: ``P(G = k) = (1 − b) b^k`` on ``{0, 1, …}``, drawn digit by
        digit (:func:`~label_party.mechanisms.lattice.geometric`: no float holes in
        its tail). The step is high with probability ``s / (s + b(P − s))``. In the
        discrete case "−0" is rejected and redrawn so that 0 is not counted twice.
        The discrete Laplace (period 1) is one geometric with a fair sign.
        """
        if not self.discrete:
            return self._sample_continuous(n, rng)
        if self.period == 1.0:
            return two_sided_geometric(self.rate, n, rng)
        out = self._sample_discrete(n, rng)
        bad = np.flatnonzero(np.isnan(out))
        while bad.size:
            redo = self._sample_discrete(bad.size, rng)
            out[bad] = redo
            bad = bad[np.isnan(redo)]
        return out

    def _sample_continuous(self, n: int, rng: np.random.Generator) -> FloatArray:
        """One geometric and one uniform per draw.

        The uniform ``u`` gives the sign (``u < ½``); ``v = frac(2u)`` is uniform and
        independent of it, picks the step (``v < p_high``) and, rescaled within
        that branch, is again uniform and independent of the choice: the position
        inside the step.
        """
        b, P, s = self.decay, self.period, self.split
        g = geometric(self.rate, n, rng)
        low_weight = b * (P - s)
        p_high = s / (s + low_weight)
        p_low = low_weight / (s + low_weight)  # 1 − p_high without cancellation
        u = rng.random(n)
        negative = u < 0.5
        v = 2.0 * u - np.where(negative, 0.0, 1.0)
        high = v < p_high
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            w = np.where(high, v / p_high, (v - p_high) / p_low)
        np.minimum(w, np.nextafter(1.0, 0.0), out=w)
        pos = np.where(high, w * s, s + w * (P - s))
        magnitude = g * P + pos
        out: FloatArray = np.where(negative, -magnitude, magnitude)
        return out

    def _sample_discrete(self, n: int, rng: np.random.Generator) -> FloatArray:
        """Sign, step and position in integers: the low step is a coin of
        :func:`rare_draws` (its P − s positions against the high step's s, at the
        period's decay), so its realized weight is never below its law's. A float
        coin against ``p_high`` rounded the low step down, realizing a high/low
        ratio above e^ε at every ε (by 4·10⁻⁵ of it at ε = 25, and to no low
        draw at all near ε = 40)."""
        P, s = int(self.period), int(self.split)
        low = flip_coins(rng, rare_draws(P - s, s, self.rate), n)
        position = np.where(
            low,
            s + rng.integers(0, max(P - s, 1), size=n, dtype=np.int64),
            rng.integers(0, s, size=n, dtype=np.int64),
        )
        magnitude = geometric(self.rate, n, rng) * P + position
        negative = rng.integers(0, 2, size=n, dtype=np.int64).astype(bool)
        out: FloatArray = np.where(negative, -magnitude, magnitude)
        out[negative & (magnitude == 0.0)] = np.nan  # "−0": redraw
        return out

    def density(self, z: FloatArray) -> FloatArray:
        x = np.abs(_as_float(z))
        k = np.floor(x / self.period)
        in_high = (x - k * self.period) < self.split
        with np.errstate(under="ignore"):
            out: FloatArray = self.level * self.decay ** np.where(in_high, k, k + 1)
        if self.discrete:
            out = np.where(x == np.round(x), out, 0.0)
        return out

    def _within(self, c: FloatArray, j: int) -> tuple[FloatArray, FloatArray]:
        """Contribution of the period containing ``c`` (beyond ``c``) and its index."""
        P, s, a, b = self.period, self.split, self.level, self.decay
        k = np.floor(c / P)
        o = k * P

        def cum(x: FloatArray) -> FloatArray:
            # measure of (z^j − c^j) over {c < z < x}
            if self.discrete:
                m = np.maximum(x - 1.0 - c, 0.0)
                if j == 0:
                    return m
                if j == 1:
                    r1: FloatArray = m * (m + 1.0) / 2.0
                    return r1
                r2: FloatArray = c * m * (m + 1.0) + m * (m + 1.0) * (2.0 * m + 1.0) / 6.0
                return r2
            w = np.maximum(x - c, 0.0)
            if j == 0:
                return w
            if j == 1:
                r3: FloatArray = w * w / 2.0
                return r3
            r4: FloatArray = c * w * w + w**3 / 3.0
            return r4

        with np.errstate(under="ignore"):
            bk = b**k
        lo_, mid, hi_ = cum(o), cum(o + s), cum(o + P)
        part: FloatArray = a * bk * (mid - lo_) + a * bk * b * (hi_ - mid)
        return part, k

    def tail(self, c: FloatArray) -> FloatArray:
        c = _as_float(c)
        part, k = self._within(c, 0)
        with np.errstate(under="ignore"):
            out: FloatArray = part + self.decay ** (k + 1) * self.half_moment(0)
        return out

    def excess(self, c: FloatArray, j: int) -> FloatArray:
        c = _as_float(c)
        part, k = self._within(c, j)
        e = (k + 1) * self.period  # start of the next period
        m0, m1 = self.half_moment(0), self.half_moment(1)
        if j == 1:
            rest = (e - c) * m0 + m1
        elif j == 2:
            rest = (e - c) * (e + c) * m0 + 2.0 * e * m1 + self.half_moment(2)
        else:
            raise ValueError(j)
        with np.errstate(under="ignore"):
            out: FloatArray = part + self.decay ** (k + 1) * rest
        return out

    def abs_moment(self) -> float:
        return 2.0 * self.half_moment(1)

    def second_moment(self) -> float:
        return 2.0 * self.half_moment(2)

    def breakpoints(self, lo: float, hi: float) -> FloatArray:
        P, s = self.period, self.split
        kmax = math.ceil(max(abs(lo), abs(hi)) / P) + 1
        ks = np.arange(-kmax, kmax + 1) * P
        pts = np.unique(np.concatenate([ks, ks + s, ks - s]))
        out: FloatArray = pts[(pts > lo) & (pts < hi)]
        return out

    def params(self) -> dict[str, Any]:
        return {"period": self.period, "split": self.split, "decay": self.decay}


def continuous_staircase(delta: float, epsilon: float, gamma: float) -> StaircaseNoise:
    """Definition 25 with period Δ and ``b = e^{−ε}``."""
    return StaircaseNoise(delta, gamma * delta, epsilon, False)


def discrete_staircase(delta: int, epsilon: float, r: int) -> StaircaseNoise:
    """Definition 24 with integer period Δ, ``1 ≤ r ≤ Δ`` and ``b = e^{−ε}``.

    Its step coin is counted here, not first when it samples: a coin no count
    realizes is refused by the fit, so a preview says so as a release does."""
    rare_draws(delta - r, r, epsilon)
    return StaircaseNoise(float(delta), float(r), epsilon, True)


def discrete_laplace(delta: int, epsilon: float) -> StaircaseNoise:
    """``DLap(Δ/ε)`` (Definition 22): pmf ∝ ``t^{|z|}`` with ``t = e^{−ε/Δ}``."""
    return StaircaseNoise(1.0, 1.0, epsilon / delta, True)


def optimal_gamma(epsilon: float, loss: Loss = "squared") -> float:
    """Geng & Viswanath's optimal ``γ*`` for the continuous staircase (Δ-free).

    ``γ* = 1/(1 + e^{ε/2})`` minimizes ``E|Z|``; for ``E[Z²]`` it is the real root
    ``γ* = −b/(1−b) + (b − 2b² + 2b⁴ − b⁵)^{1/3} / (2^{1/3}(1 − b)²)``, ``b = e^{−ε}``
    (Geng & Viswanath, "The optimal mechanism in differential privacy", 2014; both
    closed forms are checked against a numerical minimization in the tests).
    The absolute loss gets the ℓ1 optimum; every other loss the ℓ2 optimum.
    """
    eps = check_epsilon(epsilon)
    if loss == "absolute":
        return 1.0 / (1.0 + math.exp(eps / 2.0))
    b = math.exp(-eps)
    q = -math.expm1(-eps)
    inner = b * (1.0 - 2.0 * b + 2.0 * b**3 - b**4)
    gamma = -b / q + inner ** (1.0 / 3.0) / (2.0 ** (1.0 / 3.0) * q**2)
    return float(min(max(gamma, 1e-12), 1.0 - 1e-12))


def optimal_r(delta: int, epsilon: float, loss: Loss = "squared") -> int:
    """The ``r ∈ [1, Δ]`` minimizing ``E|Z|`` (absolute loss) or ``E[Z²]`` (otherwise).

    Exhaustive over every ``r`` with the closed-form moments of
    :meth:`StaircaseNoise.half_moment`, vectorized over ``r`` (O(Δ) arithmetic).
    """
    eps = check_epsilon(epsilon)
    j = 1 if loss == "absolute" else 2
    b, q, d = math.exp(-eps), -math.expm1(-eps), float(delta)
    r = np.arange(1.0, d + 1.0)
    a = q / (2.0 * r + 2.0 * b * (d - r) - q)

    def s_(n: FloatArray | float, i: int) -> FloatArray:
        n = np.asarray(n, dtype=np.float64)
        out: FloatArray = (
            n if i == 0 else n * (n - 1) / 2 if i == 1 else (n - 1) * n * (2 * n - 1) / 6
        )
        return out

    base = [a * s_(r, i) + a * b * (s_(d, i) - s_(r, i)) for i in range(j + 1)]
    g = [1.0 / q, b / q**2, b * (1.0 + b) / q**3]
    moment = sum(math.comb(j, i) * d ** (j - i) * base[i] * g[j - i] for i in range(j + 1))
    return int(np.argmin(moment)) + 1


# -- shared validation ------------------------------------------------------------


def _bounds(request: FitRequest) -> tuple[float, float]:
    lo, hi = (float(x) for x in request.bounds)
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
        raise MechanismError(f"bounds must be finite with min < max, got [{lo}, {hi}]")
    if not (hi - lo) / LATTICE_STEPS >= MIN_LATTICE_STEP:
        # A step that underflows to 0 (or loses digits) mapped lo to NaN and hi to
        # lo: every label released exactly, at any ε (helper-86).
        raise MechanismError(
            f"the domain [{lo:g}, {hi:g}] is narrower than these mechanisms randomize "
            f"on: max − min must be at least {MIN_LATTICE_STEP * LATTICE_STEPS:.3g} "
            "(2¹⁶ lattice steps of normal floats)"
        )
    return lo, hi


def _bool_param(params: Mapping[str, Any], name: str) -> bool:
    value = params.get(name, False)
    if not isinstance(value, bool | np.bool_):
        raise MechanismError(f"{name} must be true or false, got {value!r}")
    return bool(value)


def _is_integer(x: float) -> bool:
    return math.isfinite(x) and float(x).is_integer()


def _check_labels(
    labels: FloatArray, lo: float, hi: float, discrete: bool, what: str = "labels"
) -> None:
    # Messages never carry label values or counts (DESIGN.md §3.1).
    if not np.all(np.isfinite(labels)):
        raise MechanismError(f"{what} must be finite numbers")
    if labels.size and (labels.min() < lo or labels.max() > hi):
        raise MechanismError(f"{what} must lie within the declared bounds [{lo:g}, {hi:g}]")
    if discrete and not np.array_equal(labels, np.round(labels)):
        raise MechanismError(f"{what} must be integers for a discrete mechanism")


def _loss_values(
    values: FloatArray, prior: FloatArray, loss: Loss
) -> tuple[FloatArray, FloatArray]:
    v, p = validate_prior(values, prior)
    if loss not in ("squared", "absolute", "poisson", "zero-one"):
        raise MechanismError(f"unknown loss {loss!r}")
    if loss == "poisson" and v[0] < 0:
        raise MechanismError("the Poisson loss needs non-negative values")
    return v, p


def _weighted(prior: FloatArray, per_value: FloatArray) -> float:
    return float(np.sum(np.where(prior > 0, prior * per_value, 0.0)))


def _sample_checked(
    labels: FloatArray,
    draw: Callable[[FloatArray, np.random.Generator], FloatArray],
    check: Callable[[FloatArray], None],
    rng: np.random.Generator | None,
    chunk_size: int,
) -> FloatArray:
    def checked(chunk: FloatArray, g: np.random.Generator) -> FloatArray:
        check(chunk)
        return draw(chunk, g)

    out: FloatArray = map_chunks(labels, checked, rng=rng, chunk_size=chunk_size)
    return out


# -- additive mechanisms ----------------------------------------------------------


@dataclass(frozen=True, eq=False)
class AdditiveMechanism(ContinuousMechanism):
    """``M(y) = y + Z`` or, with ``clip``, ``clip(y + Z, lo, hi)``.

    A :class:`ContinuousMechanism` in every variant, discrete included: unclipped
    discrete noise has infinite support, and even clipped it is described by its
    noise parameters, not a matrix (``to_finite()`` gives the ``(Δ+1)²`` matrix of
    a clipped discrete mechanism for inspection). ε-DP for any two labels in
    ``[lo, hi]`` (see the module docstring); spends ε per example, δ = 0.

    Continuous noise is sampled on the lattice ``lo + h·ℤ`` (:mod:`.lattice`):
    ``lattice_noise`` is its discrete counterpart over ``LATTICE_STEPS`` steps of
    ``h`` (Laplace: ``DLap(2¹⁶/ε)``; staircase: period 2¹⁶, ``r = round(γ·2¹⁶)``).
    The analysis below is the continuous one; the lattice moves it by O(h).

    Analysis with ``W = y' − y`` (the possibly clipped noise), ``a = lo − y ≤ 0``,
    ``b = hi − y ≥ 0`` and excesses ``X_j(c) = E[Z^j − c^j ; Z > c]``:
    ``E[W] = X_1(|a|) − X_1(b)``, ``E[W²] = E[Z²] − X_2(b) − X_2(|a|)``,
    ``E|W| = E|Z| − X_1(b) − X_1(|a|)`` — exact closed forms. Unclipped: bias 0,
    squared loss ``E[Z²]``, absolute ``E|Z|``.

    Poisson loss ``E[ŷ − y log ŷ]``: infinite for a label ``y > 0`` whenever
    ``P(ŷ ≤ 0) > 0`` — always without clipping (the noise has unbounded support on
    both sides), and with clipping when ``lo ≤ 0`` (the atom at ``lo`` has positive
    mass). Otherwise ``E[log ŷ]`` is integrated exactly (``scipy.integrate.quad``
    over the smooth pieces; a finite sum for discrete noise). A zero label pays
    ``E[ŷ]`` (``0·log 0 = 0``, as in :func:`~label_party.mechanisms.base.pointwise_loss`).
    """

    name: str
    epsilon: float
    lo: float
    hi: float
    noise: Noise
    clip: bool
    discrete: bool
    extra: Mapping[str, Any]
    lattice_noise: Noise | None = None

    @property
    def sensitivity(self) -> float:
        return self.hi - self.lo

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bounds": [self.lo, self.hi],
            "sensitivity": self.sensitivity,
            "clip": self.clip,
            "discrete": self.discrete,
        }
        out.update(self.extra)
        return out

    # -- sampling -----------------------------------------------------------

    def sample(
        self,
        labels: FloatArray,
        *,
        rng: np.random.Generator | None = None,
        chunk_size: int = DEFAULT_CHUNK,
    ) -> FloatArray:
        def draw(chunk: FloatArray, g: np.random.Generator) -> FloatArray:
            if self.lattice_noise is not None:
                return self._on_lattice(chunk, self.lattice_noise, g)
            # Discrete noise needs integer labels; rounding them (unbiasedly) instead
            # of refusing others keeps whether a release succeeds label-independent.
            noisy = round_to_integers(chunk, g) + self.noise.sample(chunk.size, g)
            lo, hi = (self.lo, self.hi) if self.clip else self.window
            np.clip(noisy, lo, hi, out=noisy)
            return noisy

        def check(chunk: FloatArray) -> None:
            _check_labels(chunk, self.lo, self.hi, discrete=False)

        return _sample_checked(labels, draw, check, rng, chunk_size)

    def _on_lattice(self, y: FloatArray, noise: Noise, g: np.random.Generator) -> FloatArray:
        """``lo + h·j``: ``j`` the label's lattice index, rounded unbiasedly, plus
        integer noise, clipped in integers; the float is a function of ``j`` alone."""
        h = (self.hi - self.lo) / LATTICE_STEPS
        index = np.clip((y - self.lo) / h, 0.0, float(LATTICE_STEPS))
        j = round_to_integers(index, g) + noise.sample(y.size, g)
        lo, hi = (0.0, float(LATTICE_STEPS)) if self.clip else self.window
        np.clip(j, lo, hi, out=j)
        out: FloatArray = self.lo + j * h
        return out

    @property
    def window(self) -> tuple[float, float]:
        """Where unclipped noise is kept (:data:`FAR_STEPS`): in lattice indices, or
        in labels for discrete noise."""
        lo, hi = (
            (0.0, float(LATTICE_STEPS)) if self.lattice_noise is not None else (self.lo, self.hi)
        )
        return lo - FAR_STEPS, hi + FAR_STEPS

    def checked_window(self) -> AdditiveMechanism:
        """``self``, or :class:`MechanismError` if its integer noise is finer than
        its 62 binary digits hold (:data:`~.lattice.MIN_RATE`), or if unclipped it
        reaches past :data:`FAR_STEPS` with more than :data:`FAR_MASS` (free
        refusals: ε and the domain are public)."""
        noise = self.lattice_noise if self.lattice_noise is not None else self.noise
        rate = getattr(noise, "rate", None)
        if rate is not None and rate < MIN_RATE:
            raise MechanismError(
                f"{self.name} at ε = {self.epsilon:g} over {self._steps():g} integer steps is "
                f"noise finer than this service draws exactly (ε per step below {MIN_RATE:.2g}): "
                "raise ε or narrow the domain"
            )
        if self.clip:
            return self
        beyond = 2.0 * float(noise.tail(np.array([FAR_STEPS - LATTICE_STEPS], dtype=float))[0])
        if beyond > FAR_MASS:
            raise MechanismError(
                f"unclipped {self.name} noise at ε = {self.epsilon:g} reaches past 2⁵¹ of its "
                f"steps with probability {beyond:.2g}, where floats stop holding sums "
                "exactly: raise ε or set clip=true"
            )
        return self

    def _steps(self) -> float:
        return float(LATTICE_STEPS) if self.lattice_noise is not None else self.hi - self.lo

    # -- analysis -----------------------------------------------------------

    def _offsets(self, values: FloatArray) -> tuple[FloatArray, FloatArray]:
        v = np.asarray(values, dtype=np.float64)
        _check_labels(v, self.lo, self.hi, self.discrete, what="values")
        return v - self.lo, self.hi - v  # |a|, b

    def bias(self, values: FloatArray) -> FloatArray:
        """``E[M(y)] − y``: 0 unclipped; ``X_1(y − lo) − X_1(hi − y)`` clipped."""
        a, b = self._offsets(values)
        if not self.clip:
            return np.zeros_like(a)
        out: FloatArray = self.noise.excess(a, 1) - self.noise.excess(b, 1)
        return out

    def noisy_label_loss(self, values: FloatArray, prior: FloatArray, loss: Loss) -> float:
        v, p = _loss_values(values, prior, loss)
        a, b = self._offsets(v)
        z = self.noise
        if loss == "squared":
            per = np.full_like(v, z.second_moment())
            if self.clip:
                per = per - z.excess(a, 2) - z.excess(b, 2)
        elif loss == "absolute":
            per = np.full_like(v, z.abs_moment())
            if self.clip:
                per = per - z.excess(a, 1) - z.excess(b, 1)
        elif loss == "zero-one":
            per = 1.0 - self._prob_unchanged(a, b)
        else:
            per = self._poisson(v, a, b)
        return _weighted(p, np.maximum(per, 0.0) if loss != "poisson" else per)

    def _prob_unchanged(self, a: FloatArray, b: FloatArray) -> FloatArray:
        z = self.noise
        stay = z.density(np.zeros_like(a)) if self.discrete else np.zeros_like(a)
        if self.clip:  # clipping maps a whole tail onto y when y is an endpoint
            stay = stay + np.where(a == 0, z.tail(a), 0.0) + np.where(b == 0, z.tail(b), 0.0)
        out: FloatArray = stay
        return out

    def _poisson(self, v: FloatArray, a: FloatArray, b: FloatArray) -> FloatArray:
        mean = v + self.bias(v)
        per = np.empty_like(v)
        for i, y in enumerate(v):
            if y == 0.0:
                per[i] = mean[i]
            elif not self.clip or self.lo <= 0.0:
                per[i] = math.inf
            else:
                per[i] = mean[i] - y * self._expected_log(y, a[i], b[i])
        return per

    def _expected_log(self, y: float, a: float, b: float) -> float:
        """``E[log clip(y + Z, lo, hi)]`` for ``lo > 0``."""
        z = self.noise
        ends = math.log(self.hi) * float(z.tail(np.array(b))) + math.log(self.lo) * float(
            z.tail(np.array(a))
        )
        if self.discrete:
            grid = np.arange(-a, b + 1.0)
            return ends + float(np.sum(np.log(y + grid) * z.density(grid)))
        pts = z.breakpoints(-a, b)
        edges = np.concatenate([[-a], pts, [b]])
        body = 0.0
        for u, w in itertools.pairwise(edges):
            if w > u:
                val, _ = integrate.quad(
                    lambda t: math.log(y + t) * float(z.density(np.array(t))),
                    float(u),
                    float(w),
                    epsabs=0.0,
                    epsrel=1e-11,
                    limit=200,
                )
                body += val
        return ends + body

    def to_finite(self) -> FiniteMechanism:
        """The transition matrix of a clipped discrete mechanism on ``{lo, …, hi}``."""
        if not (self.discrete and self.clip):
            raise MechanismError("only a clipped discrete mechanism has a finite matrix")
        n = int(self.sensitivity) + 1
        if n > MAX_MATRIX_SIDE + 1:
            raise MechanismError(f"the range is too wide for a matrix (Δ > {MAX_MATRIX_SIDE})")
        grid = np.arange(self.lo, self.hi + 1.0)
        diff = grid[None, :] - grid[:, None]  # o − y
        m = self.noise.density(diff)
        # Clipping: everything at or below lo lands on lo, at or above hi on hi.
        m[:, 0] = self.noise.density(diff[:, 0]) + self.noise.tail(-diff[:, 0])
        m[:, -1] = self.noise.density(diff[:, -1]) + self.noise.tail(diff[:, -1])
        return FiniteMechanism(self.name, self.epsilon, grid, grid.copy(), m, params=self.params())


# -- exponential mechanism --------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ExponentialMechanism(ContinuousMechanism):
    """Exponential mechanism over ``ŷ ∈ [lo, hi]`` with score ``−|ŷ − y|``.

    Appendix F / Definition 26 of ``rr-on-bins-regression.txt``: the score has
    sensitivity Δ = hi − lo, so the density ``∝ exp(−ε|ŷ − y|/(2Δ))`` on
    ``[lo, hi]`` is ε-DP (``e^{ε/2}`` from the score, ``e^{ε/2}`` from the
    normalizer); it is a Laplace of scale ``s = 2Δ/ε`` truncated to the domain.
    Spends ε per example, δ = 0.

    Sampler: on the centres ``lo + (j + ½)h`` of the 2¹⁶ cells of ``[lo, hi]``
    (:mod:`.lattice`: no output's low bits may depend on ``y``; the ends are not
    outputs, as in the continuous mechanism, whose Poisson loss at ``lo = 0`` is
    finite), the exponential mechanism of the label's cell index ``n`` (rounded
    unbiasedly), ``P(j) ∝ q^{|j − n|}`` with ``q = e^{−ε/(2(2^16 − 1))}``, by inverse
    CDF: pick the side of ``n`` with probability proportional to its mass, then a
    truncated geometric distance. Every output has
    positive probability from every label, and the float inversions err by about
    3·10⁻¹¹ relative, less than the ratio ``e^ε`` leaves from
    :data:`EXPONENTIAL_MIN_EPSILON` on (refused below). Vectorized, no rejection loop (the paper
    rejection-samples). The analysis below is the continuous one (O(h) away).

    Analysis: with ``I_j(ℓ) = ∫_0^ℓ d^j e^{−d/s} dd = s^{j+1} j! P(j+1, ℓ/s)``
    (regularized incomplete gamma, accurate for small ``ℓ/s``), ``L = y − lo``,
    ``R = hi − y`` and ``Z = I_0(L) + I_0(R)``: bias ``(I_1(R) − I_1(L))/Z``,
    squared loss ``(I_2(L) + I_2(R))/Z``, absolute ``(I_1(L) + I_1(R))/Z``.
    Poisson: infinite for ``y > 0`` when ``lo < 0`` (``P(ŷ < 0) > 0``); otherwise
    ``E[log ŷ]`` by quadrature (``lo = 0`` is an integrable log singularity).
    """

    name: str
    epsilon: float
    lo: float
    hi: float

    @property
    def scale(self) -> float:
        return 2.0 * (self.hi - self.lo) / self.epsilon

    def params(self) -> dict[str, Any]:
        return {
            "bounds": [self.lo, self.hi],
            "sensitivity": self.hi - self.lo,
            "scale": self.scale,
            "clip": False,
            "discrete": False,
            "sampler": "inverse-cdf",
            "lattice_step": (self.hi - self.lo) / LATTICE_STEPS,
        }

    def _integral(self, length: FloatArray, j: int) -> FloatArray:
        s = self.scale
        out: FloatArray = s ** (j + 1) * math.factorial(j) * special.gammainc(j + 1, length / s)
        return out

    def density(self, x: FloatArray, y: float) -> FloatArray:
        """Density of ``M(y)`` at ``x`` (0 outside ``[lo, hi]``)."""
        x = np.asarray(x, dtype=np.float64)
        norm = float(
            self._integral(np.array(y - self.lo), 0) + self._integral(np.array(self.hi - y), 0)
        )
        inside = (x >= self.lo) & (x <= self.hi)
        out: FloatArray = np.where(inside, np.exp(-np.abs(x - y) / self.scale) / norm, 0.0)
        return out

    def cdf(self, x: FloatArray, y: float) -> FloatArray:
        """``P(M(y) ≤ x)``."""
        x = np.clip(np.asarray(x, dtype=np.float64), self.lo, self.hi)
        left = self._integral(np.array(y - self.lo), 0)
        norm = float(left + self._integral(np.array(self.hi - y), 0))
        below = left - self._integral(np.maximum(y - x, 0.0), 0)
        above = left + self._integral(np.maximum(x - y, 0.0), 0)
        out: FloatArray = np.where(x < y, below, above) / norm
        return out

    def sample(
        self,
        labels: FloatArray,
        *,
        rng: np.random.Generator | None = None,
        chunk_size: int = DEFAULT_CHUNK,
    ) -> FloatArray:
        lo, hi = self.lo, self.hi
        h = (hi - lo) / LATTICE_STEPS
        last = float(LATTICE_STEPS - 1)  # cells 0 … last: the score's sensitivity
        rate = self.epsilon / (2.0 * last)

        def draw(y: FloatArray, g: np.random.Generator) -> FloatArray:
            n = round_to_integers(np.clip((y - lo) / h - 0.5, 0.0, last), g)
            # Right: n + d, d ∈ {0 … last − n}; left: n − 1 − d, d ∈ {0 … n − 1}.
            right_len, left_len = last - n + 1.0, n
            m_right = -np.expm1(-rate * right_len)
            m_left = math.exp(-rate) * -np.expm1(-rate * left_len)
            go_right = g.random(y.size) * (m_left + m_right) < m_right
            length = np.where(go_right, right_len, left_len)
            # Truncated geometric on {0 … length − 1}: P(D ≤ d) = (1 − q^{d+1})/(1 − q^length).
            d = np.floor(np.log1p(g.random(y.size) * np.expm1(-rate * length)) / -rate)
            d = np.clip(d, 0.0, np.maximum(length - 1.0, 0.0))
            j = np.where(go_right, n + d, n - 1.0 - d)
            out: FloatArray = lo + (j + 0.5) * h
            return out

        def check(chunk: FloatArray) -> None:
            _check_labels(chunk, lo, hi, False)

        return _sample_checked(labels, draw, check, rng, chunk_size)

    def _moments(self, v: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        _check_labels(v, self.lo, self.hi, False, what="values")
        left, right = v - self.lo, self.hi - v
        norm = self._integral(left, 0) + self._integral(right, 0)
        i1l, i1r = self._integral(left, 1), self._integral(right, 1)
        i2 = self._integral(left, 2) + self._integral(right, 2)
        return (i1r - i1l) / norm, i2 / norm, (i1l + i1r) / norm, norm

    def bias(self, values: FloatArray) -> FloatArray:
        return self._moments(np.asarray(values, dtype=np.float64))[0]

    def noisy_label_loss(self, values: FloatArray, prior: FloatArray, loss: Loss) -> float:
        v, p = _loss_values(values, prior, loss)
        mean, second, absolute, _ = self._moments(v)
        if loss == "squared":
            return _weighted(p, second)
        if loss == "absolute":
            return _weighted(p, absolute)
        if loss == "zero-one":
            return _weighted(p, np.ones_like(v))
        per = np.empty_like(v)
        for i, y in enumerate(v):
            if y == 0.0:
                per[i] = y + mean[i]
            elif self.lo < 0.0:
                per[i] = math.inf
            else:
                per[i] = y + mean[i] - y * self._expected_log(float(y))
        return _weighted(p, per)

    def _expected_log(self, y: float) -> float:
        total = 0.0
        for u, w in ((self.lo, y), (y, self.hi)):
            if w > u:
                val, _ = integrate.quad(
                    lambda t: math.log(t) * float(self.density(np.array(t), y)),
                    u,
                    w,
                    epsabs=0.0,
                    epsrel=1e-11,
                    limit=200,
                )
                total += val
        return total


# -- factories --------------------------------------------------------------------


def _finite_noise(lo: float, hi: float, eps: float) -> None:
    """Refuse a domain and ε whose noise overflows a float: a noisy label is the label
    plus a draw of up to ~40 scales (2Δ/ε at most), and past float64's range the
    release would be ±inf or NaN. Label-independent: a free refusal."""
    if not math.isfinite(64 * (abs(lo) + abs(hi) + 2 * (hi - lo) / eps)):
        raise MechanismError(
            f"noise of scale (max − min)/ε over [{lo:g}, {hi:g}] at ε = {eps:g} overflows "
            "a float: narrow the domain or raise ε"
        )


def _common(
    request: FitRequest, allowed: set[str], mechanism: str
) -> tuple[float, float, float, bool, bool]:
    eps = min(check_epsilon(request.epsilon), ADDITIVE_MAX_EPSILON)
    params = request.params
    check_params(params, allowed, mechanism)
    lo, hi = _bounds(request)
    _finite_noise(lo, hi, eps)
    clip = _bool_param(params, "clip")
    discrete = _bool_param(params, "discrete")
    if discrete:
        if not (_is_integer(lo) and _is_integer(hi)):
            raise MechanismError(f"discrete=true needs integer bounds, got [{lo:g}, {hi:g}]")
        if max(abs(lo), abs(hi)) > FAR_STEPS:
            raise MechanismError(
                f"discrete=true needs bounds within ±2⁵¹, got [{lo:g}, {hi:g}]: a float "
                "holds every integer exactly only below 2⁵³"
            )
        values = np.asarray(request.values, dtype=np.float64)
        if not np.array_equal(values, np.round(values)):
            raise MechanismError("discrete=true needs integer label values")
    return eps, lo, hi, clip, discrete


def laplace_from_request(request: FitRequest) -> Mechanism:
    """``laplace``: ``y + Lap(Δ/ε)`` or, ``discrete=true``, ``y + DLap(Δ/ε)``.

    Params: ``clip`` (bool, default false), ``discrete`` (bool, default false).
    Definitions 22/23 of ``rr-on-bins-regression.txt``.
    """
    eps, lo, hi, clip, discrete = _common(request, {"clip", "discrete"}, "laplace")
    delta = hi - lo
    noise: Noise
    lattice: Noise | None = None
    extra: dict[str, Any] = {"scale": delta / eps}
    if discrete:
        dlap = discrete_laplace(int(delta), eps)
        noise, extra["decay"] = dlap, dlap.decay
    else:
        noise = LaplaceNoise(delta / eps)
        lattice = discrete_laplace(LATTICE_STEPS, eps)
        extra["lattice_step"] = delta / LATTICE_STEPS
    return AdditiveMechanism(
        "laplace", eps, lo, hi, noise, clip, discrete, extra, lattice
    ).checked_window()


def staircase_from_request(request: FitRequest) -> Mechanism:
    """``staircase``: Geng & Viswanath staircase noise, Definitions 24/25.

    Params: ``clip``, ``discrete`` (bools, default false); continuous: ``gamma`` in
    (0, 1), default :func:`optimal_gamma` for ε and the request's loss; discrete:
    integer ``r`` in [1, Δ], default :func:`optimal_r`.
    """
    eps, lo, hi, clip, discrete = _common(request, {"clip", "discrete", "gamma", "r"}, "staircase")
    params = request.params
    delta = hi - lo
    noise: Noise
    lattice: Noise | None = None
    if discrete:
        if "gamma" in params:
            raise MechanismError("gamma is for the continuous staircase; use r with discrete=true")
        d = int(delta)
        r = params.get("r", None)
        if r is None:
            r = optimal_r(d, eps, request.loss)
        if isinstance(r, bool) or not isinstance(r, int | np.integer) or not 1 <= r <= d:
            raise MechanismError(f"r must be an integer in [1, {d}], got {r!r}")
        dstair = discrete_staircase(d, eps, int(r))
        noise = dstair
        extra: dict[str, Any] = {"r": int(r), "decay": dstair.decay}
    else:
        if "r" in params:
            raise MechanismError("r is for the discrete staircase; use gamma without discrete")
        gamma = params.get("gamma", None)
        if gamma is None:
            gamma = optimal_gamma(eps, request.loss)
        if (
            isinstance(gamma, bool)
            or not isinstance(gamma, int | float | np.floating)
            or not 0.0 < float(gamma) < 1.0
        ):
            raise MechanismError(f"gamma must be a number in (0, 1), got {gamma!r}")
        cstair = continuous_staircase(delta, eps, float(gamma))
        noise = cstair
        extra = {"gamma": float(gamma), "decay": cstair.decay}
        steps = max(1, round(float(gamma) * LATTICE_STEPS))
        lattice = discrete_staircase(LATTICE_STEPS, eps, min(steps, LATTICE_STEPS))
        extra["lattice_step"] = delta / LATTICE_STEPS
    return AdditiveMechanism(
        "staircase", eps, lo, hi, noise, clip, discrete, extra, lattice
    ).checked_window()


def exponential_from_request(request: FitRequest) -> Mechanism:
    """``exponential``: exponential mechanism on ``[lo, hi]``, score ``−|ŷ − y|``.

    No params (the output is always inside the domain). Appendix F of
    ``rr-on-bins-regression.txt``.
    """
    eps = min(check_epsilon(request.epsilon), ADDITIVE_MAX_EPSILON)
    check_params(request.params, set(), "exponential")
    # A release runs at the double below its ε (float_below): "1e-9" itself passes.
    if eps < math.nextafter(EXPONENTIAL_MIN_EPSILON, 0.0):
        raise MechanismError(
            f"exponential runs at ε ≥ {EXPONENTIAL_MIN_EPSILON:g}: below it its sampler's "
            "float rounding exceeds what ε allows (and its outputs are uniform to 10⁻⁹); "
            "use laplace with clip=true"
        )
    lo, hi = _bounds(request)
    _finite_noise(lo, hi, eps)
    return ExponentialMechanism("exponential", eps, lo, hi)
