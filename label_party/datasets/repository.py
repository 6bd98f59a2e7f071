"""SQL of datasets."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from label_party.models import Dataset, Grant


def list_all(session: Session, *, granted_to: str | None = None) -> list[Dataset]:
    query = select(Dataset).order_by(Dataset.created_at, Dataset.id)
    if granted_to is not None:
        query = query.join(Grant, Grant.dataset_id == Dataset.id).where(
            Grant.client_id == granted_to
        )
    return list(session.scalars(query))


def all_ids(session: Session) -> list[str]:
    return list(session.scalars(select(Dataset.id)))
