from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel
from sqlalchemy.orm import Session

from label_party.audit import service
from label_party.auth import require, visible_dataset
from label_party.deps import PrincipalDep, SessionDep
from label_party.exception_handlers import responses
from label_party.exceptions import InvalidRequestError

router = APIRouter(tags=["audit"])

#: The largest sequence number a database integer holds (beyond it: 422, not 500).
MAX_SEQUENCE = 2**63 - 1


class AuditEntryRead(BaseModel):
    seq: int
    created_at: str
    actor: str
    action: str
    dataset_id: str | None
    payload: dict[str, Any]
    prev_hash: str
    hash: str


class AuditPage(BaseModel):
    entries: list[AuditEntryRead]
    #: Pass as ``after`` for the next page; ``None`` on the last page.
    next_after: int | None


class VerificationRead(BaseModel):
    ok: bool
    entries: int
    first_bad_entry: int | None = None
    reason: str | None = None
    #: ``"seq:hash"`` of the last entry: keep it outside this service and pass it
    #: back as ``anchor`` later; a rewritten chain cannot pass through it.
    head: str | None = None


@router.get(
    "/v1/datasets/{dataset_id}/audit",
    response_model=AuditPage,
    responses=responses(401, 403, 404),
    summary="Page through a dataset's audit entries (admin, auditor)",
)
def dataset_audit(
    dataset_id: str,
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[int, Query(ge=0, le=MAX_SEQUENCE)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AuditPage:
    require(principal, "admin", "auditor")
    dataset = visible_dataset(session, principal, dataset_id)
    return _page(session, dataset.id, after, limit)


@router.get(
    "/v1/audit",
    response_model=AuditPage,
    responses=responses(401, 403),
    summary="Page through the whole audit chain (admin, auditor)",
)
def audit_log(
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[int, Query(ge=0, le=MAX_SEQUENCE)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AuditPage:
    require(principal, "admin", "auditor")
    return _page(session, None, after, limit)


def _page(session: Session, dataset_id: str | None, after: int, limit: int) -> AuditPage:
    # One row more than asked says whether a next page exists.
    rows = service.page(session, dataset_id=dataset_id, after=after, limit=limit + 1)
    more, rows = len(rows) > limit, rows[:limit]
    entries = [
        AuditEntryRead(
            seq=r.seq,
            created_at=r.created_at,
            actor=r.actor,
            action=r.action,
            dataset_id=r.dataset_id,
            payload=json.loads(r.payload),
            prev_hash=r.prev_hash,
            hash=r.hash,
        )
        for r in rows
    ]
    return AuditPage(entries=entries, next_after=rows[-1].seq if more else None)


@router.get(
    "/v1/audit/verify",
    response_model=VerificationRead,
    responses=responses(401, 403, 422),
    summary="Recompute the hash chain and every part's spend from the log (admin, auditor)",
)
def verify(
    session: SessionDep,
    principal: PrincipalDep,
    anchor: Annotated[
        str | None,
        Query(
            max_length=100,
            description="a head an earlier verification gave (SEQ:HASH): the chain "
            "must still pass through it",
        ),
    ] = None,
) -> VerificationRead:
    require(principal, "admin", "auditor")
    try:
        parsed = None if anchor is None else service.Anchor.parse(anchor)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    result = service.verify(session, anchor=parsed)
    return VerificationRead(
        ok=result.ok,
        entries=result.entries,
        first_bad_entry=result.first_bad_entry,
        reason=result.reason,
        head=result.head,
    )
