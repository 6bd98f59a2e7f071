"""The budget ledger: lock, check without changing state, then record.

:func:`reserve` is called first in a release's transaction. It locks the dataset
row (``FOR UPDATE`` on Postgres; SQLite writers already hold the write lock), sums
the integer costs of the dataset's ledger entries per part, and either records the
new entry or raises :class:`BudgetExceededError` after logging the refusal. The
entry becomes visible only when the whole release commits (DESIGN.md §3.3).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from pydantic import BaseModel
from sqlalchemy.orm import Session

from label_party.audit import service as audit
from label_party.auth import Principal
from label_party.exceptions import BudgetExceededError, NotFoundError
from label_party.ledger import repository
from label_party.ledger.accounting import Cost, Spend, compose, fits
from label_party.ledger.units import delta_decimal, epsilon_decimal
from label_party.models import Dataset, LedgerEntry
from shared.protocol import PrivacyAmount

logger = logging.getLogger("label_party.ledger")


class PartBudget(BaseModel):
    name: str
    epsilon_spent: PrivacyAmount
    epsilon_remaining: PrivacyAmount
    delta_spent: PrivacyAmount
    delta_remaining: PrivacyAmount


class BudgetRead(BaseModel):
    """``epsilon_spent`` is the largest spend of any example (any part, or the
    examples outside every part); ``parts`` details each named part."""

    dataset_id: str
    epsilon_budget: PrivacyAmount
    epsilon_spent: PrivacyAmount
    epsilon_remaining: PrivacyAmount
    delta_budget: PrivacyAmount
    delta_spent: PrivacyAmount
    delta_remaining: PrivacyAmount
    parts: list[PartBudget]


def lock_dataset(session: Session, dataset_id: str) -> Dataset:
    dataset = repository.lock_dataset(session, dataset_id)
    if dataset is None:
        raise NotFoundError(f"dataset {dataset_id} not found")
    return dataset


def spend_of(session: Session, dataset_id: str) -> Spend:
    return compose(repository.costs(session, dataset_id))


def budget(session: Session, dataset: Dataset, part_names: Sequence[str]) -> BudgetRead:
    spend = spend_of(session, dataset.id)
    eps, delta = spend.worst(None)
    parts = []
    for name in sorted(set(part_names) | set(spend.part_epsilon)):
        p_eps, p_delta = spend.of_part(name)
        parts.append(
            PartBudget(
                name=name,
                epsilon_spent=epsilon_decimal(p_eps),
                epsilon_remaining=epsilon_decimal(dataset.epsilon_budget - p_eps),
                delta_spent=delta_decimal(p_delta),
                delta_remaining=delta_decimal(dataset.delta_budget - p_delta),
            )
        )
    return BudgetRead(
        dataset_id=dataset.id,
        epsilon_budget=epsilon_decimal(dataset.epsilon_budget),
        epsilon_spent=epsilon_decimal(eps),
        epsilon_remaining=epsilon_decimal(dataset.epsilon_budget - eps),
        delta_budget=delta_decimal(dataset.delta_budget),
        delta_spent=delta_decimal(delta),
        delta_remaining=delta_decimal(dataset.delta_budget - delta),
        parts=parts,
    )


def _fit(session: Session, dataset: Dataset, cost: Cost) -> tuple[bool, int, int]:
    """Whether ``cost`` fits the dataset's budget now, and the ε and δ units left."""
    return fits(
        spend_of(session, dataset.id),
        cost,
        epsilon_budget=dataset.epsilon_budget,
        delta_budget=dataset.delta_budget,
    )


def affordable(session: Session, dataset: Dataset, cost: Cost) -> bool:
    """Whether ``cost`` fits the dataset's budget now (a read: nothing is held)."""
    return _fit(session, dataset, cost)[0]


def refuse_unless_affordable(
    session: Session,
    principal: Principal,
    dataset: Dataset,
    cost: Cost,
    *,
    what: str,
    delta_known: bool = True,
) -> None:
    """Refuse ``cost`` (409, audited as ``<what>.refused``) unless it fits the budget of
    a dataset locked by :func:`lock_dataset`; ``what`` (``release`` or ``training``)
    names the spender in the refusal's message. ``delta_known=False``: ``cost.delta``
    is a lower bound (0), not what was asked, so the refusal records δ as unknown."""
    ok, eps_left, delta_left = _fit(session, dataset, cost)
    if ok:
        return
    detail = {
        "requested_epsilon": float(epsilon_decimal(cost.epsilon)),
        "remaining_epsilon": float(epsilon_decimal(max(eps_left, 0))),
        "requested_delta": float(delta_decimal(cost.delta)) if delta_known else None,
        "remaining_delta": float(delta_decimal(max(delta_left, 0))),
        "parts": None if cost.parts is None else list(cost.parts),
    }
    audit.append(
        session,
        actor=principal.id,
        action=f"{what}.refused",
        dataset_id=dataset.id,
        payload={"reason": "budget_exceeded", **detail},
    )
    logger.info(f"{what} refused: budget exceeded", extra={"fields": {"dataset_id": dataset.id}})
    message = _refusal(what, cost, eps_left, delta_left, dataset.delta_budget)
    raise BudgetExceededError(message, detail)


def reserve(
    session: Session,
    principal: Principal,
    dataset: Dataset,
    cost: Cost,
    *,
    what: str = "release",
) -> LedgerEntry:
    """Record ``cost`` against a dataset locked by :func:`lock_dataset`, or refuse
    (:func:`refuse_unless_affordable`)."""
    refuse_unless_affordable(session, principal, dataset, cost, what=what)
    entry = LedgerEntry(
        id=str(uuid.uuid4()),
        dataset_id=dataset.id,
        epsilon=cost.epsilon,
        delta=cost.delta,
        parts=None if cost.parts is None else list(cost.parts),
    )
    session.add(entry)
    session.flush()
    return entry


def _refusal(what: str, cost: Cost, eps_left: int, delta_left: int, delta_budget: int) -> str:
    """Names what is short — ε, δ or both — and a dataset without a δ budget
    (positional notation: ``10``, not the normalized Decimal's ``1E+1``)."""
    eps_left, delta_left = max(eps_left, 0), max(delta_left, 0)
    short = []
    if cost.epsilon > eps_left:
        short.append(
            f"ε = {epsilon_decimal(cost.epsilon):f} but only "
            f"ε = {epsilon_decimal(eps_left):f} remains"
        )
    if cost.delta > delta_left:
        short.append(
            f"δ = {delta_decimal(cost.delta):f} but only δ = {delta_decimal(delta_left):f} remains"
        )
    message = f"the {what} needs {' and '.join(short)} on its scope"
    if cost.delta > delta_left and delta_budget == 0:
        message += (
            "; the dataset has no δ budget (delta_budget 0): approximate-DP trainings need "
            "a dataset created with a delta_budget"
        )
    return message
