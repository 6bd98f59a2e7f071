"""``/v1/jobs``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from feature_party.deps import SessionDep, SettingsDep
from feature_party.exception_handlers import ERROR_RESPONSES
from feature_party.jobs import service
from feature_party.jobs.schemas import JobAccepted, JobCreate, JobRead
from feature_party.jobs.status import Status
from shared.pagination import PAGED, PagerDep
from shared.protocol import ErrorBody

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERROR_RESPONSES)


@router.post("", status_code=202, response_model=JobAccepted)
def submit_job(session: SessionDep, settings: SettingsDep, body: JobCreate) -> JobAccepted:
    """Queue a training job; a worker (``labeldp feature-party worker``) runs it."""
    return service.submit(session, settings, body)


@router.get("", response_model=list[JobRead], summary="Training jobs", description=PAGED)
def list_jobs(
    session: SessionDep,
    pager: PagerDep,
    status: Annotated[Status | None, Query(description="only jobs in this status")] = None,
    feature_set_id: Annotated[str | None, Query(description="only this feature set's")] = None,
) -> list[JobRead]:
    return service.list_page(session, pager, status=status, feature_set_id=feature_set_id)


@router.get("/{job_id}", response_model=JobRead)
def get_job(session: SessionDep, job_id: str) -> JobRead:
    return service.get(session, job_id)


@router.delete(
    "/{job_id}",
    response_model=JobRead,
    responses={409: {"model": ErrorBody, "description": "the job already finished"}},
)
def cancel_job(session: SessionDep, job_id: str) -> JobRead:
    return service.cancel(session, job_id)
