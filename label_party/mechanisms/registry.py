"""Every mechanism by its public name, and how to fit one.

A release and ``labeldp mechanism preview`` both go through :func:`fit`, so the
name a user types means the same mechanism everywhere.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from label_party.mechanisms.base import (
    FiniteMechanism,
    FitRequest,
    FloatArray,
    Loss,
    Mechanism,
    MechanismError,
    check_epsilon,
)

Task = Literal["regression", "classification"]


@dataclass(frozen=True)
class MechanismSpec:
    name: str
    task: Task
    finite: bool
    factory: Callable[[FitRequest], Mechanism]
    summary: str
    #: The mechanism's randomization uses a prior (so a release spends ε₁ on one).
    uses_prior: bool = False
    #: False for a mechanism that is not private by itself: previewed, never released.
    releasable: bool = True


def _lazy(module: str, function: str) -> Callable[[FitRequest], Mechanism]:
    """A factory imported on first use: listing mechanisms (the CLI's ``--help``)
    should not pay for scipy and HiGHS."""

    def factory(request: FitRequest) -> Mechanism:
        found = getattr(importlib.import_module(f"label_party.mechanisms.{module}"), function)
        mechanism: Mechanism = found(request)
        return mechanism

    factory.__qualname__ = f"{module}.{function}"
    return factory


#: What ``auto`` picks for each training loss, and why (DESIGN.md §4).
AUTO_CHOICES: dict[str, tuple[str, str]] = {
    "squared": (
        "unbiased",
        "for squared-loss training the optimal unbiased randomizer gave the lowest test "
        "loss over a wide range of ε (optimal-unbiased-randomizers.txt §4): an unbiased "
        "noisy label keeps the gradient unbiased, while RR-on-Bins' lower noisy-label loss "
        "comes with a bias the model learns",
    ),
    "poisson": (
        "unbiased",
        "the Poisson loss is linear in the label, so an unbiased label gives an unbiased "
        "loss (optimal-unbiased-randomizers.txt §3)",
    ),
    "absolute": (
        "rr-on-bins",
        "the absolute loss is not linear in the label, so unbiasedness does not carry "
        "over; RR-on-Bins is the optimal ε-DP randomizer for it (rr-on-bins-regression.txt "
        "Theorem 5)",
    ),
}


#: ``auto``'s choice where the unbiased LP is not solved reliably (ε above
#: ``unbiased.MAX_EPSILON``; a function of ε alone, so of nothing private).
HIGH_EPSILON_CHOICE = (
    "debiased-rr",
    "above ε = 12 the unbiased LP is not solved reliably; ε-dbRR is unbiased too, and "
    "the optimal unbiased randomizer approaches it as ε grows "
    "(optimal-unbiased-randomizers.txt §3.1)",
)


#: ``auto``'s choice below ``unbiased.MIN_EPSILON``, likewise a function of ε alone.
LOW_EPSILON_CHOICE = (
    "debiased-rr",
    "below ε = 0.001 the unbiased LP is not solved reliably; ε-dbRR is unbiased too",
)


def _auto_choice(loss: Loss, epsilon: float) -> tuple[str, str]:
    """``auto``'s mechanism for ``loss`` at ``epsilon``, and why: public inputs only."""
    from label_party.mechanisms.unbiased import MAX_EPSILON, MIN_EPSILON  # HiGHS: when used

    if loss not in AUTO_CHOICES:
        raise MechanismError(f"auto has no choice for the {loss!r} loss")
    name, reason = AUTO_CHOICES[loss]
    if name == "unbiased" and epsilon > MAX_EPSILON:
        return HIGH_EPSILON_CHOICE
    if name == "unbiased" and epsilon < MIN_EPSILON:
        return LOW_EPSILON_CHOICE
    return name, reason


def _auto(request: FitRequest) -> Mechanism:
    """The mechanism the papers found best for the declared training loss."""
    name, reason = _auto_choice(request.loss, request.epsilon)
    chosen = MECHANISMS[name].factory(request)
    assert isinstance(chosen, FiniteMechanism)
    return replace(chosen, params={**chosen.params, "selected_by": "auto", "reason": reason})


MECHANISMS: dict[str, MechanismSpec] = {
    spec.name: spec
    for spec in [
        MechanismSpec(
            "rr-on-bins",
            "regression",
            True,
            _lazy("rr_on_bins", "from_request"),
            "optimal ε-DP randomizer for the loss (Ghazi et al., Theorem 5)",
            uses_prior=True,
        ),
        MechanismSpec(
            "unbiased",
            "regression",
            True,
            _lazy("unbiased", "from_request"),
            "optimal unbiased randomizer by LP (Badanidiyuru et al., Algorithm 1)",
            uses_prior=True,
        ),
        MechanismSpec(
            "debiased-rr",
            "regression",
            True,
            _lazy("unbiased", "debiased_rr_from_request"),
            "debiased randomized response (Definition 23)",
        ),
        MechanismSpec(
            "laplace",
            "regression",
            False,
            _lazy("additive", "laplace_from_request"),
            "additive Laplace noise, scale (max−min)/ε; clip=true projects back",
        ),
        MechanismSpec(
            "staircase",
            "regression",
            False,
            _lazy("additive", "staircase_from_request"),
            "additive staircase noise (Geng & Viswanath 2014)",
        ),
        MechanismSpec(
            "exponential",
            "regression",
            False,
            _lazy("additive", "exponential_from_request"),
            "exponential mechanism on the domain with score −|ŷ−y| (Appendix F)",
        ),
        MechanismSpec(
            "randomized-rounding",
            "regression",
            True,
            _lazy("rounding", "from_request"),
            "unbiased randomized rounding onto a grid (not private by itself)",
            releasable=False,
        ),
        MechanismSpec(
            "rr",
            "classification",
            True,
            _lazy("classification", "rr_from_request"),
            "K-ary randomized response",
        ),
        MechanismSpec(
            "rr-with-prior",
            "classification",
            True,
            _lazy("classification", "rr_with_prior_from_request"),
            "RRTop-k with k* chosen from the example's prior (Ghazi et al. 2021)",
            uses_prior=True,
        ),
        MechanismSpec(
            "auto",
            "regression",
            True,
            _auto,
            "picks the best mechanism for the training loss and says why",
            uses_prior=True,
        ),
    ]
}


def get_spec(name: str) -> MechanismSpec:
    try:
        return MECHANISMS[name]
    except KeyError:
        known = ", ".join(sorted(MECHANISMS))
        shown = repr(name) if len(name) <= 64 else f"{name[:64]!r}… ({len(name)} characters)"
        raise MechanismError(f"unknown mechanism {shown}; known: {known}") from None


def uses_prior(name: str, *, loss: Loss, epsilon: float) -> bool:
    """Whether ``name`` fitted at ``epsilon`` for ``loss`` reads a prior, so that a
    release must spend ε₁ on one: ``auto``'s answer is its choice's (above ε = 12
    it picks ``debiased-rr``, which reads none)."""
    spec = get_spec(name)
    if name == "auto" and loss in AUTO_CHOICES:
        return get_spec(_auto_choice(loss, epsilon)[0]).uses_prior
    return spec.uses_prior


def fit(
    name: str,
    *,
    epsilon: float,
    values: FloatArray,
    prior: FloatArray,
    loss: Loss = "squared",
    domain: tuple[float, float] | None = None,
    params: Mapping[str, Any] | None = None,
    deadline: float | None = None,
) -> Mechanism:
    """Fit mechanism ``name`` at ``epsilon`` to ``prior`` over ``values`` (by
    ``deadline``, a ``time.monotonic()`` instant, where the fit can take long)."""
    spec = get_spec(name)
    try:
        return spec.factory(_request(epsilon, values, prior, loss, domain, params, deadline))
    except MechanismError:
        raise
    except Exception as exc:
        # A solver's own failure (an IndexError, a LinAlgError) is the mechanism's:
        # a release must charge it like any other (releases.service), never let it
        # through as a free 500 whose occurrence may depend on a noisy prior.
        if isinstance(exc, OverflowError):  # e^ε past 1.8e308: ε above about 709
            raise MechanismError(
                f"{name} could not be fitted at ε = {epsilon:g}: e^ε overflows a float; "
                "give a smaller ε (past about 40 every label is kept all but surely anyway)"
            ) from exc
        raise MechanismError(f"{name} could not be fitted ({type(exc).__name__})") from exc


def _request(
    epsilon: float,
    values: FloatArray,
    prior: FloatArray,
    loss: Loss,
    domain: tuple[float, float] | None,
    params: Mapping[str, Any] | None,
    deadline: float | None = None,
) -> FitRequest:
    return FitRequest(
        epsilon=check_epsilon(epsilon),
        values=np.asarray(values, dtype=np.float64),
        prior=np.asarray(prior, dtype=np.float64),
        loss=loss,
        domain=domain,
        params=dict(params or {}),
        deadline=deadline,
    )
