"""Private priors: the exact discrete Laplace sampler and the noisy histograms."""

from __future__ import annotations

import ast
import inspect
import math
import random
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy import stats

import label_party.priors as priors
from label_party.mechanisms.base import MechanismError
from label_party.priors import (
    BufferedSystemRandom,
    bernoulli_exp,
    default_prior_epsilon,
    group_counts,
    group_histograms,
    label_counts,
    laplace_histogram,
    noise_scale,
    sample_discrete_laplace,
)
from label_party.priors import discrete_laplace as dl_module
from label_party.priors import histogram as histogram_module

SEED = 20261122


class IntegersOnly:
    """A source with randrange/getrandbits and nothing else: no random(), no floats."""

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)
        self.calls = 0

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        assert all(isinstance(a, int) for a in (start, stop or 0, step)), "non-integer argument"
        self.calls += 1
        return self._r.randrange(start, stop, step)

    def getrandbits(self, k: int, /) -> int:
        self.calls += 1
        return self._r.getrandbits(k)


def _dlap_pmf(x: np.ndarray, scale: float) -> np.ndarray:
    q = math.exp(-1.0 / scale)
    return np.asarray((1 - q) / (1 + q) * q ** np.abs(x), dtype=np.float64)


def _chi_square_against_pmf(draws: np.ndarray, scale: float) -> float:
    n = draws.size
    q = math.exp(-1.0 / scale)
    # Support cut where the expected count per cell falls below 5; tails pooled.
    m = 0
    while n * _dlap_pmf(np.array([m + 1]), scale)[0] >= 5:
        m += 1
    xs = np.arange(-m, m + 1)
    expected = n * _dlap_pmf(xs, scale)
    tail = n * (1 - q) / (1 + q) * q ** (m + 1) / (1 - q)  # P[X > m] = P[X < −m]
    observed = np.array([np.count_nonzero(draws == x) for x in xs])
    obs = np.concatenate([[np.count_nonzero(draws < -m)], observed, [np.count_nonzero(draws > m)]])
    exp = np.concatenate([[tail], expected, [tail]])
    np.testing.assert_allclose(exp.sum(), n, rtol=1e-9)
    return float(stats.chisquare(obs, exp).pvalue)


# -- the exact sampler ---------------------------------------------------------------


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(2), Fraction(20)])
def test_discrete_laplace_matches_its_pmf(scale: Fraction) -> None:
    draws = sample_discrete_laplace(scale, 20_000, rng=random.Random(SEED))
    assert draws.dtype == np.int64
    b = float(scale)
    assert _chi_square_against_pmf(draws, b) > 1e-4
    q = math.exp(-1.0 / b)
    sd = math.sqrt(2 * q / (1 - q) ** 2)
    assert abs(draws.mean()) < 5 * sd / math.sqrt(draws.size)


def test_discrete_laplace_with_a_scale_from_a_float_epsilon() -> None:
    scale = Fraction(2) / Fraction(0.3)  # exact: the float 0.3 as a rational
    assert scale.denominator > 1000  # a genuinely awkward rational
    draws = sample_discrete_laplace(scale, 20_000, rng=random.Random(SEED + 1))
    assert _chi_square_against_pmf(draws, float(scale)) > 1e-4


def test_sampler_decides_with_integers_only() -> None:
    rng = IntegersOnly(SEED)
    x = sample_discrete_laplace(Fraction(7, 3), 1, rng=rng).tolist()[0]
    assert type(x) is int
    draws = sample_discrete_laplace(Fraction(7, 3), 2000, rng=rng)
    assert rng.calls > 2000
    assert _chi_square_against_pmf(draws, 7 / 3) > 1e-4
    # Same seed, same draws: the stream is consumed only through the integer API.
    again = sample_discrete_laplace(Fraction(7, 3), 2000, rng=IntegersOnly(SEED))
    first = sample_discrete_laplace(Fraction(7, 3), 2000, rng=IntegersOnly(SEED))
    np.testing.assert_array_equal(first, again)


def test_sampler_source_has_no_floating_point() -> None:
    """No float literal, float(), math, or float-valued random call in the sampler."""
    tree = ast.parse(inspect.getsource(dl_module))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            assert not isinstance(node.value, float), f"float literal line {node.lineno}"
        if isinstance(node, ast.Name):
            assert node.id not in {"float", "math"}, f"{node.id} line {node.lineno}"
        if isinstance(node, ast.Attribute):
            forbidden = {"random", "uniform", "exp", "log", "expovariate"}
            assert node.attr not in forbidden, f".{node.attr} line {node.lineno}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = {a.name for a in node.names} | {getattr(node, "module", None)}
            assert "math" not in names


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2)])
def test_bernoulli_exp(gamma: Fraction) -> None:
    rng = random.Random(SEED + 2)
    n = 20_000
    hits = sum(bernoulli_exp(gamma, rng=rng) for _ in range(n))
    p = math.exp(-float(gamma))
    assert abs(hits - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1e-9


@pytest.mark.parametrize(
    ("scale", "size"), [(0.5, 3), (Fraction(0), 3), (Fraction(-1), 3), (Fraction(1), -1)]
)
def test_sampler_rejects(scale: Any, size: int) -> None:
    with pytest.raises(MechanismError):
        sample_discrete_laplace(scale, size, rng=random.Random(0))


def test_default_source_is_the_os() -> None:
    a = sample_discrete_laplace(Fraction(1000), 8)
    b = sample_discrete_laplace(Fraction(1000), 8)
    assert not np.array_equal(a, b)
    rng = BufferedSystemRandom()
    assert all(0 <= rng.getrandbits(k) < 2**k for k in (1, 7, 8, 9, 64, 200) for _ in range(50))
    counts = np.bincount([rng.randrange(3) for _ in range(30_000)], minlength=3)
    assert stats.chisquare(counts).pvalue > 1e-4
    assert 5 <= rng.randrange(5, 10, 2) < 10  # the general form still works


# -- histograms -------------------------------------------------------------------


def test_noise_scale_is_exactly_two_over_epsilon() -> None:
    assert noise_scale(0.5) == 4
    assert noise_scale(0.1) == Fraction(2) / Fraction(0.1)
    assert noise_scale(Decimal("0.1")) == 20  # the ledger's Decimal, exactly
    assert noise_scale(Fraction(1, 3)) == 6
    for bad in (0.0, -1, Decimal("NaN"), float("inf"), True, "1"):
        with pytest.raises(MechanismError):
            noise_scale(bad)  # type: ignore[arg-type]


def test_histogram_sensitivity_under_label_substitution() -> None:
    """Replacing one label moves the count vector by exactly 2 in L1 (0 if unchanged)."""
    rng = np.random.default_rng(SEED)
    num_bins, num_groups = 7, 4
    for _ in range(200):
        n = int(rng.integers(1, 60))
        labels = rng.integers(0, num_bins, size=n)
        groups = rng.integers(0, num_groups, size=n)
        i = int(rng.integers(0, n))
        neighbour = labels.copy()
        neighbour[i] = rng.integers(0, num_bins)
        moved = 0 if neighbour[i] == labels[i] else 2
        d = np.abs(label_counts(labels, num_bins) - label_counts(neighbour, num_bins)).sum()
        assert d == moved
        _, a = group_counts(labels, groups, num_bins, num_groups=num_groups)
        _, b = group_counts(neighbour, groups, num_bins, num_groups=num_groups)
        assert np.abs(a - b).sum() == moved
        assert np.count_nonzero(np.abs(a - b).sum(axis=1)) == (moved > 0)  # one group only


def test_histograms_are_noised_with_scale_two_over_epsilon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[Fraction, int]] = []
    real = sample_discrete_laplace

    def spy(scale: Fraction, size: int, *, rng: Any = None) -> np.ndarray:
        seen.append((scale, size))
        return real(scale, size, rng=rng)

    monkeypatch.setattr(histogram_module, "sample_discrete_laplace", spy)
    laplace_histogram(np.array([0, 1, 1]), 5, epsilon=0.25, rng=random.Random(0))
    group_histograms(np.array([0, 1, 1]), np.array([0, 0, 2]), 5, epsilon=0.5, num_groups=3)
    assert seen == [(Fraction(8), 5), (Fraction(4), 15)]


def test_laplace_histogram_is_a_probability_vector() -> None:
    rng = random.Random(SEED)
    labels = np.random.default_rng(SEED).integers(0, 6, size=500)
    for eps in (0.01, 0.5, 5.0):
        p = laplace_histogram(labels, 6, epsilon=eps, rng=rng)
        assert p.shape == (6,) and p.dtype == np.float64
        assert np.all(p >= 0) and p.sum() == pytest.approx(1.0)
    # With ε huge the noise is 0 (P[X ≠ 0] ≈ 2e^{-500}): the empirical histogram.
    p = laplace_histogram(labels, 6, epsilon=1000.0, rng=rng)
    np.testing.assert_allclose(p, np.bincount(labels, minlength=6) / labels.size)
    # Nothing to count and no noise: every count clips to 0 → uniform.
    empty = laplace_histogram(np.array([], dtype=np.int64), 4, epsilon=1000.0, rng=rng)
    np.testing.assert_allclose(empty, 0.25)


def test_noisy_counts_follow_the_discrete_laplace() -> None:
    """Unnormalized, a one-bin-per-count histogram is counts + DLap(2/ε)."""
    eps = 0.8
    counts = np.full(30_000, 1000)
    noise = sample_discrete_laplace(noise_scale(eps), counts.size, rng=random.Random(SEED))
    assert _chi_square_against_pmf(noise, 2 / eps) > 1e-4


def test_histogram_validates_without_echoing_labels() -> None:
    with pytest.raises(MechanismError) as info:
        laplace_histogram(np.array([0, 1, 17]), 4, epsilon=1.0)
    assert "17" not in str(info.value)
    with pytest.raises(MechanismError):
        laplace_histogram(np.array([0.5]), 4, epsilon=1.0)
    with pytest.raises(MechanismError):
        laplace_histogram(np.array([0]), 0, epsilon=1.0)
    with pytest.raises(MechanismError):
        group_histograms(np.array([0, 1]), np.array([0]), 4, epsilon=1.0)
    with pytest.raises(MechanismError):
        group_histograms(np.array([0, 1]), np.array([0, 5]), 4, epsilon=1.0, num_groups=3)


def test_group_histograms_shape_and_empty_groups() -> None:
    rng = np.random.default_rng(SEED)
    labels = rng.integers(0, 5, size=3000)
    groups = rng.choice([0, 1, 3], size=3000)  # group 2 is declared but empty
    ids, p = group_histograms(labels, groups, 5, epsilon=1.0, num_groups=4, rng=random.Random(SEED))
    np.testing.assert_array_equal(ids, np.arange(4))
    assert p.shape == (4, 5)
    assert np.all(p >= 0)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    # Without declared groups: the (label-independent) ids present, in order.
    ids, p = group_histograms(labels, groups + 10, 5, epsilon=1.0, rng=random.Random(SEED))
    np.testing.assert_array_equal(ids, [10, 11, 13])
    assert p.shape == (3, 5)
    # Exact at huge ε: row g is group g's empirical histogram; the empty row uniform.
    ids, p = group_histograms(
        labels, groups, 5, epsilon=1000.0, num_groups=4, rng=random.Random(SEED)
    )
    for g in (0, 1, 3):
        h = np.bincount(labels[groups == g], minlength=5)
        np.testing.assert_allclose(p[g], h / h.sum())
    np.testing.assert_allclose(p[2], 0.2)


def test_default_prior_epsilon() -> None:
    assert default_prior_epsilon(num_values=10, num_labels=1000, epsilon=1.0) == pytest.approx(0.1)
    assert default_prior_epsilon(num_values=10, num_labels=1000, epsilon=0.1) == pytest.approx(0.05)
    assert default_prior_epsilon(num_values=401, num_labels=10**6, epsilon=2.0) == pytest.approx(
        math.sqrt(401 / 10**6)
    )
    assert default_prior_epsilon(num_values=3, num_labels=0, epsilon=1.0) == 0.5
    with pytest.raises(MechanismError):
        default_prior_epsilon(num_values=0, num_labels=10, epsilon=1.0)
    with pytest.raises(MechanismError):
        default_prior_epsilon(num_values=3, num_labels=10, epsilon=-1.0)


def test_public_surface_is_complete() -> None:
    exported = set(priors.__all__)
    assert exported == set(dl_module.__all__) | set(histogram_module.__all__)
    for name in exported:
        assert getattr(priors, name) is not None
    for module in (dl_module, histogram_module):
        public = {
            n
            for n, obj in vars(module).items()
            if not n.startswith("_")
            and (inspect.isfunction(obj) or inspect.isclass(obj))
            and obj.__module__ == module.__name__
        }
        assert public <= set(module.__all__), public - set(module.__all__)
