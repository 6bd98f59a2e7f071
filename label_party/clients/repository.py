"""SQL of clients and grants."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from label_party.models import Client, Grant


def by_token_hash(session: Session, token_hash: str) -> Client | None:
    return session.scalars(select(Client).where(Client.token_hash == token_hash)).first()


def grant(session: Session, dataset_id: str, client_id: str) -> Grant | None:
    return session.scalars(
        select(Grant).where(Grant.dataset_id == dataset_id, Grant.client_id == client_id)
    ).first()


def read_locked(session: Session, client_id: str) -> Client | None:
    """The client's row as committed now, held against a concurrent revocation
    until this transaction ends (``FOR SHARE`` on Postgres; SQLite's write
    transactions are serial)."""
    return session.get(Client, client_id, with_for_update={"read": True}, populate_existing=True)
