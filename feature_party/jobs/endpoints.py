"""``/v1/jobs``."""

from __future__ import annotations

from fastapi import APIRouter

from feature_party.deps import SessionDep, SettingsDep
from feature_party.exception_handlers import ERROR_RESPONSES
from feature_party.jobs import service
from feature_party.jobs.schemas import JobAccepted, JobCreate, JobRead
from shared.protocol import ErrorBody

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERROR_RESPONSES)


@router.post("", status_code=202, response_model=JobAccepted)
def submit_job(session: SessionDep, settings: SettingsDep, body: JobCreate) -> JobAccepted:
    """Queue a training job; a worker (``labeldp feature-party worker``) runs it."""
    return service.submit(session, settings, body)


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
