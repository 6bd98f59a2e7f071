"""Prometheus metrics (request ids and the access log: ``shared.request_log``).

Metrics: requests by method, route template and status; releases by mechanism;
ε spent per dataset, read from the ledger at scrape time (so it is right after a
restart). Route templates (``/v1/datasets/{dataset_id}``), never raw paths, label
the request counter. No metric carries anything label-derived but the budget.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.lease_queue import Status

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

#: The access log's logger (``shared.request_log.RequestLogMiddleware``).
ACCESS_LOGGER = "label_party.access"
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


class TrainingsCollector(Collector):
    """``labeldp_trainings{status}`` and ``labeldp_trainings_stalled``: trainings
    by status, and the running ones whose worker let its lease lapse (dead or
    hung: the alert an operator wants, since they read ``running`` until another
    worker claims them). Read per scrape, as :class:`EpsilonSpentCollector`."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from label_party.db import transaction
        from label_party.trainings import repository

        try:
            with transaction(self.db.reader) as session:
                counts, stalled = repository.census(session)
        except Exception:  # reported by labeldp_ledger_up, read from the same database
            log.exception("metrics: cannot read the trainings")
            return
        by_status = GaugeMetricFamily(
            "labeldp_trainings", "LabelDP-Pro trainings by status", labels=["status"]
        )
        for status in Status:
            by_status.add_metric([status.value], float(counts.get(status.value, 0)))
        yield by_status
        yield GaugeMetricFamily(
            "labeldp_trainings_stalled",
            "running trainings whose worker let its lease lapse (died or hung)",
            value=float(stalled),
        )


def scrape(db: Any) -> bytes:
    """The Prometheus text exposition: the process's counters and histograms, then
    the ε spent per dataset and the trainings' census from ``db``."""
    database = CollectorRegistry(auto_describe=False)
    database.register(EpsilonSpentCollector(db))
    database.register(TrainingsCollector(db))
    return generate_latest(REGISTRY) + generate_latest(database)


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    """Count and time a request (the access log's observer, ``shared.request_log``)."""
    REQUESTS.labels(method, route, str(status)).inc()
    LATENCY.labels(route).observe(seconds)
