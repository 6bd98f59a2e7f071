"""SQL of the audit log."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from label_party.models import AuditEntry


def last(session: Session) -> AuditEntry | None:
    return session.scalars(select(AuditEntry).order_by(AuditEntry.seq.desc()).limit(1)).first()


def page(session: Session, *, dataset_id: str | None, after: int, limit: int) -> list[AuditEntry]:
    query = select(AuditEntry).where(AuditEntry.seq > after)
    if dataset_id is not None:
        query = query.where(AuditEntry.dataset_id == dataset_id)
    return list(session.scalars(query.order_by(AuditEntry.seq).limit(limit)))
