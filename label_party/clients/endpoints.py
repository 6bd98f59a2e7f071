from __future__ import annotations

from fastapi import APIRouter, status

from label_party.auth import visible_dataset
from label_party.clients import service
from label_party.clients.schemas import (
    ClientCreate,
    ClientCreated,
    ClientRead,
    GrantCreate,
    GrantRead,
)
from label_party.deps import AdminDep, SessionDep, in_worker_thread
from label_party.exception_handlers import responses

router = APIRouter(tags=["access"])


@router.post(
    "/v1/clients",
    status_code=status.HTTP_201_CREATED,
    response_model=ClientCreated,
    responses=responses(401, 403, 422),
    summary="Create a client or auditor; its token is returned once (admin)",
)
def create_client(body: ClientCreate, session: SessionDep, principal: AdminDep) -> ClientCreated:
    client, token = service.create(session, principal, name=body.name, role=body.role)
    return ClientCreated(id=client.id, name=client.name, role=client.role, token=token)


@router.delete(
    "/v1/clients/{client_id}",
    response_model=ClientRead,
    responses=responses(401, 403, 404),
    summary="Revoke a client's token (admin)",
)
async def revoke_client(client_id: str, session: SessionDep, principal: AdminDep) -> ClientRead:

    def work() -> ClientRead:
        client = service.revoke(session, principal, client_id)
        return ClientRead.model_validate(client, from_attributes=True)

    return await in_worker_thread(work)


@router.post(
    "/v1/datasets/{dataset_id}/grants",
    status_code=status.HTTP_201_CREATED,
    response_model=GrantRead,
    responses=responses(401, 403, 404, 409, 422),
    summary="Grant a client access to a dataset (admin)",
)
async def create_grant(
    dataset_id: str, body: GrantCreate, session: SessionDep, principal: AdminDep
) -> GrantRead:

    def work() -> GrantRead:
        dataset = visible_dataset(session, principal, dataset_id)
        grant = service.grant(session, principal, dataset, body.client_id)
        return GrantRead.model_validate(grant, from_attributes=True)

    return await in_worker_thread(work)
