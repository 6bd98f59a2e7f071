"""Additive-noise mechanisms: Laplace, staircase, exponential (label_party.mechanisms.additive).

Every check here compares against an independent computation — the sampler against
the density (KS / chi-square with a fixed generator), the analytic loss and bias
against Monte Carlo within a few standard errors, the DP guarantee against the
density ratio on a fine grid of outputs and shifts — so a wrong formula fails.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy import optimize, stats

from label_party.mechanisms import additive
from label_party.mechanisms.additive import (
    AdditiveMechanism,
    ExponentialMechanism,
    LaplaceNoise,
    StaircaseNoise,
    continuous_staircase,
    discrete_laplace,
    discrete_staircase,
    optimal_gamma,
    optimal_r,
)
from label_party.mechanisms.base import FitRequest, Loss, Mechanism, MechanismError
from label_party.mechanisms.rounding import round_to_integers

SEED = 20261122
FACTORIES = {
    "laplace": additive.laplace_from_request,
    "staircase": additive.staircase_from_request,
    "exponential": additive.exponential_from_request,
}


def fit(
    name: str,
    *,
    epsilon: float,
    values: np.ndarray,
    prior: np.ndarray,
    loss: Loss = "squared",
    domain: tuple[float, float] | None = None,
    params: dict[str, Any] | None = None,
) -> Any:
    """What ``registry.fit`` does for these three (kept local: the registry imports
    every mechanism module, some of which are being written)."""
    request = FitRequest(
        epsilon=epsilon,
        values=np.asarray(values, dtype=np.float64),
        prior=np.asarray(prior, dtype=np.float64),
        loss=loss,
        domain=domain,
        params=dict(params or {}),
    )
    mech: Mechanism = FACTORIES[name](request)
    return mech


LO, HI = 2.0, 7.0  # continuous domain, Δ = 5
DLO, DHI = 0.0, 6.0  # integer domain, Δ = 6


def _fit(name: str, eps: float, params: dict[str, Any], *, discrete: bool = False) -> Any:
    lo, hi = (DLO, DHI) if discrete else (LO, HI)
    values = np.arange(lo, hi + 1.0) if discrete else np.linspace(lo, hi, 6)
    prior = np.full(values.size, 1.0 / values.size)
    return fit(name, epsilon=eps, values=values, prior=prior, domain=(lo, hi), params=params)


def _cdf(noise: Any, z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    out: np.ndarray = np.where(z >= 0, 1.0 - noise.tail(np.abs(z)), noise.tail(np.abs(z)))
    return out


# -- the noise distributions themselves ------------------------------------------------


@pytest.mark.parametrize(
    "noise",
    [
        discrete_staircase(6, 1.0, 2),
        discrete_staircase(6, 0.3, 6),
        discrete_staircase(1, 2.0, 1),
        discrete_laplace(6, 1.0),
    ],
    ids=["stair-r2", "stair-r=Δ", "stair-Δ1", "dlap"],
)
def test_discrete_pmf_sums_and_moments_match_brute_force(noise: StaircaseNoise) -> None:
    k = np.arange(-3000.0, 3001.0)
    pmf = noise.density(k)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert noise.second_moment() == pytest.approx(float((k**2 * pmf).sum()), rel=1e-10)
    assert noise.abs_moment() == pytest.approx(float((np.abs(k) * pmf).sum()), rel=1e-10)
    for c in [0.0, 1.0, 2.0, 5.0, 6.0, 13.0]:
        beyond = k > c
        assert float(noise.tail(np.array(c))) == pytest.approx(pmf[beyond].sum(), rel=1e-10)
        for j in (1, 2):
            brute = float(((k[beyond] ** j - c**j) * pmf[beyond]).sum())
            assert float(noise.excess(np.array(c), j)) == pytest.approx(brute, rel=1e-10)


def test_definition_24_normalizer_counts_the_atom_once() -> None:
    """a(r) = (1−b)/(2r + 2b(Δ−r) − (1−b)), the paper's formula with b = e^{−ε}."""
    eps, d, r = 0.7, 5, 2
    b = math.exp(-eps)
    noise = discrete_staircase(d, eps, r)
    assert noise.level == pytest.approx((1 - b) / (2 * r + 2 * b * (d - r) - (1 - b)))
    assert float(noise.density(np.array(0.0))) == pytest.approx(noise.level)
    assert float(noise.density(np.array(-1.0))) == pytest.approx(noise.level)
    assert float(noise.density(np.array(-2.0))) == pytest.approx(noise.level * b)


def test_discrete_laplace_is_dlap_of_scale_delta_over_epsilon() -> None:
    eps, d = 1.3, 4
    t = math.exp(-eps / d)
    k = np.arange(-10.0, 11.0)
    np.testing.assert_allclose(
        discrete_laplace(d, eps).density(k), (1 - t) / (1 + t) * t ** np.abs(k)
    )
    assert discrete_laplace(d, eps).second_moment() == pytest.approx(2 * t / (1 - t) ** 2)


@pytest.mark.parametrize("eps", [37.5, 40.0, 100.0, 744.0, 800.0])
def test_staircase_noise_samples_where_one_minus_its_decay_rounds_to_one(eps: float) -> None:
    """``1 − e^{−ε}`` is 1.0 in floats past ε ≈ 37.4. The rate read back from it
    raised there, so every such release failed after its ε was reserved."""
    rng = np.random.default_rng(SEED)
    stairs = discrete_staircase(10, eps, 3), continuous_staircase(10.0, eps, 0.3)
    dlap = discrete_laplace(2, 2 * eps)
    assert [noise.rate for noise in (*stairs, dlap)] == [eps, eps, eps]
    # Beyond the central step the mass is at most e^{−ε} < 6e−17: no draw lands there.
    assert np.all(np.abs(stairs[0].sample(10_000, rng)) <= 2)  # {−(r−1), …, r−1}
    assert np.all(np.abs(stairs[1].sample(10_000, rng)) < 3.0)  # (−γΔ, γΔ)
    assert np.all(dlap.sample(10_000, rng) == 0)


@pytest.mark.parametrize("gamma", [0.05, 0.3, 0.9])
def test_continuous_staircase_matches_definition_25(gamma: float) -> None:
    eps, d = 0.8, 5.0
    b = math.exp(-eps)
    noise = continuous_staircase(d, eps, gamma)
    a = (1 - b) / (2 * d * (gamma + b * (1 - gamma)))
    z = np.array(
        [0.0, gamma * d * 0.99, gamma * d, d * 0.999, d, d * (1 + gamma) - 1e-9, -d * (2 - 1e-6)]
    )
    expected = np.array([a, a, a * b, a * b, a * b, a * b, a * b * b])
    np.testing.assert_allclose(noise.density(z), expected)
    # Moments by quadrature of the density over 40 periods.
    grid = np.linspace(0.0, 40 * d, 400_001)
    dens = noise.density(grid)
    step = grid[1] - grid[0]
    assert 2 * np.sum(dens * grid**2) * step == pytest.approx(noise.second_moment(), rel=1e-3)
    assert 2 * np.sum(dens) * step == pytest.approx(1.0, rel=1e-3)


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 3.0, 8.0])
def test_default_gamma_is_geng_viswanath_optimum(eps: float) -> None:
    """Closed forms for γ* agree with numerically minimizing E[Z²] and E|Z|."""
    for loss, moment in (("squared", "second_moment"), ("absolute", "abs_moment")):

        def cost(g: float, moment: str = moment) -> float:
            value: float = getattr(continuous_staircase(1.0, eps, g), moment)()
            return value

        res = optimize.minimize_scalar(
            cost, bounds=(1e-9, 1 - 1e-9), method="bounded", options={"xatol": 1e-10}
        )
        assert optimal_gamma(eps, loss) == pytest.approx(res.x, abs=1e-6)  # type: ignore[arg-type]
    assert optimal_gamma(eps, "absolute") == pytest.approx(1 / (1 + math.exp(eps / 2)))


def test_default_r_minimizes_the_discrete_cost() -> None:
    for d in (1, 2, 6, 25):
        for loss, j in (("squared", 2), ("absolute", 1)):
            costs = [discrete_staircase(d, 0.8, r).half_moment(j) for r in range(1, d + 1)]
            assert optimal_r(d, 0.8, loss) == int(np.argmin(costs)) + 1  # type: ignore[arg-type]


# -- DP ratio ----------------------------------------------------------------------------


def _max_ratio(noise: Any, delta: float, z: np.ndarray, shifts: np.ndarray) -> float:
    """max h(z)/h(w) over grid pairs with w = z − d whose exact gap |z − w| ≤ Δ.

    Floating-point ``z − d`` can land an ulp beyond Δ (e.g. 15.1 − 5.0 rounds to
    a point 5 + 2e-15 from 15.1); such pairs are not neighbours, so their gap is
    checked exactly with fractions and they are dropped when it exceeds Δ.
    """
    w = z[None, :] - shifts[:, None]
    ratio = noise.density(np.broadcast_to(z[None, :], w.shape)) / noise.density(w)
    gap = np.abs(z[None, :] - w)
    for i, j in zip(*np.nonzero(np.abs(gap - abs(delta)) < 1e-9), strict=True):
        if abs(Fraction(float(z[j])) - Fraction(float(w[i, j]))) > Fraction(delta):
            ratio[i, j] = 0.0
    return float(np.max(ratio))


@pytest.mark.parametrize("eps", [0.2, 1.0, 4.0])
@pytest.mark.parametrize("gamma", [None, 0.02, 0.98])
def test_continuous_staircase_density_ratio_for_every_shift(
    eps: float, gamma: float | None
) -> None:
    delta = 5.0
    g = optimal_gamma(eps) if gamma is None else gamma
    noise = continuous_staircase(delta, eps, g)
    steps = np.arange(-4, 5) * delta
    special = np.concatenate([steps, steps + g * delta, steps - g * delta])
    z = np.unique(
        np.concatenate(
            [np.linspace(-4 * delta, 4 * delta, 1601), special, special + 1e-9, special - 1e-9]
        )
    )
    shifts = np.unique(
        np.concatenate([np.linspace(0.0, delta, 201), [g * delta, (1 - g) * delta, delta - 1e-9]])
    )
    # Both directions: the z grid is symmetric, so −d is covered by symmetry of h.
    assert _max_ratio(noise, delta, z, shifts) <= math.exp(eps) * (1 + 1e-12)
    assert _max_ratio(noise, delta, z, -shifts) <= math.exp(eps) * (1 + 1e-12)


def test_ratio_check_catches_a_wrong_staircase() -> None:
    """Negative control: decay e^{−ε} per half period (a plausible bug) breaks ε-DP."""
    eps, delta = 1.0, 5.0
    wrong = StaircaseNoise(delta / 2, 0.3 * delta / 2, eps, False)
    z = np.linspace(-20, 20, 4001)
    assert _max_ratio(wrong, delta, z, np.linspace(0, delta, 101)) > math.exp(eps) * 1.5


@pytest.mark.parametrize("eps", [0.3, 2.0])
def test_laplace_density_ratio(eps: float) -> None:
    delta = 5.0
    noise = LaplaceNoise(delta / eps)
    z = np.linspace(-30, 30, 2401)
    ratio = _max_ratio(noise, delta, z, np.linspace(-delta, delta, 201))
    assert ratio <= math.exp(eps) * (1 + 1e-12)
    assert ratio == pytest.approx(math.exp(eps), rel=1e-9)  # attained: Δ is tight


@pytest.mark.parametrize("eps", [0.3, 1.0, 3.0])
@pytest.mark.parametrize("kind", ["dlap", "stair-1", "stair-3", "stair-6"])
def test_discrete_pmf_ratio_for_every_integer_shift(eps: float, kind: str) -> None:
    d = 6
    noise = (
        discrete_laplace(d, eps) if kind == "dlap" else discrete_staircase(d, eps, int(kind[-1]))
    )
    z = np.arange(-5.0 * d, 5.0 * d + 1)
    shifts = np.arange(-d, d + 1.0)
    ratio = _max_ratio(noise, d, z, shifts)
    assert ratio <= math.exp(eps) * (1 + 1e-12)
    assert ratio == pytest.approx(math.exp(eps), rel=1e-9)


@pytest.mark.parametrize(
    "params", [{"clip": True, "discrete": True}, {"discrete": True, "clip": True, "r": 2}]
)
@pytest.mark.parametrize("name", ["laplace", "staircase"])
def test_clipped_discrete_matrix_is_a_dp_transition_matrix(
    name: str, params: dict[str, Any]
) -> None:
    if name == "laplace":
        params = {k: v for k, v in params.items() if k != "r"}
    mech = _fit(name, 1.0, params, discrete=True)
    finite = mech.to_finite()
    np.testing.assert_allclose(finite.matrix.sum(axis=1), 1.0, atol=1e-12)
    assert finite.dp_ratio() <= math.exp(1.0) * (1 + 1e-12)
    # The matrix view and the analytic bias agree.
    np.testing.assert_allclose(finite.bias(), mech.bias(finite.inputs), atol=1e-12)


@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0])
def test_exponential_density_ratio(eps: float) -> None:
    mech = ExponentialMechanism("exponential", eps, LO, HI)
    x = np.linspace(LO, HI, 501)
    ys = np.linspace(LO, HI, 41)
    dens = np.stack([mech.density(x, float(y)) for y in ys])
    ratio = float(np.max(dens.max(axis=0) / dens.min(axis=0)))
    assert ratio <= math.exp(eps) * (1 + 1e-12)
    assert ratio >= math.exp(eps / 2) * (1 - 1e-9)  # attained by y = lo, y' = hi at x = lo
    # It integrates to one.
    for y in (LO, 3.3, HI):
        assert np.trapezoid(
            mech.density(np.linspace(LO, HI, 200_001), y), dx=(HI - LO) / 200_000
        ) == (pytest.approx(1.0, rel=1e-8))


# -- sampling matches the distribution -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [("laplace", {}), ("staircase", {}), ("staircase", {"gamma": 0.2})],
)
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_continuous_noise_sampler_passes_ks(name: str, params: dict[str, Any], eps: float) -> None:
    mech: AdditiveMechanism = _fit(name, eps, params)
    y = np.full(100_000, 3.0)
    noise = mech.sample(y, rng=np.random.default_rng(SEED), chunk_size=70_000) - 3.0
    result = stats.kstest(noise, lambda z: _cdf(mech.noise, z))
    assert result.pvalue > 1e-3


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("laplace", {"discrete": True}),
        ("staircase", {"discrete": True}),
        ("staircase", {"discrete": True, "r": 1}),
    ],
)
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_discrete_noise_sampler_passes_chi_square(
    name: str, params: dict[str, Any], eps: float
) -> None:
    mech: AdditiveMechanism = _fit(name, eps, params, discrete=True)
    n = 200_000
    noise = mech.sample(np.full(n, 2.0), rng=np.random.default_rng(SEED), chunk_size=100_000) - 2.0
    assert np.array_equal(noise, np.round(noise))
    support = np.arange(-40.0, 41.0)
    expected = mech.noise.density(support) * n
    observed = np.array([np.sum(noise == k) for k in support], dtype=float)
    keep = expected > 5
    obs = np.append(observed[keep], n - observed[keep].sum())
    exp = np.append(expected[keep], n - expected[keep].sum())
    _, pvalue = stats.chisquare(obs, exp)
    assert pvalue > 1e-3
    # The atom at 0 in particular (a sign-magnitude sampler without rejection doubles it).
    p0 = float(mech.noise.density(np.array(0.0)))
    assert abs(observed[40] / n - p0) < 5 * math.sqrt(p0 * (1 - p0) / n)


@pytest.mark.parametrize(
    ("name", "eps"), [("laplace", 0.5), ("staircase", 0.5), ("staircase", 3.0)]
)
def test_clipped_continuous_has_the_right_atoms_and_interior(name: str, eps: float) -> None:
    mech: AdditiveMechanism = _fit(name, eps, {"clip": True})
    n, y = 200_000, 3.0
    out = mech.sample(np.full(n, y), rng=np.random.default_rng(SEED))
    assert out.min() >= LO and out.max() <= HI
    for end, c in ((LO, y - LO), (HI, HI - y)):
        p = float(mech.noise.tail(np.array(c)))
        freq = np.mean(out == end)
        assert abs(freq - p) < 5 * math.sqrt(p * (1 - p) / n)
    inner = out[(out > LO) & (out < HI)] - y
    lo_mass = float(_cdf(mech.noise, np.array(LO - y)))
    hi_mass = float(_cdf(mech.noise, np.array(HI - y)))
    cond = stats.kstest(inner, lambda z: (_cdf(mech.noise, z) - lo_mass) / (hi_mass - lo_mass))
    assert cond.pvalue > 1e-3


@pytest.mark.parametrize("eps", [0.05, 6.0])
@pytest.mark.parametrize("y", [LO, 3.0, HI])
def test_exponential_sampler_passes_ks(eps: float, y: float) -> None:
    mech: ExponentialMechanism = _fit("exponential", eps, {})
    out = mech.sample(np.full(100_000, y), rng=np.random.default_rng(SEED))
    assert out.min() >= LO and out.max() <= HI
    assert stats.kstest(out, lambda x: mech.cdf(x, y)).pvalue > 1e-3


# -- analytic loss and bias against Monte Carlo --------------------------------------------

VARIANTS: list[tuple[str, float, dict[str, Any], bool]] = [
    ("laplace", 1.0, {}, False),
    ("laplace", 0.5, {"clip": True}, False),
    ("laplace", 1.0, {"discrete": True}, True),
    ("laplace", 0.5, {"discrete": True, "clip": True}, True),
    ("staircase", 1.0, {}, False),
    ("staircase", 0.5, {"clip": True}, False),
    ("staircase", 2.0, {"clip": True, "gamma": 0.3}, False),
    ("staircase", 1.0, {"discrete": True}, True),
    ("staircase", 0.5, {"discrete": True, "clip": True}, True),
    ("exponential", 1.0, {}, False),
    ("exponential", 0.1, {}, False),
]


@pytest.mark.parametrize(
    ("name", "eps", "params", "discrete"),
    VARIANTS,
    ids=[
        f"{v[0]}-eps{v[1]}-{'-'.join(k for k in v[2] if v[2][k] is True) or 'plain'}"
        for v in VARIANTS
    ],
)
def test_analytic_loss_and_bias_match_monte_carlo(
    name: str, eps: float, params: dict[str, Any], discrete: bool
) -> None:
    mech = _fit(name, eps, params, discrete=discrete)
    lo, hi = (DLO, DHI) if discrete else (LO, HI)
    values = np.array([lo, lo + 1.0, lo + 3.0, hi])
    prior = np.array([0.2, 0.3, 0.1, 0.4])
    rng = np.random.default_rng(SEED)
    n = 1_000_000
    which = rng.choice(values.size, size=n, p=prior)
    labels = values[which]
    noisy = mech.sample(labels, rng=rng)
    err = noisy - labels
    for loss, per in (("squared", err**2), ("absolute", np.abs(err))):
        analytic = mech.noisy_label_loss(values, prior, loss)
        se = per.std() / math.sqrt(n)
        assert abs(per.mean() - analytic) < 5 * se + 1e-12, loss
    bias = mech.bias(values)
    if name != "exponential" and not params.get("clip"):
        np.testing.assert_array_equal(bias, 0.0)
    for i in range(values.size):
        e = err[which == i]
        assert abs(e.mean() - bias[i]) < 5 * e.std() / math.sqrt(e.size) + 1e-12


@pytest.mark.parametrize(
    ("name", "params", "discrete"),
    [
        ("laplace", {"clip": True}, False),
        ("staircase", {"clip": True}, False),
        ("staircase", {"clip": True, "discrete": True}, True),
        ("exponential", {}, False),
    ],
)
def test_poisson_loss_matches_monte_carlo_when_outputs_are_positive(
    name: str, params: dict[str, Any], discrete: bool
) -> None:
    lo, hi = (1.0, 7.0) if discrete else (0.5, 6.0)
    values = np.array([lo, 2.0, hi]) if discrete else np.array([lo, 2.5, hi])
    prior = np.array([0.3, 0.5, 0.2])
    mech = fit(name, epsilon=1.0, values=values, prior=prior, domain=(lo, hi), params=params)
    rng = np.random.default_rng(SEED)
    n = 1_000_000
    labels = values[rng.choice(values.size, size=n, p=prior)]
    noisy = mech.sample(labels, rng=rng)
    per = noisy - labels * np.log(noisy)
    analytic = mech.noisy_label_loss(values, prior, "poisson")
    assert abs(per.mean() - analytic) < 5 * per.std() / math.sqrt(n)


def test_exponential_poisson_with_zero_lower_bound_is_finite() -> None:
    values, prior = np.array([0.0, 1.0, 3.0]), np.array([0.2, 0.5, 0.3])
    mech = fit("exponential", epsilon=1.0, values=values, prior=prior, domain=(0.0, 3.0))
    rng = np.random.default_rng(SEED)
    n = 1_000_000
    labels = values[rng.choice(3, size=n, p=prior)]
    noisy = mech.sample(labels, rng=rng)
    with np.errstate(divide="ignore"):
        per = np.where(labels == 0, noisy, noisy - labels * np.log(noisy))
    analytic = mech.noisy_label_loss(values, prior, "poisson")
    assert math.isfinite(analytic)
    assert abs(per.mean() - analytic) < 5 * per.std() / math.sqrt(n)


@pytest.mark.parametrize(
    ("name", "params", "domain"),
    [
        ("laplace", {}, (1.0, 6.0)),  # unclipped: ŷ ≤ 0 has positive probability
        ("staircase", {"discrete": True}, (1.0, 6.0)),
        ("laplace", {"clip": True}, (0.0, 6.0)),  # the atom at lo = 0
        ("exponential", {}, (-1.0, 6.0)),
    ],
)
def test_poisson_loss_is_infinite_when_nonpositive_outputs_are_possible(
    name: str, params: dict[str, Any], domain: tuple[float, float]
) -> None:
    values, prior = np.array([1.0, 2.0]), np.array([0.5, 0.5])
    mech = fit(name, epsilon=1.0, values=values, prior=prior, domain=domain, params=params)
    assert mech.noisy_label_loss(values, prior, "poisson") == math.inf
    # A label of 0 alone pays E[ŷ] (0·log 0 = 0): finite.
    if domain[0] <= 0:
        zero = np.array([0.0])
        assert math.isfinite(mech.noisy_label_loss(zero, np.array([1.0]), "poisson"))


def test_zero_one_loss_of_the_discrete_mechanisms() -> None:
    mech = _fit("laplace", 1.0, {"discrete": True, "clip": True}, discrete=True)
    finite = mech.to_finite()
    values = finite.inputs
    prior = np.full(values.size, 1 / values.size)
    expected = 1.0 - float(np.mean(np.diag(finite.matrix)))
    assert mech.noisy_label_loss(values, prior, "zero-one") == pytest.approx(expected)
    cont = _fit("laplace", 1.0, {})
    assert cont.noisy_label_loss(np.array([3.0]), np.array([1.0]), "zero-one") == 1.0


def test_unclipped_loss_closed_forms() -> None:
    eps, d = 0.7, HI - LO
    mech = _fit("laplace", eps, {})
    v, p = np.array([3.0]), np.array([1.0])
    assert mech.noisy_label_loss(v, p, "squared") == pytest.approx(2 * (d / eps) ** 2)
    assert mech.noisy_label_loss(v, p, "absolute") == pytest.approx(d / eps)


# -- interface: params, validation, chunking -----------------------------------------------


def test_params_are_public_noise_parameters() -> None:
    lap = _fit("laplace", 0.5, {"clip": True})
    assert lap.params() == {
        "bounds": [LO, HI],
        "sensitivity": 5.0,
        "clip": True,
        "discrete": False,
        "scale": 10.0,
        "lattice_step": 5.0 / 2**16,
    }
    stair = _fit("staircase", 1.0, {})
    assert stair.params()["gamma"] == pytest.approx(optimal_gamma(1.0))
    assert _fit("staircase", 1.0, {"discrete": True}, discrete=True).params()["r"] == optimal_r(
        6, 1.0
    )
    desc = _fit("exponential", 1.0, {}).describe()
    assert desc["name"] == "exponential" and desc["params"]["scale"] == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("laplace", {"scale": 2}, "scale"),
        ("laplace", {"clip": "yes"}, "clip"),
        ("laplace", {"discrete": 1}, "discrete"),
        ("staircase", {"gamma": 0.0}, "gamma"),
        ("staircase", {"gamma": 1.0}, "gamma"),
        ("staircase", {"gamma": "0.5"}, "gamma"),
        ("staircase", {"gamma": True}, "gamma"),
        ("staircase", {"r": 2}, "r is for the discrete"),
        ("staircase", {"discrete": True, "gamma": 0.5}, "gamma"),
        ("staircase", {"discrete": True, "r": 0}, "r must"),
        ("staircase", {"discrete": True, "r": 7}, "r must"),
        ("staircase", {"discrete": True, "r": 2.0}, "r must"),
        ("exponential", {"clip": True}, "clip"),
        ("staircase", {"mesh": 3}, "mesh"),
    ],
)
def test_bad_params_name_the_parameter(name: str, params: dict[str, Any], match: str) -> None:
    discrete = bool(params.get("discrete"))
    with pytest.raises(MechanismError, match=match):
        _fit(name, 1.0, params, discrete=discrete)


def test_discrete_needs_integer_bounds_and_values() -> None:
    with pytest.raises(MechanismError, match="integer bounds"):
        fit(
            "laplace",
            epsilon=1.0,
            values=np.array([0.0, 1.0]),
            prior=np.array([0.5, 0.5]),
            domain=(0.0, 2.5),
            params={"discrete": True},
        )
    with pytest.raises(MechanismError, match="integer label values"):
        fit(
            "laplace",
            epsilon=1.0,
            values=np.array([0.0, 0.5, 2.0]),
            prior=np.full(3, 1 / 3),
            params={"discrete": True},
        )


def test_degenerate_bounds_are_refused() -> None:
    request = FitRequest(epsilon=1.0, values=np.array([1.0]), prior=np.array([1.0]))
    for factory in (
        additive.laplace_from_request,
        additive.staircase_from_request,
        additive.exponential_from_request,
    ):
        with pytest.raises(MechanismError, match="bounds"):
            factory(request)


@pytest.mark.parametrize("name", ["laplace", "staircase", "exponential"])
@pytest.mark.parametrize("width", [1e-320, 5e-324, 1e-304])
def test_a_domain_too_narrow_for_the_lattice_is_refused(name: str, width: float) -> None:
    """A lattice step h = (max − min)/2¹⁶ that underflowed to 0 mapped min to NaN
    and max to min: every label released exactly, at any ε (helper-86)."""
    half = np.array([0.5, 0.5])
    with pytest.raises(MechanismError, match="narrower than these mechanisms randomize on"):
        fit(name, epsilon=1e-3, values=np.array([0.0, width]), prior=half, domain=(0.0, width))
    top = 2e-303  # 2¹⁶ steps of normal floats
    mech = fit(name, epsilon=1.0, values=np.array([0.0, top]), prior=half, domain=(0.0, top))
    out = mech.sample(np.repeat([0.0, top], 500), rng=np.random.default_rng(0))
    assert np.all(np.isfinite(out))
    assert len(set(out[:500].tolist())) > 1 and len(set(out[500:].tolist())) > 1  # noisy


@pytest.mark.parametrize("name", ["laplace", "staircase", "exponential"])
def test_labels_outside_the_domain_are_refused_without_echoing_them(name: str) -> None:
    mech = _fit(name, 1.0, {})
    with pytest.raises(MechanismError, match="bounds") as info:
        mech.sample(np.array([3.0, 12345.678]), rng=np.random.default_rng(0))
    assert "12345" not in str(info.value)
    with pytest.raises(MechanismError, match="finite"):
        mech.sample(np.array([np.nan]), rng=np.random.default_rng(0))


@pytest.mark.parametrize("name", ["laplace", "staircase"])
def test_a_discrete_mechanism_rounds_a_fractional_label_between_its_neighbours(
    name: str,
) -> None:
    """M(1.25) = ¾·M(1) + ¼·M(2): a mixture of two rows, so still ε-DP. It used to
    refuse the label, which told a client for free that some label was fractional."""
    mech = _fit(name, 6.0, {"discrete": True, "clip": True}, discrete=True)
    rows = mech.to_finite().matrix
    expected = 0.75 * rows[1] + 0.25 * rows[2]
    n = 200_000
    out = mech.sample(np.full(n, 1.25), rng=np.random.default_rng(5))
    assert np.array_equal(out, np.round(out))
    freq = np.bincount(out.astype(np.int64), minlength=rows.shape[1]) / n
    sd = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(freq - expected) <= 5 * sd + 1e-12)
    # Far from the other mixtures: one row alone is not what it samples.
    assert np.max(np.abs(freq - rows[1])) > 20 * sd.max()


def test_rounding_to_integers_is_unbiased_and_keeps_integers() -> None:
    rng = np.random.default_rng(11)
    assert np.array_equal(round_to_integers(np.array([-3.0, 0.0, 7.0]), rng), [-3, 0, 7])
    y = np.full(400_000, 2.3)
    out = round_to_integers(y, rng)
    assert set(np.unique(out)) == {2.0, 3.0}
    assert abs(out.mean() - 2.3) < 5 * np.sqrt(0.3 * 0.7 / y.size)


@pytest.mark.parametrize("name", ["laplace", "staircase", "exponential"])
def test_sampling_is_chunked_reproducible_and_secure_by_default(name: str) -> None:
    mech = _fit(name, 1.0, {"clip": True} if name != "exponential" else {})
    labels = np.linspace(LO, HI, 10_001)
    a = mech.sample(labels, rng=np.random.default_rng(3), chunk_size=999)
    b = mech.sample(labels, rng=np.random.default_rng(3), chunk_size=999)
    np.testing.assert_array_equal(a, b)
    assert a.shape == labels.shape
    c = mech.sample(labels)  # secure_generator()
    assert c.shape == labels.shape and not np.array_equal(a, c)
    with pytest.raises(MechanismError, match="chunk_size"):
        mech.sample(labels, chunk_size=0)


def test_loss_values_must_lie_in_the_domain() -> None:
    mech = _fit("laplace", 1.0, {"clip": True})
    with pytest.raises(MechanismError, match="bounds"):
        mech.noisy_label_loss(np.array([0.0, 3.0]), np.array([0.5, 0.5]), "squared")


@pytest.mark.parametrize("loss", ["squared", "absolute"])
def test_staircase_beats_laplace_at_high_epsilon(loss: Loss) -> None:
    """Sanity of the baselines: at ε = 6 the optimal staircase has lower error."""
    v, p = np.array([3.0]), np.array([1.0])
    lap = fit("laplace", epsilon=6.0, values=v, prior=p, domain=(LO, HI))
    stair = fit("staircase", epsilon=6.0, values=v, prior=p, domain=(LO, HI), loss=loss)
    assert stair.noisy_label_loss(v, p, loss) < lap.noisy_label_loss(v, p, loss)


def test_registry_routes_the_names_here() -> None:
    from label_party.mechanisms import registry

    for name, factory in FACTORIES.items():
        spec = registry.get_spec(name)
        assert not spec.finite and not spec.uses_prior
        assert spec.factory.__qualname__ == f"additive.{factory.__name__}"
        fitted = registry.fit(name, epsilon=1.0, values=np.arange(3.0), prior=np.ones(3) / 3)
        assert type(fitted) is type(factory(FitRequest(1.0, np.arange(3.0), np.ones(3) / 3)))
