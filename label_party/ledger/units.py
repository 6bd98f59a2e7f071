"""Exact privacy amounts: Decimal on the wire, integers in storage.

ε is counted in units of 10⁻¹² and δ in units of 10⁻¹⁸; a request with more
digits than that is refused rather than rounded, so every sum the ledger does is
an exact integer sum (ten releases of 0.1 spend exactly 1.0).
"""

from __future__ import annotations

from decimal import Decimal

from label_party.exceptions import InvalidRequestError

EPSILON_SCALE = 10**12
DELTA_SCALE = 10**18
MAX_UNITS = 2**62


def _to_units(amount: Decimal, scale: int, what: str) -> int:
    if not amount.is_finite() or amount < 0:
        raise InvalidRequestError(f"{what} must be a finite non-negative number")
    scaled = amount * scale
    if scaled != scaled.to_integral_value():
        digits = len(str(scale)) - 1
        raise InvalidRequestError(f"{what} has more than {digits} decimal places")
    units = int(scaled)
    if units > MAX_UNITS:
        raise InvalidRequestError(f"{what} is too large: at most {Decimal(MAX_UNITS) / scale:f}")
    return units


def epsilon_units(amount: Decimal) -> int:
    return _to_units(amount, EPSILON_SCALE, "epsilon")


def delta_units(amount: Decimal) -> int:
    return _to_units(amount, DELTA_SCALE, "delta")


def epsilon_decimal(units: int) -> Decimal:
    return (Decimal(units) / EPSILON_SCALE).normalize()


def delta_decimal(units: int) -> Decimal:
    return (Decimal(units) / DELTA_SCALE).normalize()
