"""``mechanism preview``: fit a mechanism to a given prior and describe it.

The CLI (``labeldp mechanism preview``) and ``POST /v1/mechanisms/preview`` both
call :func:`preview`; no data and no budget are involved — the prior is supplied
by the caller.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from label_party.mechanisms.base import (
    LOSSES,
    FiniteMechanism,
    Loss,
    MechanismError,
    validate_prior,
)
from label_party.mechanisms.classification import RandomizedResponse, RRTopK
from label_party.mechanisms.registry import fit, get_spec

#: A preview carries a transition matrix of at most this many entries (about 20 MB
#: of JSON); past it ``outputs`` and ``matrix`` are null and the parameters say it
#: all (randomized response over K classes: K ≤ 1000).
PREVIEW_MAX_MATRIX_ENTRIES = 1_000_000


def preview(
    *,
    mechanism: str,
    epsilon: float,
    values: Sequence[float],
    prior: Sequence[float],
    loss: str | None = None,
    mesh: int | None = None,
    params: Mapping[str, Any] | None = None,
    time_limit: float | None = None,
) -> dict[str, Any]:
    """Fit ``mechanism`` and report outputs, matrix, noisy-label loss and bias.

    ``noisy_label_loss`` is E[ℓ(ŷ, y)] with y drawn from ``prior`` (``None`` for the
    Poisson loss of a mechanism with an output ≤ 0, where it is undefined); ``max_abs_bias``
    is max over ``values`` of |E[M(y)] − y|. Continuous mechanisms, and finite ones
    whose matrix has more than ``PREVIEW_MAX_MATRIX_ENTRIES`` entries (``rr`` over
    more than 1000 classes), report ``None`` for ``outputs`` and ``matrix``.
    ``seconds`` is the fitting time only. ``selected`` and ``params`` describe the
    fitted mechanism (``auto`` names its choice and why). ``time_limit`` (seconds)
    bounds the fits that can take long (the unbiased LP): ``FitTimeLimitError``.
    """
    spec = get_spec(mechanism)
    chosen: str = loss or ("zero-one" if spec.task == "classification" else "squared")
    if chosen not in LOSSES:
        raise MechanismError(f"unknown loss {chosen!r}; expected one of {', '.join(LOSSES)}")
    v, p = validate_prior(np.asarray(values, dtype=np.float64), np.asarray(prior, dtype=np.float64))
    if chosen == "poisson" and v[0] < 0:  # as a release checks: a count may be 0
        raise MechanismError("the Poisson loss needs non-negative values")
    options = dict(params or {})
    if mesh is not None:
        if "mesh" in options and options["mesh"] != mesh:  # one would silently win
            raise MechanismError("mesh is given twice, as mesh and as params.mesh: give it once")
        options["mesh"] = mesh  # checked by the mechanism, as in a release
    loss_name: Loss = chosen  # type: ignore[assignment]
    start = time.monotonic()
    deadline = None if time_limit is None else start + time_limit
    fitted = fit(mechanism, epsilon=epsilon, values=v, prior=p, loss=loss_name, params=options,
                 deadline=deadline)  # fmt: skip
    seconds = time.monotonic() - start
    outputs = matrix = None
    if isinstance(fitted, RandomizedResponse | RRTopK) and (
        fitted.num_classes**2 <= PREVIEW_MAX_MATRIX_ENTRIES
    ):
        fitted = fitted.as_finite()
    if isinstance(fitted, FiniteMechanism) and fitted.matrix.size <= PREVIEW_MAX_MATRIX_ENTRIES:
        outputs, matrix = fitted.outputs.tolist(), fitted.matrix.tolist()
    described = fitted.describe()
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            loss_value = fitted.noisy_label_loss(v, p, loss_name)
            max_abs_bias = float(np.max(np.abs(fitted.bias(v))))
    except (OverflowError, FloatingPointError) as exc:
        raise MechanismError(
            f"{mechanism}'s loss or bias overflows on these values ({type(exc).__name__}): "
            "narrow their range"
        ) from None
    noisy_label_loss: float | None = loss_value
    if chosen == "poisson" and loss_value == math.inf and math.isfinite(max_abs_bias):
        # An output ≤ 0 (an unbiased mechanism's, an additive one's) is no Poisson
        # rate: E[ℓ(ŷ, y)] is undefined, not an overflow. Such labels train a
        # log-link model, whose loss is linear in the label, so the bias is what counts.
        noisy_label_loss = None
    elif not (math.isfinite(loss_value) and math.isfinite(max_abs_bias)):
        # JSON has no infinity: the answer said null where it promised a number.
        raise MechanismError(
            f"{mechanism}'s expected {chosen} loss or bias is not finite on these values: "
            "their range overflows floats"
        )
    return {
        "mechanism": mechanism,
        "selected": described["name"],
        "params": described.get("params", {}),
        "epsilon": float(epsilon),
        "loss": chosen,
        "outputs": outputs,
        "matrix": matrix,
        "noisy_label_loss": noisy_label_loss,
        "max_abs_bias": max_abs_bias,
        "seconds": seconds,
    }
