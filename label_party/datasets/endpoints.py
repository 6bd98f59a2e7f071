from __future__ import annotations

from fastapi import APIRouter, status

from label_party.auth import require, visible_dataset
from label_party.datasets import service
from label_party.datasets.schemas import DatasetCreate, DatasetRead
from label_party.deps import AdminDep, PrincipalDep, SessionDep, SettingsDep, in_worker_thread
from label_party.exception_handlers import responses
from label_party.ledger import service as ledger
from label_party.ledger.service import BudgetRead
from label_party.partitions.service import get_plan

router = APIRouter(tags=["datasets"])


@router.post(
    "/v1/datasets",
    status_code=status.HTTP_201_CREATED,
    response_model=DatasetRead,
    responses=responses(401, 403, 422),
    summary="Create a dataset: task, declared label domain, ε (and δ) budget (admin)",
)
async def create_dataset(
    body: DatasetCreate, session: SessionDep, settings: SettingsDep, principal: AdminDep
) -> DatasetRead:

    def work() -> DatasetRead:
        dataset = service.create(session, principal, body, max_grid=settings.max_grid_size)
        return service.to_read(session, dataset)

    return await in_worker_thread(work)


@router.get(
    "/v1/datasets",
    response_model=list[DatasetRead],
    responses=responses(401, 403),
    summary="Datasets the caller may see (a client: those granted to it)",
)
def list_datasets(session: SessionDep, principal: PrincipalDep) -> list[DatasetRead]:
    require(principal, "admin", "client")
    return [service.to_read(session, d) for d in service.list_visible(session, principal)]


@router.get(
    "/v1/datasets/{dataset_id}",
    response_model=DatasetRead,
    responses=responses(401, 403, 404),
    summary="One dataset's public configuration",
)
def get_dataset(dataset_id: str, session: SessionDep, principal: PrincipalDep) -> DatasetRead:
    require(principal, "admin", "client")
    return service.to_read(session, visible_dataset(session, principal, dataset_id))


@router.get(
    "/v1/datasets/{dataset_id}/budget",
    response_model=BudgetRead,
    responses=responses(401, 404),
    summary="Budget, spend and remaining, per part (admin, granted client, auditor)",
)
def get_budget(dataset_id: str, session: SessionDep, principal: PrincipalDep) -> BudgetRead:
    dataset = visible_dataset(session, principal, dataset_id)
    plan = get_plan(session, dataset.id)
    return ledger.budget(session, dataset, [] if plan is None else list(plan.parts))
