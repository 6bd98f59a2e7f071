"""Who is calling, and what each role may do.

Roles: the operator's ``admin`` token (from settings) may do everything; a
``client`` (a features party) sees and releases only datasets granted to it and
reads only its own releases; an ``auditor`` reads budgets and audit logs only.
Nobody can read raw labels back: no endpoint serves them.

Datasets a client may not see answer 404, as if they did not exist.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.orm import Session

from label_party.clients import repository as clients_repository
from label_party.db import lock_client
from label_party.exceptions import ForbiddenError, NotFoundError, UnauthorizedError
from label_party.models import Dataset

Role = Literal["admin", "client", "auditor"]
ADMIN_ID = "admin"


@dataclass(frozen=True)
class Principal:
    id: str
    role: Role

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def hash_token(token: str) -> str:
    """Tokens are 256-bit random strings, so one SHA-256 is a sufficient hash."""
    return hashlib.sha256(token.encode()).hexdigest()


def authenticate(session: Session, token: str | None, admin_token: str | None) -> Principal:
    if not token:
        raise UnauthorizedError("a bearer token is required")
    if admin_token is not None and hmac.compare_digest(token.encode(), admin_token.encode()):
        return Principal(ADMIN_ID, "admin")
    client = clients_repository.by_token_hash(session, hash_token(token))
    if client is None or client.revoked_at is not None:
        raise UnauthorizedError("unknown or revoked token")
    role: Role = "auditor" if client.role == "auditor" else "client"
    return Principal(client.id, role)


def confirm(session: Session, principal: Principal) -> None:
    """Refuse (401) a client whose token was revoked since :func:`authenticate`.

    A request is authenticated when it arrives, in a transaction of its own; a
    revocation that commits while it runs (a slow upload, seconds of planning) must
    still stop it from spending ε or fixing a partition plan. Called in the write
    transaction, after the dataset lock and before its first write: the request
    then commits wholly before a concurrent revocation, or not at all
    (:func:`label_party.db.lock_client`)."""
    if principal.is_admin:
        return
    lock_client(session, principal.id, revoking=False)
    client = clients_repository.read_current(session, principal.id)
    if client is None or client.revoked_at is not None:
        raise UnauthorizedError("unknown or revoked token")


def require(principal: Principal, *roles: Role) -> None:
    if principal.role not in roles:
        raise ForbiddenError(f"the {principal.role} role may not do this")


def has_grant(session: Session, principal: Principal, dataset_id: str) -> bool:
    return clients_repository.grant(session, dataset_id, principal.id) is not None


def sees_own(session: Session, principal: Principal, created_by: str, dataset_id: str) -> bool:
    """Whether ``principal`` may read a release or training made by ``created_by`` on
    ``dataset_id``: the admin any; a client its own, while it still holds the
    dataset's grant (its own once read on without one; helper-79)."""
    if principal.role != "client":
        return True
    return created_by == principal.id and has_grant(session, principal, dataset_id)


def visible_dataset(session: Session, principal: Principal, dataset_id: str) -> Dataset:
    """The dataset if the principal may see it (admin, auditor, granted client), else 404."""
    dataset = session.get(Dataset, dataset_id)
    if dataset is None or (
        principal.role == "client" and not has_grant(session, principal, dataset_id)
    ):
        raise NotFoundError(f"dataset {dataset_id} not found")
    return dataset
