"""A database outage under running services (Postgres refusing every connection,
as while it restarts or fails over): requests answer 503 ``database_unavailable``
with ``Retry-After``, which clients retry, rather than 500 ``internal_error``,
which they report as a bug; nothing is half-written, and the services answer
again, without a restart, once the database is back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.e2e.conftest import Services, _pg_admin, ok


@contextmanager
def outage(*urls: str) -> Iterator[None]:
    """Postgres refuses new connections to these databases and drops the open ones."""
    names = [make_url(u).database for u in urls]
    with _pg_admin() as conn:
        for name in names:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
    try:
        yield
    finally:
        with _pg_admin() as conn:
            for name in names:
                conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def _unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"] == "database_unavailable"
    assert response.headers["Retry-After"] == "5"
    assert response.headers.get("X-Request-ID")  # answered inside the stack, logged


def _dataset(name: str) -> dict[str, object]:
    domain = {"min": 0, "max": 1, "grid_size": 2}
    return {"name": name, "task": "regression", "label_domain": domain, "epsilon_budget": 1}


@pytest.mark.postgres
@pytest.mark.parametrize("database_urls", ["postgres"], indirect=True)
def test_an_outage_is_503_and_the_services_recover(
    services: Services, database_urls: dict[str, str]
) -> None:
    admin = {"Authorization": f"Bearer {services.labels_admin}"}
    with httpx.Client(base_url=services.labels_url, headers=admin, timeout=60) as labels:
        ok(labels.post("/v1/datasets", json=_dataset("before")), 201)
        with outage(*database_urls.values()):
            _unavailable(labels.get("/v1/datasets"))
            _unavailable(labels.post("/v1/datasets", json=_dataset("during")))
            _unavailable(services.features.get("/v1/jobs/no-such-job"))
            assert labels.get("/readyz").status_code == 503
            assert services.features.get("/readyz").status_code == 503
        deadline = time.monotonic() + 30
        while labels.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        names = [d["name"] for d in ok(labels.get("/v1/datasets"), 200)]
        assert names == ["before"]  # the refused create left nothing
        assert services.features.get("/v1/jobs/no-such-job").status_code == 404
