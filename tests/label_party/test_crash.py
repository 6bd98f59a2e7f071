"""A server killed between reservation and commit leaves nothing half-visible (§3.3)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.label_party.helpers import create_dataset, release, upload_labels

pytestmark = pytest.mark.slow


def test_sigkill_before_commit_then_restart(make_server: Any) -> None:
    crashing = make_server(
        subprocess=True, LABELDP_TEST_CRASH_POINT="release_before_commit"
    ).start()
    admin = crashing.client()
    ds = create_dataset(admin, epsilon_budget=1.0)
    ids = [f"e{i}" for i in range(500)]
    assert upload_labels(admin, ds, ids, [float(i % 10) for i in range(500)]).status_code == 200
    audit_before = admin.get(f"/v1/datasets/{ds}/audit").json()["entries"]

    with pytest.raises(httpx.TransportError):
        release(admin, ds, 0.3, mechanism={"name": "rr-on-bins"}, idempotency_key="retry-me")
    assert crashing.wait_exit() == -signal.SIGKILL

    restarted = make_server(subprocess=True).start()  # same database and data dir, no hook
    admin = restarted.client()
    budget = admin.get(f"/v1/datasets/{ds}/budget").json()
    assert budget["epsilon_spent"] == 0 and budget["epsilon_remaining"] == 1.0
    assert admin.get(f"/v1/datasets/{ds}/releases").json() == []
    assert admin.get(f"/v1/datasets/{ds}/audit").json()["entries"] == audit_before
    assert admin.get("/v1/audit/verify").json()["ok"] is True
    data = Path(restarted.env["LABELDP_DATA_DIR"])
    assert list((data / "releases").glob("*")) == []  # the orphan file was set aside,
    assert len(list((data / "orphans" / "releases").glob("*.parquet"))) == 1  # not deleted
    assert list((data / "tmp").glob("*")) == []

    first = release(admin, ds, 0.3, mechanism={"name": "rr-on-bins"}, idempotency_key="retry-me")
    assert first.status_code == 201, first.text
    second = release(admin, ds, 0.3, mechanism={"name": "rr-on-bins"}, idempotency_key="retry-me")
    assert second.status_code == 200 and second.json()["id"] == first.json()["id"]
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0.3
    assert admin.get("/v1/audit/verify").json()["ok"] is True
