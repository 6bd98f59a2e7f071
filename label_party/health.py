from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from label_party.auth import require
from label_party.config import Settings
from label_party.db import Database, transaction
from label_party.deps import PrincipalDep
from label_party.exception_handlers import responses
from label_party.observability import scrape
from shared import readiness

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness: the process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: the database answers and the data directories take a write",
    responses={503: {}},
)
def readyz(request: Request) -> Response:
    db: Database = request.app.state.db
    settings: Settings = request.app.state.settings

    def check_database() -> None:
        with transaction(db.reader) as session:
            session.execute(text(readiness.CHECK_QUERY))

    where = (settings.data_dir, settings.tmp_dir, settings.labels_dir, settings.releases_dir,
             settings.trainings_dir)  # fmt: skip
    return readiness.response(readiness.problem(check_database, where))


@router.get(
    "/metrics",
    summary="Prometheus metrics (admin, auditor)",
    response_class=Response,
    responses=responses(401, 403),
)
def metrics(request: Request, principal: PrincipalDep) -> Response:
    # It names every dataset and its spend; a client may not even learn that a
    # dataset it was not granted exists. Prometheus sends a bearer token.
    require(principal, "admin", "auditor")
    return Response(scrape(request.app.state.db), media_type=CONTENT_TYPE_LATEST)
