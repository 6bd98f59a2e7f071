"""``/v1/received-labels``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from feature_party.deps import SessionDep, SettingsDep
from feature_party.exception_handlers import ERROR_RESPONSES
from feature_party.received_labels import service
from feature_party.received_labels.schemas import ReceivedLabelsCreate, ReceivedLabelsRead
from shared.pagination import PAGED, PagerDep
from shared.protocol import ErrorBody
from shared.spending import IdempotencyKeyHeader

router = APIRouter(
    prefix="/v1/received-labels",
    tags=["received labels"],
    responses={
        **ERROR_RESPONSES,
        403: {"model": ErrorBody, "description": "labels_party_refused: the token was refused"},
        409: {"model": ErrorBody, "description": "budget_exceeded at the labels party"},
        422: {
            "model": ErrorBody,
            "description": "invalid input, no_join, release_dataset_mismatch, or "
            "labels_party_refused (the labels party's own 4xx: its status and detail)",
        },
        502: {
            "model": ErrorBody,
            "description": "labels party down, failing or out of storage "
            "(labels_party_storage_unavailable), or hash mismatch",
        },
        507: {
            "model": ErrorBody,
            "description": "storage_unavailable: this service's disk is full or cannot be "
            "written (before asking for a release, or naming the release it made)",
        },
    },
)


@router.post(
    "",
    status_code=201,
    response_model=ReceivedLabelsRead,
    responses={
        200: {
            "model": ReceivedLabelsRead,
            "description": "the feature set holds this release already (a retry): its row",
        }
    },
)
def receive_labels(
    session: SessionDep,
    settings: SettingsDep,
    body: ReceivedLabelsCreate,
    response: Response,
    idempotency_key: IdempotencyKeyHeader = None,
) -> ReceivedLabelsRead:
    """Request or fetch a release, verify it, and join it to a feature set. The
    ``Idempotency-Key`` header is the new release's ``idempotency_key``. A release
    the feature set holds already (a retry) answers 200 with the row it has."""
    if idempotency_key is not None:
        body = service.with_header_key(body, idempotency_key)
    received, created = service.receive(session, settings, body)
    if not created:
        response.status_code = 200
    return received


@router.get(
    "", response_model=list[ReceivedLabelsRead], summary="Received releases", description=PAGED
)
def list_received_labels(
    session: SessionDep,
    pager: PagerDep,
    feature_set_id: Annotated[str | None, Query(description="only those joined to it")] = None,
    dataset_id: Annotated[str | None, Query(description="only this labels-party dataset's")] = None,
) -> list[ReceivedLabelsRead]:
    return service.list_page(session, pager, feature_set_id=feature_set_id, dataset_id=dataset_id)


@router.get("/{labels_id}", response_model=ReceivedLabelsRead)
def get_received_labels(session: SessionDep, labels_id: str) -> ReceivedLabelsRead:
    return service.get(session, labels_id)
