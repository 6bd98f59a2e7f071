"""SQL of partition plans."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from label_party.models import PartitionPlan


def for_dataset(session: Session, dataset_id: str) -> PartitionPlan | None:
    return session.scalars(
        select(PartitionPlan).where(PartitionPlan.dataset_id == dataset_id)
    ).first()
