"""Integer noise without floating-point holes, and the lattice continuous labels go on.

Why (Mironov, "On Significance of the Least Significant Bits for Differential
Privacy", CCS 2012): a continuous mechanism computed as ``fl(y + Z)`` releases
floats whose low bits depend on ``y`` — on ``[0, 1]``, every output in
``(0, ½)`` from ``y = 1`` is a multiple of 2⁻⁵³ and about 14 % of those from
``y = 0`` are not, so an output can rule a label out for certain. Here a continuous
additive mechanism randomizes on the label-independent lattice
``lo + h·ℤ``, ``h = Δ / LATTICE_STEPS``: the label is rounded onto it unbiasedly
(a mixture of two lattice rows, so still ε-DP), integer noise is added exactly in
integers, and the float ``lo + j·h`` is a function of the integer ``j`` alone.

Integer noise: numpy's geometric draws invert a float uniform, so its far tail
has holes (values no 53-bit uniform reaches) whose place depends on the shift,
i.e. on the label — rare for a coarse noise, but a fine lattice makes the success
probability ``p`` tiny and the holes begin near probability ``2⁻⁵³/p``.
:func:`geometric` draws instead each binary digit of ``G`` — independent, since
``q^G = Π q^{2^i b_i}`` — as a coin with ``P(b_i = 1) = 1 / (1 + q^{−2^i})``
compared against a uniform 64-bit integer. Every value of ``G`` below ``2^I`` is
reachable, ``I`` the first digit whose coin rounds to 0 (``P(G ≥ 2^I)`` below
2⁻⁶⁴). Each coin is drawn for its rarer side, whose probability ``p ≤ ½`` is
computed to float precision, so it is off by a relative 2⁻⁵² + 2⁻⁶⁴/p at most:
the privacy loss of every output is that of the exact law to that precision, and
outputs rarer than 2⁻⁶⁴ may not occur at all (the support ends there).
"""

from __future__ import annotations

import math

import numpy as np

from label_party.mechanisms.base import FloatArray

#: Lattice steps across a continuous domain: h = Δ / 2¹⁶, far finer than any noise
#: (scale Δ/ε), so the rounding adds at most h²/4 to the squared loss.
LATTICE_STEPS = 1 << 16
_TWO_64 = float(1 << 64)


def geometric(rate: float, n: int, rng: np.random.Generator) -> FloatArray:
    """``n`` draws of ``G`` on ``{0, 1, …}`` with ``P(G = g) = (1 − q) q^g``,
    ``q = e^{−rate}``, digit by digit (module docstring); as floats holding integers."""
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    out = np.zeros(n, dtype=np.int64)
    digit = np.empty(n, dtype=bool)
    place = np.empty(n, dtype=np.int64)
    for i in range(62):
        # P(b_i = 1) = q^{2^i} / (1 + q^{2^i}) = 1 / (1 + e^{2^i·rate}) ≤ ½.
        threshold = _threshold(1.0 / (1.0 + math.exp(min(2.0**i * rate, 700.0))))
        if threshold == 0:
            break
        np.less(_words(n, rng), np.uint64(threshold), out=digit)
        np.left_shift(digit, i, out=place, casting="unsafe")
        out |= place
    return out.astype(np.float64)


def two_sided_geometric(rate: float, n: int, rng: np.random.Generator) -> FloatArray:
    """Discrete Laplace: ``P(K = k) = (1 − q)/(1 + q) · q^{|k|}``, ``q = e^{−rate}``.

    ``|K|`` is 0 with probability ``(1 − q)/(1 + q) = tanh(rate/2)``, else ``1 + G``
    (``P(|K| = m) = 2(1 − q) q^m / (1 + q)`` is that share of ``(1 − q) q^{m−1}``),
    with a fair sign: one geometric a draw, not the two of ``G₁ − G₂``. The zero's
    coin is drawn for its rarer side, like the digits' (module docstring): as
    ``tanh`` it rounds to 1 near ``rate`` 38, where ``P(K ≠ 0)`` would be lost."""
    magnitude = 1.0 + geometric(rate, n, rng)
    p_zero = math.tanh(rate / 2.0)
    if p_zero <= 0.5:
        zero = _words(n, rng) < np.uint64(_threshold(p_zero))
    else:  # P(K ≠ 0) = 2 / (1 + e^rate), to float precision however small
        zero = _words(n, rng) >= np.uint64(_threshold(2.0 / (1.0 + math.exp(min(rate, 700.0)))))
    magnitude[zero] = 0.0
    negative = rng.integers(0, 2, size=n, dtype=np.uint8).astype(bool)
    out: FloatArray = np.where(negative, -magnitude, magnitude)
    out += 0.0  # −0.0 + 0.0 is +0.0: a zero's sign is not a second coin in the output
    return out


def _threshold(p: float) -> int:
    """A coin of probability ``p ≤ ½`` as a bound on a uniform 64-bit word."""
    return int(p * _TWO_64)


def _words(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` uniform 64-bit words, whatever the generator's word size (``random_raw``
    of a 32-bit generator such as MT19937 gives 32-bit words)."""
    return rng.integers(0, 1 << 64, size=n, dtype=np.uint64, endpoint=False)
