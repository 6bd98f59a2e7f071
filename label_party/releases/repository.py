"""SQL of releases."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from label_party.models import LedgerEntry, Release, ReleaseFailure
from shared import pagination


def by_idempotency_key(session: Session, dataset_id: str, key: str) -> Release | None:
    return session.scalars(
        select(Release).where(Release.dataset_id == dataset_id, Release.idempotency_key == key)
    ).first()


def failure_by_idempotency_key(
    session: Session, dataset_id: str, key: str
) -> ReleaseFailure | None:
    return session.scalars(
        select(ReleaseFailure).where(
            ReleaseFailure.dataset_id == dataset_id, ReleaseFailure.idempotency_key == key
        )
    ).first()


def count(session: Session, dataset_id: str) -> int:
    return session.scalar(select(func.count()).where(Release.dataset_id == dataset_id)) or 0


def exists(session: Session, dataset_id: str) -> bool:
    """Whether a release of the dataset, or a charged failure of one, read its labels."""
    return any(
        session.scalars(select(table.id).where(table.dataset_id == dataset_id)).first() is not None
        for table in (Release, ReleaseFailure)
    )


def list_for_dataset(
    session: Session, dataset_id: str, *, created_by: str | None, after: str | None, limit: int
) -> tuple[list[Release], bool]:
    """A page of the dataset's releases (``created_by``'s only, unless ``None``)
    and whether another follows (:mod:`shared.pagination`)."""
    query = select(Release).where(Release.dataset_id == dataset_id)
    if created_by is not None:
        query = query.where(Release.created_by == created_by)
    return pagination.page(session, query, Release, after=after, limit=limit)


def ledger_entries(session: Session, releases: list[Release]) -> dict[str, LedgerEntry]:
    """The ledger entries of ``releases`` by id, in one query."""
    ids = [r.ledger_entry_id for r in releases]
    if not ids:
        return {}
    return {e.id: e for e in session.scalars(select(LedgerEntry).where(LedgerEntry.id.in_(ids)))}
