from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from label_party.db import Database, transaction
from label_party.observability import scrape
from shared.errors import error_response

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness: the process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: the database answers", responses={503: {}})
def readyz(request: Request) -> Response:
    db: Database = request.app.state.db
    try:
        with transaction(db.reader) as session:
            session.execute(text("SELECT 1"))
    except Exception:
        return error_response(503, "not_ready", "the database is not reachable")
    return Response('{"status": "ready"}', media_type="application/json")


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    return Response(scrape(request.app.state.db), media_type=CONTENT_TYPE_LATEST)
