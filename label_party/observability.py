"""Request ids, the access log and Prometheus metrics.

Metrics: requests by method, route template and status; releases by mechanism;
ε spent per dataset, read from the ledger at scrape time (so it is right after a
restart). Route templates (``/v1/datasets/{dataset_id}``), never raw paths, label
the request counter. No metric carries anything label-derived but the budget.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.logging import request_id_var

REGISTRY = CollectorRegistry(auto_describe=True)
REQUESTS = Counter(
    "labeldp_requests_total",
    "HTTP requests by method, route and status",
    ["method", "route", "status"],
    registry=REGISTRY,
)
LATENCY = Histogram("labeldp_request_seconds", "HTTP request latency", ["route"], registry=REGISTRY)
RELEASES = Counter(
    "labeldp_releases_total", "Releases persisted, by mechanism", ["mechanism"], registry=REGISTRY
)

access_log = logging.getLogger("label_party.access")
log = logging.getLogger("label_party.metrics")


class EpsilonSpentCollector(Collector):
    """``labeldp_epsilon_spent{dataset_id}``: the ledger's spend, read at scrape time
    from one app's database. Made per scrape (:func:`scrape`), not registered
    globally: a process-wide collector would hold the database of whichever app
    started last, and read (and leak pool connections of) a disposed one after
    that app stopped."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from label_party.datasets import repository as datasets_repository
        from label_party.db import transaction
        from label_party.ledger.service import spend_of
        from label_party.ledger.units import epsilon_decimal

        gauge = GaugeMetricFamily(
            "labeldp_epsilon_spent", "ε spent per dataset (worst part)", labels=["dataset_id"]
        )
        up = GaugeMetricFamily("labeldp_ledger_up", "1 if the ledger could be read for this scrape")
        try:
            with transaction(self.db.reader) as session:
                for dataset_id in datasets_repository.all_ids(session):
                    eps, _delta = spend_of(session, dataset_id).worst(None)
                    gauge.add_metric([dataset_id], float(epsilon_decimal(eps)))
        except Exception:  # the database is down: the process's counters still count
            log.exception("metrics: cannot read the ledger")
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield gauge


def scrape(db: Any) -> bytes:
    """The Prometheus text exposition: the process's counters and histograms, then
    the ε spent per dataset from ``db``."""
    ledger = CollectorRegistry(auto_describe=False)
    ledger.register(EpsilonSpentCollector(db))
    return generate_latest(REGISTRY) + generate_latest(ledger)


class RequestContextMiddleware:
    """Give each request an id (``X-Request-ID`` in, or new), log and count it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming if 0 < len(incoming) <= 100 and incoming.isprintable() else ""
        request_id = request_id or uuid.uuid4().hex
        token = request_id_var.set(request_id)
        status = 500
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - start
            route = getattr(scope.get("route"), "path", "unmatched")
            REQUESTS.labels(scope["method"], route, str(status)).inc()
            LATENCY.labels(route).observe(elapsed)
            access_log.info(
                "request",
                extra={
                    "fields": {
                        "method": scope["method"],
                        "route": route,
                        "status": status,
                        "seconds": round(elapsed, 4),
                    }
                },
            )
            request_id_var.reset(token)
