"""SQL of the ledger: the dataset row lock and the recorded costs."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import select
from sqlalchemy.orm import Session

from label_party.ledger.accounting import Cost
from label_party.models import Dataset, LedgerEntry


def lock_dataset(session: Session, dataset_id: str) -> Dataset | None:
    """``SELECT … FOR UPDATE`` of the dataset row (a no-op on SQLite, whose writers
    hold the database lock). ``populate_existing``: the row read after waiting for
    the lock is the truth, even if this session loaded an older version before."""
    return session.scalars(
        select(Dataset)
        .where(Dataset.id == dataset_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).first()


def costs(session: Session, dataset_id: str) -> Iterator[Cost]:
    rows = session.execute(
        select(LedgerEntry.epsilon, LedgerEntry.delta, LedgerEntry.parts).where(
            LedgerEntry.dataset_id == dataset_id
        )
    )
    for epsilon, delta, parts in rows:
        yield Cost(epsilon, delta, None if parts is None else tuple(parts))


def all_entries(session: Session) -> list[LedgerEntry]:
    return list(session.scalars(select(LedgerEntry)))
