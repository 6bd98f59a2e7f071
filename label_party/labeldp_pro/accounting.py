"""(ε, δ) accounting for LabelDP-Pro (``labeldp-pro.txt`` §3.4).

One training step of Algorithm 1 is a Gaussian mechanism (noise ``N(0, σ²C²I)`` on a
sum of per-example gradients clipped to norm ``C``) run on a Poisson sample of the
data with rate ``q``; a run of ``T`` steps is their adaptive composition. We never
hand-write the accountant (DESIGN.md §4): the numbers come from Google's
``dp-accounting`` RDP accountant, the library the paper itself uses (§3.4).

Amplification by subsampling (Table 1, last column):

* ``noop`` and ``alt-conv`` keep it: the ALTCONV hull is built from an independent
  batch ``I^P`` and touches no label, so the denoiser is post-processing (§3.4);
* ``self-span`` and ``self-conv`` lose it: their projection set is built from the
  batch ``I^G`` itself, so the output reveals which examples were sampled. They are
  accounted as full-batch Gaussian steps, ``q = 1`` in the accountant.

Neighbouring relation: label DP's — two datasets differ in **one example's label**
(DESIGN.md §3), not in the presence of an example. Changing a label moves that
example's clipped gradient by up to ``2C`` while its inclusion coin stays the same,
so each step is accounted as a Poisson-subsampled Gaussian of sensitivity ``2C``:
``dp-accounting``'s add-or-remove RDP accountant with noise multiplier ``σ/2``
(the library's RDP accountant has no replace-one analysis for Poisson sampling).
By the advanced joint convexity of subsampled mechanisms (Balle, Barthe and
Gaboardi, 2018) the substitution pair is no easier to tell apart than that one.
This is conservative: the library's *PLD* replace-one analysis would report about
0.6 of this ε at target 1, and its pair was the worst label change on a numerical
grid (``python -m bench.bench_accounting --dominance``, bench/README.md). Adopting
it waits for a privacy review. The paper (§3.4)
reports add-or-remove ε with sensitivity ``C``: for the same ε this service
therefore adds twice the paper's noise. The record names the relation so that an
auditor sees it.
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

import dp_accounting
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS
from scipy.optimize import brentq

#: The library's default orders stop at 1024, which floors ε near log(1/δ)/1023
#: (≈ 0.011 at δ = 1e-5); the paper goes down to ε = 0.01 (Tables 5, 14), so the
#: grid continues to higher orders. Higher orders only ever tighten the minimum.
RDP_ORDERS: Final[tuple[float, ...]] = (*DEFAULT_RDP_ORDERS, 2048.0, 4096.0, 8192.0)


class _ExcludedOrderFilter(logging.Filter):
    """Drops the library's warning that a fractional order's series did not
    converge: it then excludes that order (its RDP is taken as infinite), so ε over
    the other orders is still an upper bound. Calibration meets it for most small σ
    it tries, dozens of lines per training request, none an operator can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


logging.getLogger("absl").addFilter(_ExcludedOrderFilter())

ACCOUNTANT_NAME: Final = "dp_accounting.rdp.RdpAccountant"
NEIGHBORING_RELATION: Final = (
    "label substitution: sensitivity 2C, accounted as add-or-remove-one at noise multiplier σ/2"
)
#: How far one label change can move the clipped gradient sum, in units of C.
LABEL_SENSITIVITY: Final = 2.0

#: Denoisers whose projection set comes from the sampled batch itself (Table 1).
DENOISERS_WITHOUT_AMPLIFICATION: Final = frozenset({"self-span", "self-conv"})

#: Search bracket for the noise multiplier; a target that needs more is refused.
_SIGMA_MIN: Final = 1e-3
_SIGMA_MAX: Final = 1e7


@dataclass(frozen=True)
class AccountingRecord:
    """The privacy guarantee of one training run, in a form an auditor can read.

    ``sampling_rate`` is the rate the data were sampled at; ``amplification`` says
    whether the accountant used it (False: it accounted ``q = 1``).
    """

    epsilon: float
    delta: float
    noise_multiplier: float
    sampling_rate: float
    steps: int
    amplification: bool
    accountant: str
    accountant_version: str
    neighboring_relation: str = NEIGHBORING_RELATION

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serializable fields."""
        return asdict(self)


def accountant_version() -> str:
    """The installed ``dp-accounting`` version, recorded beside every ε."""
    return importlib.metadata.version("dp-accounting")


def amplification_for(denoiser: str) -> bool:
    """Whether a denoiser keeps amplification by subsampling (Table 1)."""
    return denoiser not in DENOISERS_WITHOUT_AMPLIFICATION


def epsilon_for(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    *,
    amplification: bool = True,
) -> float:
    """ε after ``steps`` Poisson-subsampled Gaussian steps (§3.4), by RDP.

    With ``amplification=False`` the accountant sees ``q = 1`` whatever the
    sampling rate (SELFSPAN / SELFCONV, Table 1).
    """
    _check_common(sampling_rate, steps, delta)
    sigma = _check_sigma(noise_multiplier)
    return _epsilon(sigma, _accounted_rate(sampling_rate, amplification), steps, delta)


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    *,
    amplification: bool = True,
    rtol: float = 1e-4,
) -> float:
    """The smallest noise multiplier (to relative ``rtol``) whose ε is ≤ the target.

    ε decreases in σ. A doubling search brackets the crossing, Brent's method
    locates it, and the answer is stepped up by ``rtol`` until ε(σ) ≤ target is
    *checked*: the answer never overshoots the budget, it only wastes about
    ``rtol`` of σ.
    """
    _check_common(sampling_rate, steps, delta)
    target = _check_epsilon(target_epsilon)
    if not 0 < rtol < 1:
        raise ValueError(f"rtol must be in (0, 1), got {rtol!r}")
    q = _accounted_rate(sampling_rate, amplification)
    lo, hi = _bracket(target, q, steps, delta)
    if lo == hi:
        return hi
    # Brent's method finds the crossing in a few evaluations (to rtol/2); the
    # root is then stepped up until ε ≤ target is checked, so it never overshoots.
    root = float(
        brentq(
            lambda s: _epsilon(s, q, steps, delta) - target,
            lo,
            hi,
            xtol=0.25 * rtol * lo,
            rtol=0.25 * rtol,
        )
    )
    sigma = root * (1.0 + rtol)
    while _epsilon(sigma, q, steps, delta) > target:
        sigma *= 1.0 + rtol
    return min(sigma, hi)


def account(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    *,
    amplification: bool = True,
) -> AccountingRecord:
    """The :class:`AccountingRecord` of a run with these public parameters."""
    eps = epsilon_for(noise_multiplier, sampling_rate, steps, delta, amplification=amplification)
    return AccountingRecord(
        epsilon=eps,
        delta=float(delta),
        noise_multiplier=float(noise_multiplier),
        sampling_rate=float(sampling_rate),
        steps=int(steps),
        amplification=amplification,
        accountant=ACCOUNTANT_NAME,
        accountant_version=accountant_version(),
    )


def _epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """ε by RDP over the library's orders, extended only when the optimum sits at
    their top: fewer orders give a larger ε, so the shortcut can only over-report."""
    eps, order = _epsilon_and_order(sigma, q, steps, delta, DEFAULT_RDP_ORDERS)
    if order >= max(DEFAULT_RDP_ORDERS):
        eps, _ = _epsilon_and_order(sigma, q, steps, delta, RDP_ORDERS)
    return eps


def _epsilon_and_order(
    sigma: float, q: float, steps: int, delta: float, orders: Sequence[float]
) -> tuple[float, float]:
    accountant = RdpAccountant(orders=orders)
    # Sensitivity 2C at noise σC is the library's sensitivity-1 mechanism at σ/2.
    step: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(sigma / LABEL_SENSITIVITY)
    if q < 1.0:
        step = dp_accounting.PoissonSampledDpEvent(q, step)
    accountant.compose(dp_accounting.SelfComposedDpEvent(step, steps))
    eps, order = accountant.get_epsilon_and_optimal_order(delta)
    return float(eps), float(order)


def _bracket(target: float, q: float, steps: int, delta: float) -> tuple[float, float]:
    """``lo < hi`` with ε(hi) ≤ target < ε(lo), by doubling from σ = 1 (or
    ``lo == hi`` when even the smallest σ searched meets the target)."""
    hi = 1.0
    while _epsilon(hi, q, steps, delta) > target:
        hi *= 2.0
        if hi > _SIGMA_MAX:
            raise ValueError(
                f"epsilon {target} is unreachable at delta {delta} with {steps} steps "
                f"at sampling rate {q}: it needs a noise multiplier above {_SIGMA_MAX:g}"
            )
    lo = hi / 2.0
    while _epsilon(lo, q, steps, delta) <= target:
        if lo < _SIGMA_MIN:
            return lo, lo  # so little noise already meets the target
        hi, lo = lo, lo / 2.0
    return lo, hi


def _accounted_rate(sampling_rate: float, amplification: bool) -> float:
    return float(sampling_rate) if amplification else 1.0


def _check_common(sampling_rate: float, steps: int, delta: float) -> None:
    q = float(sampling_rate)
    if not (math.isfinite(q) and 0 < q <= 1):
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    d = float(delta)
    if not (math.isfinite(d) and 0 < d < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def _check_epsilon(epsilon: float) -> float:
    eps = float(epsilon)
    if not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"target epsilon must be a finite number > 0, got {epsilon!r}")
    return eps


def _check_sigma(noise_multiplier: float) -> float:
    sigma = float(noise_multiplier)
    if not math.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier!r}")
    return sigma
