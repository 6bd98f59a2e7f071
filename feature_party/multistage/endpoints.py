"""``/v1/multistage``: LP-MST runs driven by this service."""

from __future__ import annotations

from fastapi import APIRouter, Request

from feature_party.deps import SessionDep
from feature_party.exception_handlers import ERROR_RESPONSES
from feature_party.multistage import service
from feature_party.multistage.schemas import MultistageCreate, MultistageRead, MultistageResume
from shared.pagination import PAGED, PagerDep
from shared.protocol import ErrorBody

router = APIRouter(prefix="/v1/multistage", tags=["multistage"], responses=ERROR_RESPONSES)


def _drivers(request: Request) -> service.Drivers:
    drivers: service.Drivers = request.app.state.multistage
    return drivers


@router.post("", status_code=202, response_model=MultistageRead)
def start_run(request: Request, body: MultistageCreate) -> MultistageRead:
    """Start an LP-MST run (rr-with-prior-lp-mst.txt Algorithm 3): register a random
    partition of the feature set's examples at the labels party, then per stage
    release, receive and train (through the job queue: run a worker). Poll
    ``GET /v1/multistage/{id}``. The token is kept in memory only."""
    drivers = _drivers(request)
    with drivers.database.session() as session:  # committed before the driver reads it
        run = service.create(session, body)
    drivers.launch(run.id, body.token.get_secret_value())
    with drivers.database.session() as session:
        return service.get(session, run.id, active=True)


@router.get("", response_model=list[MultistageRead], summary="LP-MST runs", description=PAGED)
def list_runs(request: Request, session: SessionDep, pager: PagerDep) -> list[MultistageRead]:
    return service.list_page(session, pager, _drivers(request))


@router.get("/{run_id}", response_model=MultistageRead)
def get_run(request: Request, session: SessionDep, run_id: str) -> MultistageRead:
    return service.get(session, run_id, active=_drivers(request).is_active(run_id))


@router.delete(
    "/{run_id}",
    response_model=MultistageRead,
    responses={409: {"model": ErrorBody, "description": "run_finished: it succeeded or was "
                     "cancelled already"}},
)  # fmt: skip
def cancel_run(request: Request, run_id: str) -> MultistageRead:
    """Cancel a run for good (it cannot resume): its current stage's job is
    cancelled and its driver stops at its next step. What it spent stays spent."""
    drivers = _drivers(request)
    with drivers.database.session() as session:
        service.cancel(session, run_id)
    drivers.wake(run_id)
    with drivers.database.session() as session:
        return service.get(session, run_id, active=False)


@router.post(
    "/{run_id}/resume",
    status_code=202,
    response_model=MultistageRead,
    responses={409: {"model": ErrorBody, "description": "the run is not interrupted or failed"}},
)
def resume_run(request: Request, run_id: str, body: MultistageResume) -> MultistageRead:
    """Continue an interrupted or failed run from its last finished step. A
    release already made is replayed by its idempotency key, never paid twice; a
    stage whose job failed or was cancelled trains again, with ``training`` if the
    body gives one."""
    drivers = _drivers(request)
    with drivers.database.session() as session:
        service.prepare_resume(session, run_id, body, active=drivers.is_active(run_id))
    drivers.launch(run_id, body.token.get_secret_value())
    with drivers.database.session() as session:
        return service.get(session, run_id, active=True)
