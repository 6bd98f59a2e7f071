"""The shared pieces of label_party.mechanisms.base."""

from __future__ import annotations

import numpy as np
import pytest

from label_party.mechanisms.base import (
    FiniteMechanism,
    MechanismError,
    pointwise_loss,
    secure_generator,
    validate_prior,
)


def _toy() -> FiniteMechanism:
    e = np.e
    m = np.array([[e, 1.0], [1.0, e]]) / (e + 1)
    return FiniteMechanism("toy", 1.0, np.array([0.0, 1.0]), np.array([0.0, 1.0]), m)


def test_secure_generators_differ() -> None:
    a = secure_generator().integers(0, 2**62, size=4)
    b = secure_generator().integers(0, 2**62, size=4)
    assert not np.array_equal(a, b)


def test_losses() -> None:
    y = np.array([0.0, 2.0])
    np.testing.assert_allclose(pointwise_loss(np.array([1.0, 1.0]), y, "squared"), [1, 1])
    np.testing.assert_allclose(pointwise_loss(np.array([1.0, 4.0]), y, "absolute"), [1, 2])
    np.testing.assert_allclose(
        pointwise_loss(np.array([1.0, 4.0]), y, "poisson"), [1.0, 4 - 2 * np.log(4)]
    )
    assert np.isinf(pointwise_loss(np.array([0.0]), np.array([1.0]), "poisson")[0])


@pytest.mark.parametrize(
    ("values", "prior", "message"),
    [
        ([1.0, 0.0], [0.5, 0.5], "sorted"),
        ([0.0, 0.0], [0.5, 0.5], "sorted"),
        ([0.0, 1.0], [-0.1, 1.1], "non-negative"),
        ([0.0, 1.0], [0.5, 0.5 + 1e-8], "sum to one"),
        ([0.0, 1.0], [1.0], "entries"),
    ],
)
def test_validate_prior_names_the_problem(
    values: list[float], prior: list[float], message: str
) -> None:
    with pytest.raises(MechanismError, match=message):
        validate_prior(np.array(values), np.array(prior))


def test_toy_mechanism_analysis() -> None:
    mech = _toy()
    assert mech.dp_ratio() == pytest.approx(np.e)
    p = np.array([0.5, 0.5])
    assert mech.noisy_label_loss(mech.inputs, p, "squared") == pytest.approx(1 / (np.e + 1))


def test_sampling_is_chunked_and_exact_in_distribution() -> None:
    mech = _toy()
    labels = np.zeros(200_001)
    noisy = mech.sample(labels, rng=np.random.default_rng(0), chunk_size=65_536)
    assert noisy.size == labels.size
    assert abs(noisy.mean() - 1 / (np.e + 1)) < 4 * np.sqrt(0.2 / 200_001)


def test_labels_outside_the_input_set_are_refused() -> None:
    with pytest.raises(MechanismError, match="input set"):
        _toy().sample(np.array([0.5]), rng=np.random.default_rng(0))
