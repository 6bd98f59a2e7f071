"""The noise plan of a training: (sampling rate q, total steps T, noise multiplier σ).

One function, :func:`noise_plan`, turns a resolved spec and n (the labelled
examples the features cover) into the plan that DP-SGD will run with. The
service computes it when a training is requested, *before* anything is reserved,
so that a spec that cannot be calibrated is refused (422) without spending any
budget; the plan is stored in the training's resolved spec (``spec["plan"]``),
and the worker checks that the trainer ran exactly that plan
(:func:`check_ran_as_planned`) before it releases a model.

The formulas are those of :func:`label_party.labeldp_pro.train_labeldp_pro`
(Algorithm 1 of ``labeldp-pro.txt``; accounting as in §3.4): ``steps_per_epoch =
max(1, round(n / B))``, ``T = epochs · steps_per_epoch``, ``q = B / n``, and σ the
smallest noise multiplier whose RDP ε at (q, T, δ) is ≤ the requested ε
(:func:`label_party.labeldp_pro.calibrate_noise`; no amplification for the
``self-span``/``self-conv`` denoisers). The worker hands the plan's σ to
``train_labeldp_pro``, which re-accounts it and refuses one whose ε exceeds the
spec's; it derives q and T from the same formulas, and
:func:`check_ran_as_planned` checks they match before a model is released.
Nothing here reads a label: n is a count of example ids, everything else is
public configuration.

A plan is refused (:class:`InfeasiblePlanError`) when

* δ is not below 1 (the default δ = 1/n is 1 when a single example is covered);
* T exceeds the service's ``max_steps`` (``LABELDP_TRAINING_MAX_STEPS``): a run
  the worker could not finish in reasonable time, paid for all the same;
* σ would exceed ``B·√T``. The averaged noisy gradient's noise along any one
  direction has standard deviation σC/B per step, while the clipped signal is at
  most C; over the whole run the noise (σC√T/B) would then exceed the largest
  possible signal (TC) even along the single direction that matters — whatever
  the denoiser keeps, the model would be noise. ε falls as σ grows, so this is
  checked with one accountant call (is ε at σ = B·√T still above the target?)
  and an infeasible spec is refused without a full calibration. In DP-SGD terms
  the bound asks for roughly n·ε (with amplification) or B·ε (without) to be
  large enough: raising ε, the number of labelled examples, or (for ``self-*``
  denoisers) the batch size helps;
* the accountant cannot calibrate at all (its search stops at σ = 10⁷).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from shared.protocol import DELTA_SCALE, EPSILON_SCALE, WIDE, float_below


def below_charged(amount: float, scale: int) -> float:
    """A stored spec's ε (``scale`` EPSILON_SCALE) or δ (DELTA_SCALE) as the
    accountant targets it: the
    largest double not above the amount the ledger charged. The spec holds the
    double nearest that amount, above it half the time: calibrating to it could
    overshoot the charge by an ulp (helper-69). Where the double's ulp is finer
    than the ledger's unit, the charge is the one amount of the ledger's within
    half an ulp; elsewhere (ε ≥ 4096, δ ≥ 2⁻⁸) one ulp down is below it."""
    value = float(amount)
    unit = WIDE.divide(Decimal(1), Decimal(scale))
    if math.ulp(value) < float(unit):
        return float_below(Decimal(value).quantize(unit, context=WIDE))
    return math.nextafter(value, 0.0)


class InfeasiblePlanError(ValueError):
    """The spec's (ε, δ, epochs, batch size, denoiser) cannot be trained as asked.

    Messages name public parameters only (never a label or a statistic of the
    labels); ``detail`` holds the numbers behind the refusal."""

    def __init__(self, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or {}


class PlanMismatchError(ValueError):
    """The trainer ran with other (q, T, σ) than the plan accepted with the training."""


@dataclass(frozen=True)
class NoisePlan:
    """What DP-SGD runs with: Poisson sampling rate ``sampling_rate`` = B/n,
    ``steps`` = epochs · ``steps_per_epoch`` Gaussian steps at noise multiplier
    ``noise_multiplier`` (σ; noise N(0, σ²C²I) on the clipped sum), and whether
    the accountant used amplification by subsampling (Table 1)."""

    noise_multiplier: float
    sampling_rate: float
    steps: int
    steps_per_epoch: int
    amplification: bool

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON fields, as stored in ``spec["plan"]``."""
        return asdict(self)


def noise_plan(
    spec: Mapping[str, Any], num_examples: int, *, max_steps: int | None = None
) -> NoisePlan:
    """The plan for a resolved spec (``epsilon``, ``delta``, ``epochs``,
    ``expected_batch_size``, ``denoiser``) over ``num_examples`` labelled examples,
    of at most ``max_steps`` steps.

    Raises :class:`InfeasiblePlanError` when it cannot be trained as asked.
    """
    # Imported here: the package imports torch (its trainer), which the service
    # process otherwise never loads; the first plan pays for it once.
    from label_party.labeldp_pro.accounting import (
        amplification_for,
        calibrate_noise,
        epsilon_for,
    )

    n = int(num_examples)
    batch = int(spec["expected_batch_size"])
    epsilon, delta = float(spec["epsilon"]), float(spec["delta"])
    if not 1 <= batch <= n:
        raise InfeasiblePlanError(
            f"expected_batch_size must be between 1 and the {n} labelled examples "
            "the features cover"
        )
    if not 0 < delta < 1:
        raise InfeasiblePlanError(
            f"delta must be below 1, got {delta:g} (the default 1/n is 1 when the "
            "features cover a single labelled example): give a smaller delta"
        )
    per_epoch = steps_per_epoch(n, batch)
    steps = int(spec["epochs"]) * per_epoch
    if max_steps is not None and steps > max_steps:
        raise InfeasiblePlanError(
            f"{spec['epochs']} epochs of {per_epoch} steps (expected batch size "
            f"{batch} over {n} labelled examples) are {steps} steps; this labels party "
            f"trains at most {max_steps} (LABELDP_TRAINING_MAX_STEPS): raise "
            "expected_batch_size or lower epochs",
            {"steps": steps, "max_steps": max_steps},
        )
    rate = batch / n
    amplification = amplification_for(str(spec["denoiser"]))
    detail: dict[str, Any] = {
        "epsilon": epsilon,
        "delta": delta,
        "sampling_rate": rate,
        "steps": steps,
        "amplification": amplification,
    }
    # ε falls as σ grows, so the ceiling is one accountant call: an infeasible
    # spec is refused without a full calibration.
    ceiling = batch * math.sqrt(steps)
    # What the accountant targets: never above the charge.
    target = below_charged(epsilon, EPSILON_SCALE), below_charged(delta, DELTA_SCALE)
    try:
        if epsilon_for(ceiling, rate, steps, target[1], amplification=amplification) > target[0]:
            raise InfeasiblePlanError(
                f"epsilon {epsilon:g} at delta {delta:g} over {steps} steps at expected "
                f"batch size {batch} needs a noise multiplier above B·√T = {ceiling:.4g}, "
                "where the noise outweighs any gradient signal and the model would be "
                "noise: raise epsilon, cover more labelled examples, or (for self-span "
                "and self-conv) raise expected_batch_size",
                {**detail, "max_noise_multiplier": ceiling},
            )
        sigma = calibrate_noise(*target, rate, steps, amplification=amplification)
    except InfeasiblePlanError:
        raise
    except ValueError as exc:
        raise InfeasiblePlanError(f"the noise cannot be calibrated: {exc}", detail) from None
    return NoisePlan(
        noise_multiplier=sigma,
        sampling_rate=rate,
        steps=steps,
        steps_per_epoch=per_epoch,
        amplification=amplification,
    )


def steps_per_epoch(num_examples: int, expected_batch_size: int) -> int:
    """``max(1, round(n / B))``, as the trainer counts an epoch's steps."""
    return max(1, round(num_examples / expected_batch_size))


def check_ran_as_planned(plan: Mapping[str, Any], accounting: Mapping[str, Any]) -> None:
    """Raise :class:`PlanMismatchError` unless the trainer's accounting record
    (:class:`label_party.labeldp_pro.AccountingRecord` as a dict) ran ``plan``.

    The trainer takes σ from the plan and derives q and T itself; this keeps the
    plan the features party was shown at acceptance and the released model in
    step (a changed trainer would otherwise drift).
    """
    same = (
        int(accounting["steps"]) == int(plan["steps"])
        and bool(accounting["amplification"]) == bool(plan["amplification"])
        and math.isclose(accounting["sampling_rate"], plan["sampling_rate"], rel_tol=1e-12)
        and math.isclose(accounting["noise_multiplier"], plan["noise_multiplier"], rel_tol=1e-9)
    )
    if not same:
        raise PlanMismatchError(
            "the trainer's noise calibration differs from the plan accepted with this "
            "training; the model is not released"
        )
