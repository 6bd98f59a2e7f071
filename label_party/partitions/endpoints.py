from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request, Response, status
from pydantic import BaseModel

from label_party.auth import require, visible_dataset
from label_party.deps import (
    PrincipalDep,
    SessionDep,
    SettingsDep,
    in_worker_thread,
    visible_before_upload,
)
from label_party.exception_handlers import responses
from label_party.exceptions import NotFoundError
from label_party.labels.endpoints import MULTIPART_BODY, read_upload
from label_party.labels.validation import file_format
from label_party.models import PartitionPlan
from label_party.partitions import service

router = APIRouter(tags=["partitions"])


class PartitionPlanRead(BaseModel):
    id: str
    dataset_id: str
    #: Number of examples in each part.
    parts: dict[str, int]
    sha256: str
    created_at: datetime


def _read(plan: PartitionPlan) -> PartitionPlanRead:
    return PartitionPlanRead(
        id=plan.id,
        dataset_id=plan.dataset_id,
        parts=plan.parts,
        sha256=plan.sha256,
        created_at=plan.created_at,
    )


@router.post(
    "/v1/datasets/{dataset_id}/partitions",
    status_code=status.HTTP_201_CREATED,
    response_model=PartitionPlanRead,
    responses={
        200: {"model": PartitionPlanRead, "description": "The same assignment again: its plan"},
        **responses(401, 403, 404, 409, 413, 422),
    },
    openapi_extra=MULTIPART_BODY,
    summary="Register the dataset's partition plan (admin, granted client)",
    description="Multipart field `file`: CSV, Parquet or JSON lines with columns "
    "`example_id` and `part`, computed without labels. One plan per dataset: 409 for "
    "another one; the same assignment (in any row order) returns the plan (200), so a "
    "client may retry a registration whose answer it lost.",
)
async def register_plan(
    dataset_id: str,
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
) -> PartitionPlanRead:
    require(principal, "admin", "client")
    await visible_before_upload(request, principal, dataset_id)
    upload = await read_upload(request)
    try:
        fmt = file_format(upload.filename, upload.content_type)

        def store() -> tuple[PartitionPlan, bool]:
            return service.register(session, settings, principal, dataset_id, upload.file, fmt,
                                    unlocked=request.app.state.db.reader)  # fmt: skip

        plan, created = await in_worker_thread(store)
    finally:
        await upload.close()
    if not created:
        response.status_code = status.HTTP_200_OK
    return _read(plan)


@router.get(
    "/v1/datasets/{dataset_id}/partitions",
    response_model=PartitionPlanRead,
    responses=responses(401, 403, 404),
    summary="The dataset's partition plan",
)
def get_plan(dataset_id: str, session: SessionDep, principal: PrincipalDep) -> PartitionPlanRead:
    require(principal, "admin", "client")
    dataset = visible_dataset(session, principal, dataset_id)
    plan = service.get_plan(session, dataset.id)
    if plan is None:
        raise NotFoundError("the dataset has no partition plan")
    return _read(plan)
