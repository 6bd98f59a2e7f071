"""Integer noise without float holes, and continuous mechanisms on a label-independent
lattice (Mironov, CCS 2012; a reviewer's reproduction below)."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from label_party.mechanisms import additive, lattice
from label_party.mechanisms.base import MechanismError
from label_party.mechanisms.lattice import LATTICE_STEPS, geometric, two_sided_geometric
from label_party.mechanisms.registry import fit

SEED = 20261124


@pytest.mark.parametrize("rate", [0.05, 0.7, 3.0])
def test_geometric_draws_follow_their_pmf(rate: float) -> None:
    n = 400_000
    draws = geometric(rate, n, np.random.default_rng(SEED))
    assert np.array_equal(draws, np.round(draws)) and draws.min() >= 0
    q = math.exp(-rate)
    top = int(np.quantile(draws, 0.999))
    expected = (1 - q) * q ** np.arange(top + 1) * n
    observed = np.bincount(draws.astype(np.int64), minlength=top + 1)[: top + 1]
    # The tail beyond ``top`` as one more cell.
    expected = np.append(expected, n - expected.sum())
    observed = np.append(observed, n - observed.sum())
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def test_each_binary_digit_is_its_own_coin() -> None:
    """The digits of a geometric are independent coins with P(b_i = 1) =
    1/(1 + e^{2^i·rate}); the sampler's digits have those frequencies."""
    rate, n = 1 / 4096, 200_000
    draws = geometric(rate, n, np.random.default_rng(SEED)).astype(np.int64)
    for i in (0, 6, 12, 14):
        p = 1 / (1 + math.exp(2**i * rate))
        seen = ((draws >> i) & 1).mean()
        assert abs(seen - p) < 5 * math.sqrt(p * (1 - p) / n), (i, seen, p)


@pytest.mark.parametrize(
    ("rate", "half_width", "bits"),
    [(0.4, 15, np.random.PCG64), (3.0, 3, np.random.PCG64), (0.02, 300, np.random.PCG64),
     (0.4, 15, np.random.MT19937), (0.4, 15, np.random.Philox)],
)  # fmt: skip
def test_two_sided_geometric_is_the_discrete_laplace(
    rate: float, half_width: int, bits: type[np.random.BitGenerator]
) -> None:
    """Cell by cell, 0 and the tails included (a zero counted twice, or a zero's
    coin off, fails at every rate: 3.0 puts 91 % of the mass on 0), with any bit
    generator: MT19937's raw words have 32 bits, and as 64-bit coins every one
    came up heads (P(K = 0) was 1)."""
    n = 300_000
    raw = two_sided_geometric(rate, n, np.random.Generator(bits(SEED)))
    assert not np.signbit(raw[raw == 0]).any()
    draws = raw.astype(np.int64)
    q = math.exp(-rate)
    ks = np.arange(-half_width, half_width + 1)
    expected = (1 - q) / (1 + q) * q ** np.abs(ks) * n
    observed = np.array([(draws == k).sum() for k in ks])
    expected = np.append(expected, n - expected.sum())
    observed = np.append(observed, n - observed.sum())
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def test_a_large_rate_keeps_its_rare_nonzero_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawn as ``tanh(rate/2)``, P(K = 0) rounds to 1 from rate 38 on and the coin
    gave K ≠ 0 with probability 2⁻⁶⁴ instead of 2/(1 + e^rate) (4·10⁻¹⁷ at 39): an
    effective ε of 45. Words just under that probability's bound give K ≠ 0."""
    rate = 39.0
    bound = 2.0 / (1.0 + math.exp(rate)) * 2.0**64  # about 747 of 2⁶⁴ words
    for word, nonzero in ((int(bound) - 40, True), (int(bound) + 40, False)):
        words = np.uint64(word)
        monkeypatch.setattr(lattice, "_words", lambda n, rng, w=words: np.full(n, w))
        draws = two_sided_geometric(rate, 1_000, np.random.default_rng(SEED))
        assert np.all((draws != 0) == nonzero), word
        assert np.all(np.abs(draws) <= 1)  # the digits' coins: far rarer still


def _realized_discrete_laplace(rate: float, k: int) -> Fraction:
    """``P(K = k)`` as the sampler realizes it, exactly, from its coin counts."""
    quanta = lattice.COIN_QUANTA
    count, zero_is_rare = lattice.zero_count(rate)
    p_zero = Fraction(count, quanta) if zero_is_rare else 1 - Fraction(count, quanta)
    if k == 0:
        return p_zero
    g = abs(k) - 1
    digits = lattice.digit_counts(rate)
    if g >> len(digits):
        return Fraction(0)
    p_g = Fraction(1)
    for i, c in enumerate(digits):
        p_g *= Fraction(c, quanta) if (g >> i) & 1 else 1 - Fraction(c, quanta)
    return (1 - p_zero) * p_g / 2


@pytest.mark.parametrize(
    "rate",
    [1e-12 / LATTICE_STEPS, 1e-8 / LATTICE_STEPS, 1 / LATTICE_STEPS, 0.4, 20.0, 25.0],
)
def test_the_realized_discrete_laplace_steps_by_e_to_the_rate(rate: float) -> None:
    """Neighbouring outputs of the realized law differ by ``e^rate`` to 10⁻²⁰, the
    zero included, wherever they are likelier than 2⁻⁶⁴ (a coin of probability p
    is off by 2⁻¹²⁸/p). With 64-bit coins of float probabilities the zero was off by
    2⁻⁶⁴/P(K = 0): at ε = 10⁻⁸ on the lattice the realized loss between K = 0 and
    K = 1 was 63 ε, and at rate 20 the ratio was e^20·(1 + 9·10⁻¹²) (helper-69)."""
    with localcontext() as ctx:
        ctx.prec = 60
        step = Decimal(rate).exp()
        for k in (0, 1, 2, 3, 7, 8, 1023, 1024):
            here, there = (
                _realized_discrete_laplace(rate, k),
                _realized_discrete_laplace(rate, k + 1),
            )
            if there < Fraction(1, 1 << 64):
                break
            ratio = Decimal(here.numerator) / Decimal(here.denominator)
            ratio /= Decimal(there.numerator) / Decimal(there.denominator)
            assert abs(ratio / step - 1) < Decimal("1e-20"), (rate, k, ratio / step - 1)


@pytest.mark.parametrize(
    ("epsilon", "bounds", "params"),
    [(1e-12, (-(2.0**51), 2.0**51), {"discrete": True, "clip": True}),
     (1e-12, (0.0, 1.0), {"clip": True})],
)  # fmt: skip
def test_noise_finer_than_62_digits_hold_is_refused_at_the_fit(
    epsilon: float, bounds: tuple[float, float], params: dict[str, bool]
) -> None:
    """Below MIN_RATE the 62 digits draw G mod 2⁶², not G: at ε = 10⁻¹² over 2⁵²
    integer steps every digit was a fair coin and the realized loss of the domain's
    edge was 10⁹ ε (helper-74). Just above it, the digits hold all but 2⁻¹²⁸."""
    with pytest.raises(MechanismError, match="finer than this service draws exactly"):
        fit("laplace", epsilon=epsilon, values=np.array(bounds), prior=np.array([0.5, 0.5]),
            domain=bounds, params=params)  # fmt: skip
    assert math.exp(-lattice.MIN_RATE * 2.0**62) <= 2.0**-128
    assert len(lattice.digit_counts(lattice.MIN_RATE)) == 62


def test_a_coin_whose_first_word_ties_is_decided_by_the_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A count of 2¹²⁸ draws is compared in two words: the second is drawn only
    where the first equals the count's high word."""
    count = (5 << 64) + 1000
    streams = iter([np.array([4, 5, 5, 6], np.uint64), np.array([999, 1000], np.uint64)])
    monkeypatch.setattr(lattice, "_words", lambda n, rng: next(streams)[:n])
    got = lattice.coins(count, 4, np.random.default_rng(SEED))
    assert got.tolist() == [True, True, False, False]


_UNIFORMS = 1 << 53  # Generator.random's outputs: k·2⁻⁵³


def _exponential_law(rate: float, n: int) -> list[int]:
    """``ExponentialMechanism.sample``'s realized law from cell ``n``, exactly: how
    many of the 2¹⁰⁶ pairs of uniforms land on each cell, found by bisection on
    the float formulas it evaluates (each is monotone in its uniform)."""
    last = float(LATTICE_STEPS - 1)
    right_len, left_len = last - n + 1.0, float(n)
    m_right = -math.expm1(-rate * right_len)
    m_left = math.exp(-rate) * -math.expm1(-rate * left_len)
    lo, hi = 0, _UNIFORMS  # uniforms going right: a prefix
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if mid * 2.0**-53 * (m_left + m_right) < m_right else (lo, mid)
    right = lo

    def distances(length: float) -> np.ndarray:
        size = int(length)
        targets = np.arange(size + 1, dtype=np.float64)
        first, past = np.zeros(size + 1, np.int64), np.full(size + 1, _UNIFORMS, np.int64)
        for _ in range(54):  # the first uniform whose distance reaches each target
            mid = (first + past) // 2
            u = np.minimum(mid, _UNIFORMS - 1).astype(np.float64) * 2.0**-53
            d = np.floor(np.log1p(u * math.expm1(-rate * length)) / -rate)
            reached = (np.minimum(d, length - 1.0) >= targets) & (mid < _UNIFORMS)
            past, first = np.where(reached, mid, past), np.where(reached, first, mid + 1)
        first[0], first[size] = 0, _UNIFORMS
        return np.diff(first)

    law = [0] * LATTICE_STEPS
    for d, count in enumerate(distances(right_len)):
        law[n + d] += right * int(count)
    if n:
        for d, count in enumerate(distances(left_len)):
            law[n - 1 - d] += (_UNIFORMS - right) * int(count)
    return law


@pytest.mark.slow
def test_the_exponential_mechanism_keeps_e_to_the_epsilon_from_its_least_epsilon() -> None:
    """Realized, cell by cell, between the ends and the middle, at the least ε it
    runs at; below it, refused at the fit. Its float sampler errs by about 3·10⁻¹¹
    relative whatever ε: at ε = 10⁻¹² it realized a loss of 31 ε (helper-69)."""
    epsilon = additive.EXPONENTIAL_MIN_EPSILON
    rate = epsilon / (2.0 * (LATTICE_STEPS - 1))
    laws = [_exponential_law(rate, n) for n in (0, 1, LATTICE_STEPS // 2, LATTICE_STEPS - 1)]
    with localcontext() as ctx:
        ctx.prec = 40
        bound = Decimal(epsilon).exp()
        for a in laws:
            for b in laws:
                assert max(Decimal(x) / Decimal(y) for x, y in zip(a, b, strict=True)) <= bound
    from shared.protocol import float_below

    at_least = float_below(Decimal("0.000000001"))  # what a release at "1e-9" runs at
    fit("exponential", epsilon=at_least, values=np.array([0.0, 1.0]),
        prior=np.array([0.5, 0.5]), domain=(0.0, 1.0))  # fmt: skip
    with pytest.raises(MechanismError, match="exponential runs at"):
        fit("exponential", epsilon=epsilon / 2, values=np.array([0.0, 1.0]),
            prior=np.array([0.5, 0.5]), domain=(0.0, 1.0))  # fmt: skip


def _porous(outputs: np.ndarray) -> float:
    """The reviewer's test: outputs in (0, ½) that are not multiples of 2⁻⁵³. From
    ``y = 1`` on [0, 1], ``fl(1 + Z)`` there always is one; from ``y = 0`` not."""
    inside = (outputs > 0) & (outputs < 0.5)
    scaled = np.ldexp(outputs, 53)
    return float((inside & (scaled != np.round(scaled))).mean())


@pytest.mark.parametrize(
    ("name", "params"),
    [("laplace", {}), ("laplace", {"clip": True}), ("staircase", {}), ("exponential", {})],
)
def test_an_output_s_low_bits_do_not_tell_the_label(name: str, params: dict[str, bool]) -> None:
    """``fl(y + Z)`` ruled a label out for certain in 14–38 % of draws (laplace 0.136
    and 0; exponential 0.382 and 0; staircase 0.153 and 0). On the lattice every
    output from either label is ``lo + h·j`` (cell centres for the exponential)."""
    mech = fit(name, epsilon=1.0, values=np.array([0.0, 1.0]), prior=np.array([0.5, 0.5]),
               domain=(0.0, 1.0), params=params)  # fmt: skip
    rng = np.random.default_rng(SEED)
    h = 1.0 / LATTICE_STEPS
    for y in (0.0, 1.0, 0.3):
        out = mech.sample(np.full(200_000, y), rng=rng)
        assert _porous(out) == 0.0
        index = out / h - (0.5 if name == "exponential" else 0.0)
        assert np.array_equal(index, np.round(index)), (name, y)


def test_the_lattice_keeps_the_noise_s_law() -> None:
    """Unclipped lattice Laplace: mean y, variance 2(Δ/ε)² (+ at most h²/4)."""
    mech = fit("laplace", epsilon=0.5, values=np.array([0.0, 4.0]), prior=np.array([0.5, 0.5]),
               domain=(0.0, 4.0))  # fmt: skip
    out = mech.sample(np.full(400_000, 1.234), rng=np.random.default_rng(SEED))
    scale = 4.0 / 0.5
    assert abs(out.mean() - 1.234) < 5 * math.sqrt(2) * scale / math.sqrt(out.size)
    assert out.var() == pytest.approx(2 * scale**2, rel=0.02)
