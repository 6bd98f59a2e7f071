"""Concurrent releases never overspend (DESIGN.md §3.4), on SQLite and Postgres."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.label_party.conftest import ADMIN_TOKEN, Server
from tests.label_party.helpers import create_dataset, upload_labels

pytestmark = pytest.mark.slow


def test_64_concurrent_releases_exactly_8_succeed(server: Server) -> None:
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=0.8)
    ids = [f"e{i}" for i in range(200)]
    assert upload_labels(admin, ds, ids, [float(i % 10) for i in range(200)]).status_code == 200

    body = {"mechanism": {"name": "laplace"}, "epsilon": 0.1}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    with (
        httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=300,
            limits=limits,
        ) as client,
        ThreadPoolExecutor(max_workers=64) as pool,
    ):
        statuses = list(
            pool.map(
                lambda _: client.post(f"/v1/datasets/{ds}/releases", json=body).status_code,
                range(64),
            )
        )

    assert statuses.count(201) == 8, statuses
    assert statuses.count(409) == 56, statuses
    budget = admin.get(f"/v1/datasets/{ds}/budget").json()
    assert budget["epsilon_spent"] == budget["epsilon_budget"] == 0.8
    assert budget["epsilon_remaining"] == 0
    assert len(admin.get(f"/v1/datasets/{ds}/releases").json()) == 8
    assert admin.get("/v1/audit/verify").json()["ok"] is True
