"""SQL of trainings: lookups, and the shared lease queue on the ``trainings`` table."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from label_party.models import Training
from shared import pagination
from shared.lease_queue import LeaseQueue
from shared.timestamps import utcnow


def queue(session: Session) -> LeaseQueue[Training]:
    return LeaseQueue(session, Training, clock=utcnow)


def census(session: Session) -> tuple[dict[str, int], int]:
    """Trainings by status, and how many of the running ones are stalled."""
    rows = session.execute(select(Training.status, func.count()).group_by(Training.status))
    return {status: int(n) for status, n in rows}, queue(session).count_stalled()


def by_idempotency_key(session: Session, dataset_id: str, key: str) -> Training | None:
    return session.scalars(
        select(Training).where(Training.dataset_id == dataset_id, Training.idempotency_key == key)
    ).first()


def exists(session: Session, dataset_id: str) -> bool:
    """Whether any training (in any status: each charged the ledger) names the dataset."""
    query = select(Training.id).where(Training.dataset_id == dataset_id)
    return session.scalars(query).first() is not None


def list_for_dataset(
    session: Session, dataset_id: str, *, created_by: str | None, after: str | None, limit: int
) -> tuple[list[Training], bool]:
    """A page of the dataset's trainings (``created_by``'s only, unless ``None``)
    and whether another follows (:mod:`shared.pagination`)."""
    query = select(Training).where(Training.dataset_id == dataset_id)
    if created_by is not None:
        query = query.where(Training.created_by == created_by)
    return pagination.page(session, query, Training, after=after, limit=limit)
