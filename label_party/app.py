"""The labels-party FastAPI application (``labeldp label-party serve``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from label_party import exception_handlers
from label_party.audit.endpoints import router as audit_router
from label_party.clients.endpoints import router as clients_router
from label_party.config import Settings
from label_party.datasets.endpoints import router as datasets_router
from label_party.db import connect, migrate, transaction
from label_party.deps import known_caller
from label_party.example_priors.endpoints import router as priors_router
from label_party.exceptions import PayloadTooLargeError
from label_party.health import router as health_router
from label_party.labels.endpoints import router as labels_router
from label_party.observability import ACCESS_LOGGER, observe_request
from label_party.partitions.endpoints import router as partitions_router
from label_party.previews.endpoints import router as previews_router
from label_party.releases.endpoints import router as releases_router
from label_party.storage import sweep_orphans
from label_party.trainings.endpoints import router as trainings_router
from shared.errors import UnexpectedErrorMiddleware
from shared.keyed_locks import KeyedLocks
from shared.limits import BodyLimitMiddleware
from shared.overload import RequestLimitMiddleware, enough_threads
from shared.request_log import RequestLogMiddleware

logger = logging.getLogger("label_party")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        enough_threads(settings.max_concurrent_requests)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        db = connect(settings.resolved_database_url, connections=settings.database_connections)
        migrate(db.engine)
        with transaction(db.writer) as session:
            sweep_orphans(settings, session)
        app.state.db = db
        app.state.dataset_queues = KeyedLocks()
        logger.info("service ready", extra={"fields": {"mode": settings.mode}})
        try:
            yield
        finally:
            db.dispose()

    app = FastAPI(
        title="labeldp labels party",
        version="0.1.0",
        summary="Label-DP releases of a labels party's data, against an ε budget per dataset.",
        lifespan=lifespan,
        redoc_url=None,  # one open API reference, /docs (docs/README.md)
    )
    app.state.settings = settings
    app.state.preview_slots = threading.BoundedSemaphore(settings.max_concurrent_previews)
    exception_handlers.install(app)
    app.add_middleware(
        BodyLimitMiddleware,
        max_upload_bytes=settings.max_upload_bytes,
        max_json_bytes=settings.max_json_bytes,
        too_large=PayloadTooLargeError,
        authorized=known_caller(app),
    )
    app.add_middleware(UnexpectedErrorMiddleware, logger=exception_handlers.ERROR_LOGGER)
    app.add_middleware(RequestLimitMiddleware, max_requests=settings.max_concurrent_requests)
    app.add_middleware(RequestLogMiddleware, logger=ACCESS_LOGGER, observe=observe_request)
    for router in (
        datasets_router,
        labels_router,
        partitions_router,
        priors_router,
        releases_router,
        trainings_router,
        clients_router,
        audit_router,
        previews_router,
        health_router,
    ):
        app.include_router(router)
    return app
