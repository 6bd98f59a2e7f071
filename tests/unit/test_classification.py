"""Randomized response and RRWithPrior (Ghazi et al. 2021, Algorithms 1–2)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import optimize, stats

from label_party.mechanisms import registry
from label_party.mechanisms.base import FiniteMechanism, FitRequest, MechanismError
from label_party.mechanisms.classification import (
    TIE_RTOL,
    RandomizedResponse,
    RRTopK,
    rr_from_request,
    rr_matrix,
    rr_sample,
    rr_top_k_matrix,
    rr_with_prior_from_request,
    rr_with_prior_sample,
    top_k_objective,
    top_k_sets,
)

SEED = 20261122
FACTORIES = {"rr": rr_from_request, "rr-with-prior": rr_with_prior_from_request}


def fit(
    name: str,
    *,
    epsilon: float,
    values: np.ndarray,
    prior: np.ndarray,
    loss: str = "zero-one",
    params: dict[str, Any] | None = None,
) -> FiniteMechanism:
    """What registry.fit does for these two, as their matrix, without importing every mechanism
    (the registry path is covered by test_mechanism_contract.py)."""
    request = FitRequest(
        epsilon=epsilon,
        values=np.asarray(values, dtype=np.float64),
        prior=np.asarray(prior, dtype=np.float64),
        loss="zero-one" if loss == "zero-one" else "squared",
        params=dict(params or {}),
    )
    mech = FACTORIES[name](request)
    # Both are given by their parameters, never their K×K matrix (tested below against
    # it): the tests of the matrix ask for it.
    return mech.as_finite()


def _random_priors(rng: np.random.Generator, count: int, k: int) -> np.ndarray:
    """Priors of every shape: flat, peaked, sparse, with exact ties."""
    out = []
    for i in range(count):
        alpha = [0.1, 0.5, 1.0, 5.0][i % 4]
        p = rng.dirichlet(np.full(k, alpha))
        if i % 5 == 0:
            p[rng.integers(0, k)] = 0.0  # a class the prior rules out
        if i % 7 == 0:
            p[1] = p[0]  # an exact tie
        if p.sum() == 0:
            p[:] = 1.0
        out.append(p / p.sum())
    return np.array(out)


def _chi_square_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson chi-square on cells with expected > 5, sparse cells pooled."""
    assert np.all(observed[expected == 0] == 0), "sampled an output of probability zero"
    keep = expected > 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def _assert_dp(matrix: np.ndarray, epsilon: float) -> float:
    """Every column: max ≤ e^ε · min over rows (a zero column is fine). Returns the ratio."""
    col_max, col_min = matrix.max(axis=0), matrix.min(axis=0)
    used = col_max > 0
    assert np.all(col_min[used] > 0), "an output reachable from one label but not another"
    ratio = float(np.max(col_max[used] / col_min[used]))
    assert ratio <= math.exp(epsilon) * (1 + 1e-12)
    return ratio


# -- randomized response ----------------------------------------------------------


@pytest.mark.parametrize("k", [2, 5, 10])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 5.0])
def test_rr_matrix_is_eps_dp_and_stochastic(k: int, epsilon: float) -> None:
    m = rr_matrix(k, epsilon=epsilon)
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(np.diag(m), math.exp(epsilon) / (math.exp(epsilon) + k - 1))
    # RR uses the whole budget: the ratio is exactly e^ε.
    assert _assert_dp(m, epsilon) == pytest.approx(math.exp(epsilon), rel=1e-12)


def test_rr_from_request() -> None:
    mech = registry.fit("rr", epsilon=2.0, values=np.arange(4.0), prior=np.full(4, 0.25))
    assert isinstance(mech, RandomizedResponse)
    np.testing.assert_allclose(mech.as_finite().matrix, rr_matrix(4, epsilon=2.0))
    assert mech.describe() == {"name": "rr", "epsilon": 2.0, "inputs": [0, 1, 2, 3],
                               "outputs": [0, 1, 2, 3], "params": {"num_classes": 4}}  # fmt: skip


@pytest.mark.parametrize("loss", ["zero-one", "squared", "absolute", "poisson"])
@pytest.mark.parametrize(("k", "epsilon"), [(2, 0.1), (7, 1.0), (40, 3.0)])
@pytest.mark.parametrize("name", ["rr", "rr-with-prior"])
def test_closed_forms_match_the_matrix(name: str, k: int, epsilon: float, loss: str) -> None:
    """RR and RRTop-k never build their K×K matrix; their bias and noisy-label loss
    are closed forms (``loss_sums``), which must agree with the matrix's."""
    rng = np.random.default_rng(k)
    prior = rng.dirichlet(np.full(k, 0.3))
    prior[0] = 0.0  # an unused class: 0·ℓ, whatever ℓ (Poisson's ℓ(0, y) is ∞)
    prior /= prior.sum()
    values = np.arange(k, dtype=np.float64)
    mech = registry.fit(name, epsilon=epsilon, values=values, prior=prior)
    assert isinstance(mech, RandomizedResponse | RRTopK)
    finite = mech.as_finite()
    np.testing.assert_allclose(mech.bias(values), finite.bias(values), atol=1e-9)
    ours, theirs = (m.noisy_label_loss(values, prior, loss) for m in (mech, finite))
    assert ours == pytest.approx(theirs, rel=1e-10) or (math.isinf(ours) and math.isinf(theirs))


def test_rr_top_k_samples_follow_its_matrix() -> None:
    """Inside Y_k, outside it, and k = 1 (always the one class)."""
    rng = np.random.default_rng(SEED)
    k_classes = 6
    for k in (1, 3):
        mech = RRTopK(1.0, k_classes, tuple(range(2, 2 + k)), k)
        labels = rng.integers(0, k_classes, size=120_000)
        noisy = mech.sample(labels.astype(np.float64), rng=rng, chunk_size=50_000)
        observed = np.zeros((k_classes, k_classes))
        np.add.at(observed, (labels, noisy.astype(np.int64)), 1.0)
        expected = mech.as_finite().matrix * np.bincount(labels, minlength=k_classes)[:, None]
        used = expected.sum(axis=0) > 0
        assert np.all(observed[:, ~used] == 0)
        assert _chi_square_pvalue(observed[:, used], expected[:, used]) > 1e-4


def test_rr_over_many_classes_is_cheap() -> None:
    """10⁵ classes (the domain's limit): its matrix would be 80 GB; RR is (K, ε)."""
    k = 100_000
    mech = registry.fit("rr", epsilon=1.0, values=np.arange(float(k)), prior=np.full(k, 1.0 / k))
    assert mech.describe()["params"] == {"num_classes": k}
    labels = np.arange(0, k, 7, dtype=np.float64)
    noisy = mech.sample(labels, rng=np.random.default_rng(SEED))
    assert noisy.shape == labels.shape and np.all((noisy >= 0) & (noisy < k))


@pytest.mark.parametrize(
    "values", [np.array([1.0, 2.0, 3.0]), np.array([0.0, 1.0, 3.0]), np.array([0.0])]
)
@pytest.mark.parametrize("name", ["rr", "rr-with-prior"])
def test_values_must_be_class_indices(values: np.ndarray, name: str) -> None:
    prior = np.full(values.size, 1.0 / values.size)
    with pytest.raises(MechanismError):
        fit(name, epsilon=1.0, values=values, prior=prior)


def test_rr_sample_follows_the_matrix() -> None:
    rng = np.random.default_rng(SEED)
    k, eps = 5, 1.0
    labels = rng.integers(0, k, size=200_000)
    noisy = rr_sample(labels, k, epsilon=eps, rng=rng, chunk_size=70_000)
    observed = np.zeros((k, k))
    np.add.at(observed, (labels, noisy), 1.0)
    expected = rr_matrix(k, epsilon=eps) * np.bincount(labels, minlength=k)[:, None]
    assert _chi_square_pvalue(observed, expected) > 1e-4


def test_rr_sample_extremes() -> None:
    labels = np.arange(6) % 3
    np.testing.assert_array_equal(rr_sample(labels, 3, epsilon=800.0), labels)
    with pytest.raises(MechanismError, match=r"\[0, 3\)") as info:
        rr_sample(np.array([0, 7]), 3, epsilon=1.0)
    assert "7" not in str(info.value)  # errors never echo a label (DESIGN.md §3.1)
    with pytest.raises(MechanismError):
        rr_sample(np.array([0.5]), 3, epsilon=1.0)


# -- RRTop-k and RRWithPrior ------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.05, 1.0, 4.0])
def test_rr_top_k_is_eps_dp_for_every_k(epsilon: float) -> None:
    rng = np.random.default_rng(SEED)
    for num in (2, 3, 6, 10):
        for p in _random_priors(rng, 20, num):
            order = np.argsort(-p, kind="stable")
            for k in range(1, num + 1):
                m = rr_top_k_matrix(order, k, epsilon=epsilon)
                np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-12)
                assert np.all(m >= 0)
                outside = np.setdiff1d(np.arange(num), order[:k])
                assert np.all(m[:, outside] == 0)
                ratio = _assert_dp(m, epsilon)
                if k > 1:
                    assert ratio == pytest.approx(math.exp(epsilon), rel=1e-12)


def _correct_probability(p: np.ndarray, m: np.ndarray) -> float:
    """Obj_p(M) = Σ_y p_y · P[M(y) = y] (Section 3.2)."""
    return float(np.dot(p, np.diag(m)))


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0])
def test_k_star_maximizes_the_probability_of_a_correct_label(epsilon: float) -> None:
    rng = np.random.default_rng(SEED + 1)
    for num in (2, 4, 10):
        priors = _random_priors(rng, 40, num)
        k_star, order = top_k_sets(priors, epsilon=epsilon)
        for p, ks, o in zip(priors, k_star, order, strict=True):
            # Brute force over k with Y_k taken independently of top_k_sets.
            ref = np.argsort(-p, kind="stable")
            np.testing.assert_array_equal(o, ref)
            objs = np.array(
                [
                    _correct_probability(p, rr_top_k_matrix(ref, k, epsilon=epsilon))
                    for k in range(1, num + 1)
                ]
            )
            best = objs.max()
            assert objs[ks - 1] >= best * (1 - 1e-9)
            # ties → the smallest k
            assert np.all(objs[: ks - 1] < best * (1 - TIE_RTOL / 2))
        # and the objective is exactly the probability of a correct label
        w = top_k_objective(priors, epsilon=epsilon)
        p0 = priors[0]
        o0 = np.argsort(-p0, kind="stable")
        for k in range(1, num + 1):
            assert w[0, k - 1] == pytest.approx(
                _correct_probability(p0, rr_top_k_matrix(o0, k, epsilon=epsilon)), rel=1e-12
            )


def _optimal_correct_probability_lp(p: np.ndarray, epsilon: float) -> float:
    """max Σ_y p_y q(y|y) over all ε-DP q (the LP in the proof of Theorem 3)."""
    num = p.size
    nvar = num * num  # q[y, o] at y*num + o

    def var(y: int, o: int) -> int:
        return y * num + o

    c = np.zeros(nvar)
    for y in range(num):
        c[var(y, y)] = -p[y]
    a_ub, b_ub = [], []
    for o in range(num):
        for y in range(num):
            for y2 in range(num):
                if y != y2:
                    row = np.zeros(nvar)
                    row[var(y, o)] = 1.0
                    row[var(y2, o)] = -math.exp(epsilon)
                    a_ub.append(row)
                    b_ub.append(0.0)
    a_eq = np.zeros((num, nvar))
    for y in range(num):
        a_eq[y, y * num : (y + 1) * num] = 1.0
    res = optimize.linprog(
        c, A_ub=np.array(a_ub), b_ub=b_ub, A_eq=a_eq, b_eq=np.ones(num), bounds=(0, 1)
    )
    assert res.status == 0
    return float(-res.fun)


@pytest.mark.parametrize("epsilon", [0.3, 1.5])
def test_rr_with_prior_is_optimal_among_all_dp_randomizers(epsilon: float) -> None:
    """Theorem 3: no ε-DP randomizer has a higher Obj_p than RRWithPrior."""
    rng = np.random.default_rng(SEED + 2)
    for p in _random_priors(rng, 6, 4):
        mech = rr_with_prior_from_request_for(p, epsilon)
        assert _correct_probability(p, mech.matrix) == pytest.approx(
            _optimal_correct_probability_lp(p, epsilon), abs=1e-7
        )


def rr_with_prior_from_request_for(p: np.ndarray, epsilon: float) -> FiniteMechanism:
    mech = fit(
        "rr-with-prior", epsilon=epsilon, values=np.arange(float(p.size)), prior=p, loss="zero-one"
    )
    assert isinstance(mech, FiniteMechanism)
    return mech


def test_prior_ties_are_broken_by_class_index() -> None:
    p = np.array([0.2, 0.3, 0.3, 0.2])
    _, order = top_k_sets(p[None, :], epsilon=1.0)
    np.testing.assert_array_equal(order[0], [1, 2, 0, 3])
    # Tiny ε: of the two tied leaders both are worth keeping (2p/(1+δ) > p).
    mech = rr_with_prior_from_request_for(p, 0.01)
    assert mech.params["k"] == 2 and mech.params["top_k"] == [1, 2]
    np.testing.assert_allclose(mech.matrix[:, [1, 2]].sum(axis=1), 1.0)
    mech = fit("rr-with-prior", epsilon=0.01, values=np.arange(4.0), prior=p, params={"k": 3})
    assert mech.params["top_k"] == [1, 2, 0]
    assert np.all(mech.matrix[:, 3] == 0)


def test_objective_ties_pick_the_smallest_k() -> None:
    # ε = ln 2, δ = 1/2: w_1 = 0.5, w_2 = 0.75/1.5 = 0.5, w_3 = 1/2 — all tied.
    p = np.array([[0.5, 0.25, 0.25]])
    k_star, _ = top_k_sets(p, epsilon=math.log(2.0))
    assert k_star[0] == 1
    # Move mass to the tail: w = 0.4, 0.7/1.5, 0.5 and k = 3 wins strictly.
    k_star, _ = top_k_sets(np.array([[0.3, 0.4, 0.3]]) * 2, epsilon=math.log(2.0))
    assert k_star[0] == 3


def test_rr_with_prior_k_override_and_description() -> None:
    p = np.array([0.1, 0.6, 0.05, 0.25])
    mech = fit("rr-with-prior", epsilon=1.0, values=np.arange(4.0), prior=p, params={"k": 3})
    assert isinstance(mech, FiniteMechanism)
    assert mech.params["k"] == 3 and mech.params["top_k"] == [1, 3, 0]
    np.testing.assert_allclose(mech.matrix, rr_top_k_matrix(np.array([1, 3, 0, 2]), 3, epsilon=1.0))
    with pytest.raises(MechanismError):
        fit("rr-with-prior", epsilon=1.0, values=np.arange(4.0), prior=p, params={"k": 5})
    with pytest.raises(MechanismError):
        fit("rr-with-prior", epsilon=1.0, values=np.arange(4.0), prior=p, params={"kk": 2})


def test_batch_k_star_agrees_with_the_per_example_mechanism() -> None:
    rng = np.random.default_rng(SEED + 3)
    priors = _random_priors(rng, 60, 7)
    for eps in (0.2, 1.0, 3.0):
        k_star, order = top_k_sets(priors, epsilon=eps)
        for p, ks, o in zip(priors, k_star, order, strict=True):
            mech = rr_with_prior_from_request_for(p, eps)
            assert mech.params["k_star"] == ks
            assert mech.params["top_k"] == o[:ks].tolist()


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_batch_sampler_follows_the_per_example_matrices(epsilon: float) -> None:
    rng = np.random.default_rng(SEED + 4)
    num, n = 6, 200_000
    distinct = np.array(
        [
            [0.5, 0.2, 0.1, 0.1, 0.05, 0.05],
            [0.0, 0.0, 0.3, 0.3, 0.4, 0.0],  # ties and ruled-out classes
            np.full(num, 1 / num),
            [0.02, 0.9, 0.02, 0.02, 0.02, 0.02],
        ]
    )
    which = rng.integers(0, len(distinct), size=n)
    priors = distinct[which]
    # Labels loosely follow the prior but every label occurs under every prior.
    labels = np.where(
        rng.random(n) < 0.5,
        rng.integers(0, num, size=n),
        (priors.cumsum(axis=1) < rng.random(n)[:, None]).sum(axis=1),
    )
    noisy = rr_with_prior_sample(labels, priors, epsilon=epsilon, rng=rng, chunk_size=45_000)
    assert noisy.dtype == np.int64 and noisy.shape == labels.shape
    observed = np.zeros((len(distinct), num, num))
    np.add.at(observed, (which, labels, noisy), 1.0)
    expected = np.zeros_like(observed)
    for g, p in enumerate(distinct):
        mech = rr_with_prior_from_request_for(p, epsilon)
        label_counts = np.bincount(labels[which == g], minlength=num)
        expected[g] = mech.matrix * label_counts[:, None]
    assert _chi_square_pvalue(observed.ravel(), expected.ravel()) > 1e-4


def test_batch_sampler_accepts_model_outputs() -> None:
    rng = np.random.default_rng(SEED + 5)
    logits = rng.normal(size=(1000, 5)).astype(np.float32)
    priors = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)  # float32, sum ≈ 1
    labels = rng.integers(0, 5, size=1000)
    noisy = rr_with_prior_sample(labels, priors, epsilon=1.0, rng=rng)
    assert noisy.min() >= 0 and noisy.max() < 5
    # Large ε with full-support priors: k* = K and RRTop-K keeps every label.
    np.testing.assert_array_equal(
        rr_with_prior_sample(labels, priors, epsilon=900.0, rng=rng), labels
    )
    # Tiny ε: k* = 1, every output is the prior's argmax.
    np.testing.assert_array_equal(
        rr_with_prior_sample(labels, priors, epsilon=1e-6, rng=rng),
        np.argmax(priors, axis=1),
    )


def test_batch_sampler_validates() -> None:
    priors = np.full((3, 4), 0.25)
    with pytest.raises(MechanismError):
        rr_with_prior_sample(np.array([0, 1]), priors, epsilon=1.0)
    with pytest.raises(MechanismError) as info:
        rr_with_prior_sample(np.array([0, 1, 9]), priors, epsilon=1.0)
    assert "9" not in str(info.value)
    bad = priors.copy()
    bad[1, 2] = np.nan
    with pytest.raises(MechanismError):
        rr_with_prior_sample(np.array([0, 1, 2]), bad, epsilon=1.0)
    with pytest.raises(MechanismError):
        rr_with_prior_sample(np.array([0, 1, 2]), np.zeros((3, 4)), epsilon=1.0)
    with pytest.raises(MechanismError):
        rr_with_prior_sample(np.array([0, 1, 2]), priors, epsilon=0.0)
    empty = rr_with_prior_sample(np.array([], dtype=np.int64), np.empty((0, 4)), epsilon=1.0)
    assert empty.shape == (0,)


def test_from_request_rejects_a_prior_that_is_not_a_distribution() -> None:
    with pytest.raises(MechanismError):
        rr_with_prior_from_request_for(np.array([0.5, 0.6, -0.1]), 1.0)
    with pytest.raises(MechanismError):
        rr_with_prior_from_request_for(np.array([0.5, 0.6, 0.1]), 1.0)


def test_module_exports_the_registry_factories() -> None:
    from label_party.mechanisms import classification

    assert {"rr_from_request", "rr_with_prior_from_request"} <= set(classification.__all__)
    assert rr_with_prior_from_request is classification.rr_with_prior_from_request
