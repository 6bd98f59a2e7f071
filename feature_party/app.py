"""The features-party HTTP service (``labeldp feature-party serve``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Response
from sqlalchemy import text

from feature_party import exception_handlers
from feature_party.config import Settings, get_settings
from feature_party.db import Database, migrate
from feature_party.deps import admin_only, require_admin
from feature_party.errors import PayloadTooLargeError
from feature_party.feature_sets.endpoints import router as feature_sets_router
from feature_party.housekeeping import sweep_unnamed
from feature_party.jobs import service as jobs_service
from feature_party.jobs.endpoints import router as jobs_router
from feature_party.models.endpoints import router as models_router
from feature_party.multistage.endpoints import router as multistage_router
from feature_party.multistage.service import Drivers
from feature_party.received_labels.endpoints import router as received_labels_router
from feature_party.uploads import sweep_stale
from shared import readiness
from shared.errors import UnexpectedErrorMiddleware
from shared.limits import BodyLimitMiddleware
from shared.overload import RequestLimitMiddleware, enough_threads
from shared.request_log import RequestLogMiddleware


def create_app(settings: Settings | None = None, *, run_migrations: bool = True) -> FastAPI:
    """The ASGI app. Migrations run at startup (``run_migrations=False`` when the
    caller already ran them)."""
    settings = settings or get_settings()
    admin_token = settings.require_admin_token()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        enough_threads(settings.max_concurrent_requests)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        sweep_stale(settings.data_dir / "tmp")
        database = Database(settings.resolved_database_url)
        if run_migrations:
            migrate(database.engine)
        with database.session() as session:
            jobs_service.sweep_finished(session, settings.data_dir)
            sweep_unnamed(session, settings.data_dir)
        app.state.database = database
        app.state.multistage = Drivers(database, settings)
        try:
            yield
        finally:
            app.state.multistage.stop_all()
            database.dispose()

    app = FastAPI(
        title="labeldp features party",
        version="0.1.0",
        description="Feature sets, received label-DP releases, training jobs and models.",
        lifespan=lifespan,
        redoc_url=None,  # one open API reference, /docs (docs/README.md)
    )
    app.state.settings = settings
    app.state.admin_token = admin_token
    exception_handlers.install(app)
    app.add_middleware(
        BodyLimitMiddleware,
        max_upload_bytes=settings.max_upload_bytes,
        max_json_bytes=settings.max_json_bytes,
        too_large=PayloadTooLargeError,
        authorized=admin_only(admin_token),
    )
    app.add_middleware(UnexpectedErrorMiddleware, logger=exception_handlers.ERROR_LOGGER)
    app.add_middleware(RequestLimitMiddleware, max_requests=settings.max_concurrent_requests)
    app.add_middleware(RequestLogMiddleware, logger="feature_party.access")  # outermost
    secured = [Depends(require_admin)]
    routers = (
        feature_sets_router,
        received_labels_router,
        jobs_router,
        models_router,
        multistage_router,
    )
    for router in routers:
        app.include_router(router, dependencies=secured)

    @app.get("/healthz", tags=["ops"], summary="Liveness: the process answers")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["ops"],
        summary="Readiness: the database answers and the data directory takes a write",
        responses={503: {}},
    )
    def readyz() -> Response:
        def check_database() -> None:
            with app.state.database.session() as session:
                session.execute(text(readiness.CHECK_QUERY))

        where = (settings.data_dir, settings.data_dir / "tmp")
        return readiness.response(readiness.problem(check_database, where))

    return app
