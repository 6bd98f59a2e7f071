"""SQL of the audit log."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

from label_party.models import AuditEntry


def last(session: Session) -> AuditEntry | None:
    return session.scalars(select(AuditEntry).order_by(AuditEntry.seq.desc()).limit(1)).first()


def page(session: Session, *, dataset_id: str | None, after: int, limit: int) -> list[AuditEntry]:
    query = select(AuditEntry).where(AuditEntry.seq > after)
    if dataset_id is not None:
        query = query.where(AuditEntry.dataset_id == dataset_id)
    return list(session.scalars(query.order_by(AuditEntry.seq).limit(limit)))


#: The columns of an entry, in the order its hash covers them (then the hash).
CHAIN_COLUMNS = (
    AuditEntry.seq,
    AuditEntry.created_at,
    AuditEntry.actor,
    AuditEntry.action,
    AuditEntry.dataset_id,
    AuditEntry.payload,
    AuditEntry.prev_hash,
    AuditEntry.hash,
)


ChainRow = Row[int, str, str, str, str | None, str, str, str]


def chain_page(session: Session, *, after: int, limit: int) -> Sequence[ChainRow]:
    """Entries after ``after`` as plain rows of :data:`CHAIN_COLUMNS`: a verification
    reads every entry, and plain rows halve its time against ORM objects (bench_audit)."""
    query = select(*CHAIN_COLUMNS).where(AuditEntry.seq > after)
    return session.execute(query.order_by(AuditEntry.seq).limit(limit)).all()
