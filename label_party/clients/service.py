"""Clients (bearer-token principals) and their grants on datasets."""

from __future__ import annotations

import secrets
import uuid

from sqlalchemy.orm import Session

from label_party.audit import service as audit
from label_party.auth import Principal, hash_token
from label_party.clients import repository
from label_party.db import lock_client
from label_party.exceptions import ConflictError, InvalidRequestError, NotFoundError
from label_party.models import Client, Dataset, Grant
from shared.timestamps import utcnow


def create(session: Session, principal: Principal, *, name: str, role: str) -> tuple[Client, str]:
    token = "ldp_" + secrets.token_urlsafe(32)
    client = Client(id=str(uuid.uuid4()), name=name, role=role, token_hash=hash_token(token))
    session.add(client)
    session.flush()
    audit.append(
        session,
        actor=principal.id,
        action="client.created",
        payload={"client_id": client.id, "role": role, "name": name},
    )
    return client, token


def _locked(session: Session, client_id: str) -> Client | None:
    """The client's row, locked (``FOR UPDATE`` on Postgres; SQLite's write
    transactions are serial): of two requests that revoke it or grant it the same
    dataset at once, the second sees what the first did, instead of a second audit
    entry or a unique-constraint error answered with 500."""
    return session.get(Client, client_id, with_for_update=True)


def revoke(session: Session, principal: Principal, client_id: str) -> Client:
    lock_client(session, client_id, revoking=True)  # after the writes holding it, before new ones
    client = _locked(session, client_id)
    if client is None:
        raise NotFoundError(f"client {client_id} not found")
    if client.revoked_at is None:
        client.revoked_at = utcnow()
        audit.append(
            session, actor=principal.id, action="client.revoked", payload={"client_id": client_id}
        )
    return client


def grant(session: Session, principal: Principal, dataset: Dataset, client_id: str) -> Grant:
    client = _locked(session, client_id)
    if client is None or client.revoked_at is not None:  # unknown things are 404 (§6)
        raise NotFoundError(f"client {client_id} does not exist or is revoked")
    if client.role != "client":
        raise InvalidRequestError("only clients (not auditors) receive dataset grants")
    if repository.grant(session, dataset.id, client_id) is not None:
        raise ConflictError(f"client {client_id} already has a grant on dataset {dataset.id}")
    row = Grant(dataset_id=dataset.id, client_id=client_id)
    session.add(row)
    session.flush()
    audit.append(
        session,
        actor=principal.id,
        action="grant.created",
        dataset_id=dataset.id,
        payload={"client_id": client_id},
    )
    return row
