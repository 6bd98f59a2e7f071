"""Exact privacy amounts: Decimal on the wire, integers in storage.

ε is counted in units of 10⁻¹² and δ in units of 10⁻¹⁸; a request with more
digits than that is refused rather than rounded, so every sum the ledger does is
an exact integer sum (ten releases of 0.1 spend exactly 1.0).
"""

from __future__ import annotations

from decimal import Decimal

from label_party.exceptions import InvalidRequestError
from shared.protocol import DELTA_SCALE, EPSILON_SCALE, ledger_units


def _to_units(amount: Decimal, scale: int, what: str) -> int:
    try:
        return ledger_units(amount, scale, what)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None


def epsilon_units(amount: Decimal, what: str = "epsilon") -> int:
    return _to_units(amount, EPSILON_SCALE, what)


def delta_units(amount: Decimal) -> int:
    return _to_units(amount, DELTA_SCALE, "delta")


def epsilon_decimal(units: int) -> Decimal:
    return (Decimal(units) / EPSILON_SCALE).normalize()


def delta_decimal(units: int) -> Decimal:
    return (Decimal(units) / DELTA_SCALE).normalize()
