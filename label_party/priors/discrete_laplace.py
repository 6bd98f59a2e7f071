"""Exact sampling from the discrete Laplace distribution in integer arithmetic.

``DLap(b)`` on the integers has ``P[X = x] = (1 − q) / (1 + q) · q^|x|`` with
``q = exp(−1/b)``. Adding ``DLap(Δ/ε)`` to an integer-valued query of L1
sensitivity Δ is ε-DP (discrete Laplace / geometric mechanism; Definition 22 of
``rr-on-bins-regression.txt``).

Why not ``numpy.random.laplace`` or inverse-CDF sampling in floats: Mironov
("On Significance of the Least Significant Bits for Differential Privacy",
CCS 2012) shows that floating-point Laplace samplers leave gaps and biased low
bits that break the privacy guarantee. DESIGN.md §3.5 therefore requires an exact
sampler for additive noise on counts. This module implements Canonne, Kamath and
Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020):
Algorithm 1 (a Bernoulli(exp(−γ)) coin for rational γ, by von Neumann's series
trick) and Algorithm 2 (discrete Laplace with rational scale t/s). Every decision
is a comparison of integers drawn by ``rng.randrange``/``rng.getrandbits``; the
scale is a :class:`fractions.Fraction` and no float is ever formed.

Pure Python: this is used for O(K) or O(groups·K) draws per release, not per
label (about 4–6·10⁴ draws/s per core from the OS source, 1.5–2.7·10⁵ from
random.Random; scale 0.5 to 670).
"""

from __future__ import annotations

import os
import random
from fractions import Fraction
from typing import Protocol

import numpy as np

from label_party.mechanisms.base import IntArray, MechanismError

__all__ = [
    "BufferedSystemRandom",
    "IntegerRandom",
    "bernoulli_exp",
    "sample_discrete_laplace",
]


class IntegerRandom(Protocol):
    """The part of :class:`random.Random` the exact samplers use: integers only."""

    def randrange(self, start: int, stop: int | None = ..., step: int = ...) -> int: ...

    def getrandbits(self, k: int, /) -> int: ...


class BufferedSystemRandom(random.SystemRandom):
    """:class:`random.SystemRandom` whose bits come from ``os.urandom`` in 4 KiB reads.

    ``SystemRandom`` makes one system call per ``getrandbits``; the exact samplers
    make several calls per draw, so buffering is what makes the default source
    (the OS CSPRNG, DESIGN.md §3.5) fast enough. The bits are the same OS bits.
    ``randrange`` inherits :meth:`random.Random._randbelow_with_getrandbits`
    (exact rejection sampling), so it draws only through :meth:`getrandbits`.
    """

    _CHUNK = 4096

    def __init__(self) -> None:
        super().__init__()
        self._buf = b""
        self._pos = 0

    def getrandbits(self, k: int, /) -> int:
        if k < 0:
            raise ValueError("number of bits must be non-negative")
        if k == 0:
            return 0
        nbytes = (k + 7) // 8
        if self._pos + nbytes > len(self._buf):
            self._buf = os.urandom(max(self._CHUNK, nbytes))
            self._pos = 0
        chunk = self._buf[self._pos : self._pos + nbytes]
        self._pos += nbytes
        return int.from_bytes(chunk, "little") >> (nbytes * 8 - k)

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        if stop is None and step == 1 and type(start) is int and start > 0:
            # Fast path for randrange(n): rejection sampling on n.bit_length() bits,
            # exactly as random.Random._randbelow_with_getrandbits does.
            k = start.bit_length()
            r = self.getrandbits(k)
            while r >= start:
                r = self.getrandbits(k)
            return r
        return super().randrange(start, stop, step)


def _default_rng() -> IntegerRandom:
    # A fresh OS-backed generator (DESIGN.md §3.5); it has no state to seed.
    return BufferedSystemRandom()


def _as_fraction(x: Fraction | int, what: str) -> Fraction:
    if isinstance(x, bool) or not isinstance(x, Fraction | int):
        raise MechanismError(
            f"{what} must be an int or fractions.Fraction (convert a float exactly "
            f"with Fraction(x)), got {type(x).__name__}"
        )
    return Fraction(x)


def _bernoulli_ratio(rng: IntegerRandom, num: int, den: int) -> bool:
    """Bernoulli(num/den) for integers 0 ≤ num ≤ den, den ≥ 1."""
    return rng.randrange(den) < num


def _bernoulli_exp_unit(rng: IntegerRandom, num: int, den: int) -> bool:
    """Bernoulli(exp(−num/den)) for 0 ≤ num/den ≤ 1 (CKS 2020, Algorithm 1, first case).

    Draw A_k ~ Bernoulli(γ/k) for k = 1, 2, … until the first A_k = 0; return
    whether that k is odd. P[k odd] = Σ_j (−γ)^j / j! = exp(−γ).
    """
    k = 1
    while rng.randrange(den * k) < num:  # A_k ~ Bernoulli(γ/k), γ = num/den
        k += 1
    return k % 2 == 1


def _bernoulli_exp_minus_one(rng: IntegerRandom) -> bool:
    """Bernoulli(exp(−1)): the unit case with γ = 1, A_k ~ Bernoulli(1/k).

    A_1 ~ Bernoulli(1) is always 1, so the loop starts at k = 2.
    """
    k = 2
    while rng.randrange(k) == 0:
        k += 1
    return k % 2 == 1


def bernoulli_exp(gamma: Fraction | int, *, rng: IntegerRandom | None = None) -> bool:
    """One exact draw of Bernoulli(exp(−γ)) for a rational γ ≥ 0.

    Canonne, Kamath and Steinke (2020), Algorithm 1: for γ > 1, exp(−γ) is the
    product of ⌊γ⌋ coins of exp(−1) and one of exp(−(γ − ⌊γ⌋)).
    """
    g = _as_fraction(gamma, "gamma")
    if g < 0:
        raise MechanismError("gamma must be >= 0")
    rng = rng if rng is not None else _default_rng()
    whole = g.numerator // g.denominator
    for _ in range(whole):
        if not _bernoulli_exp_minus_one(rng):
            return False
    rest = g - whole
    return _bernoulli_exp_unit(rng, rest.numerator, rest.denominator)


def _discrete_laplace_ts(rng: IntegerRandom, t: int, s: int) -> int:
    """One draw of DLap(t/s), i.e. P[Y = y] ∝ exp(−s·|y|/t) (CKS 2020, Algorithm 2).

    X = U + t·V with U uniform on {0..t−1} accepted w.p. exp(−U/t) and V a
    geometric count of exp(−1) coins is geometric: P[X = x] ∝ exp(−x/t). Then
    Y = ⌊X/s⌋ is geometric with ratio exp(−s/t), and a random sign with "−0"
    rejected gives the two-sided distribution.
    """
    while True:
        u = rng.randrange(t) if t > 1 else 0
        if u and not _bernoulli_exp_unit(rng, u, t):
            continue
        v = 0
        while _bernoulli_exp_minus_one(rng):
            v += 1
        y = (u + t * v) // s
        negative = rng.getrandbits(1) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def sample_discrete_laplace(
    scale: Fraction | int, size: int, *, rng: IntegerRandom | None = None
) -> IntArray:
    """``size`` independent exact draws from DLap(scale) as an int64 array.

    ``scale`` is the Laplace scale b (Δ/ε for sensitivity Δ), given exactly as an
    ``int`` or :class:`fractions.Fraction`; a float ``x`` converts exactly with
    ``Fraction(x)``. ``rng`` needs only ``randrange`` and ``getrandbits``
    (:class:`random.Random` in tests); it defaults to :class:`BufferedSystemRandom` (OS bits).
    """
    b = _as_fraction(scale, "scale")
    if b <= 0:
        raise MechanismError("scale must be > 0")
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 0:
        raise MechanismError(f"size must be a non-negative integer, got {size!r}")
    rng = rng if rng is not None else _default_rng()
    t, s = b.numerator, b.denominator
    draws = [_discrete_laplace_ts(rng, t, s) for _ in range(int(size))]
    out: IntArray = np.array(draws, dtype=np.int64)
    return out
