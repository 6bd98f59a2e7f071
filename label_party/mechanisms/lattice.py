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
compared against a uniform 128-bit integer. Every value of ``G`` below ``2^I`` is
reachable, ``I`` the first digit whose coin rounds to 0 (``P(G ≥ 2^I)`` below
2⁻¹²⁸), or 62 (a rate below :data:`MIN_RATE`, refused where a mechanism is
fitted). Each coin is drawn for its rarer side, whose probability ``p ≤ ½`` is
computed in decimal to 80 digits and floored to a count of 2¹²⁸ draws, so it is
off by a relative 2⁻¹²⁸/p at most: the privacy loss of every output is that of
the exact law to that precision, and outputs rarer than 2⁻¹²⁸ may not occur at
all (the support ends there). Coins against 64 bits with float probabilities
were off by 2⁻⁶⁴/p, which the zero of a discrete Laplace at a tiny rate made
large: at ε = 10⁻⁸ on the lattice (rate ε/2¹⁶, P(K = 0) ≈ 10⁻¹⁴) the realized
loss of a neighbouring output was 63 ε (helper-69).

A coin compares the first 64-bit word with its count's high word and draws the
second only where they tie (probability 2⁻⁶⁴), so it costs what a 64-bit coin did.
"""

from __future__ import annotations

import math
import sys
from decimal import ROUND_FLOOR, Decimal, localcontext
from functools import lru_cache

import numpy as np

from label_party.mechanisms.base import FloatArray

#: Lattice steps across a continuous domain: h = Δ / 2¹⁶, far finer than any noise
#: (scale Δ/ε), so the rounding adds at most h²/4 to the squared loss.
LATTICE_STEPS = 1 << 16
#: The least lattice step: the smallest normal double. A subnormal step holds fewer
#: digits, and one that underflows to 0 released every label exactly (helper-86).
MIN_LATTICE_STEP = sys.float_info.min

#: A coin is a count of this many equally likely draws (two 64-bit words).
COIN_QUANTA = 1 << 128

#: Decimal digits a coin's probability is computed to (rates reach :data:`MIN_RATE`,
#: 2·10⁻¹⁷, where ``1 − e^{−rate}`` keeps 60 of them).
_DIGITS = 80

#: Past this exponent ``1/(1 + e^x)`` is below 2⁻¹²⁸: the coin never comes up.
_NEVER = 128 * math.log(2) + 1

_HALF_WORD = 1 << 64

#: The geometric's digits: ``G`` is an int64.
_MAX_DIGITS = 62

#: The least rate whose geometric the 62 digits hold to 2⁻¹²⁸ (``P(G ≥ 2⁶²) =
#: e^{−rate·2⁶²}``). Below it the digits draw ``G mod 2⁶²``, a different law: at
#: ε = 10⁻¹² over 2⁵¹ integer steps every digit was a fair coin and an output's
#: realized loss was 10⁹ ε (helper-74). About ε/Δ < 2·10⁻¹⁷; refused at the fit.
MIN_RATE = _NEVER / 2**_MAX_DIGITS


def geometric(rate: float, n: int, rng: np.random.Generator) -> FloatArray:
    """``n`` draws of ``G`` on ``{0, 1, …}`` with ``P(G = g) = (1 − q) q^g``,
    ``q = e^{−rate}``, digit by digit (module docstring); as floats holding integers."""
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    out = np.zeros(n, dtype=np.int64)
    place = np.empty(n, dtype=np.int64)
    for i, count in enumerate(digit_counts(rate)):
        np.left_shift(coins(count, n, rng), i, out=place, casting="unsafe")
        out |= place
    return out.astype(np.float64)


def two_sided_geometric(rate: float, n: int, rng: np.random.Generator) -> FloatArray:
    """Discrete Laplace: ``P(K = k) = (1 − q)/(1 + q) · q^{|k|}``, ``q = e^{−rate}``.

    ``|K|`` is 0 with probability ``(1 − q)/(1 + q) = tanh(rate/2)``, else ``1 + G``
    (``P(|K| = m) = 2(1 − q) q^m / (1 + q)`` is that share of ``(1 − q) q^{m−1}``),
    with a fair sign: one geometric a draw, not the two of ``G₁ − G₂``. The zero's
    coin is drawn for its rarer side, like the digits' (module docstring): from
    ``rate`` 38 on, ``tanh`` rounds to 1 in floats, where ``P(K ≠ 0)`` would be lost."""
    magnitude = 1.0 + geometric(rate, n, rng)
    count, zero_is_rare = zero_count(rate)
    hit = coins(count, n, rng)
    magnitude[hit if zero_is_rare else ~hit] = 0.0
    negative = rng.integers(0, 2, size=n, dtype=np.uint8).astype(bool)
    out: FloatArray = np.where(negative, -magnitude, magnitude)
    out += 0.0  # −0.0 + 0.0 is +0.0: a zero's sign is not a second coin in the output
    return out


@lru_cache(maxsize=256)
def digit_counts(rate: float) -> tuple[int, ...]:
    """Of :data:`COIN_QUANTA` draws, how many set each binary digit of ``G``:
    ``P(b_i = 1) = q^{2^i}/(1 + q^{2^i}) = 1/(1 + e^{2^i·rate}) ≤ ½``, floored, for
    ``i = 0, 1, …`` up to the first that floors to 0 (at most 62 digits)."""
    counts = []
    for i in range(_MAX_DIGITS):
        exponent = math.ldexp(rate, i)  # exact: a power of two
        if exponent > _NEVER:
            break
        with localcontext() as ctx:
            ctx.prec = _DIGITS
            count = _quanta(1 / (1 + Decimal(exponent).exp()))
        if count == 0:
            break
        counts.append(count)
    return tuple(counts)


@lru_cache(maxsize=256)
def zero_count(rate: float) -> tuple[int, bool]:
    """The discrete Laplace's zero coin for its rarer side: ``(count, True)`` with
    ``P(K = 0) = tanh(rate/2) = (1 − q)/(1 + q)`` when that is at most ½, else
    ``(count, False)`` with ``P(K ≠ 0) = 2q/(1 + q)``."""
    with localcontext() as ctx:
        ctx.prec = _DIGITS
        q = (-Decimal(rate)).exp()
        p_zero = (1 - q) / (1 + q)
        if p_zero <= Decimal("0.5"):
            return _quanta(p_zero), True
        return _quanta(2 * q / (1 + q)), False


def coins(count: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` coins, each true with probability ``count / 2¹²⁸`` exactly: the first
    word decides unless it ties ``count``'s high word; then the second does."""
    high, low = np.uint64(count // _HALF_WORD), np.uint64(count % _HALF_WORD)
    words = _words(n, rng)
    out = words < high
    tied = np.flatnonzero(words == high)
    if tied.size:
        out[tied] = _words(tied.size, rng) < low
    return out


def _quanta(p: Decimal) -> int:
    """``p`` as a whole number of :data:`COIN_QUANTA`, rounded down."""
    return int((p * COIN_QUANTA).to_integral_value(rounding=ROUND_FLOOR))


def _words(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` uniform 64-bit words, whatever the generator's word size (``random_raw``
    of a 32-bit generator such as MT19937 gives 32-bit words)."""
    return rng.integers(0, 1 << 64, size=n, dtype=np.uint64, endpoint=False)
