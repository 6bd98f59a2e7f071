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


def read_current(session: Session, client_id: str) -> Client | None:
    """The client's row as committed now, not as this session last saw it."""
    return session.get(Client, client_id, populate_existing=True)
