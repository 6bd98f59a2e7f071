"""A new release asked of the features party without an idempotency key: the key
it makes is kept until the labels are stored, so the same request after a crash
(``labeldp feature-party serve`` SIGKILLed while the labels party spends) gets
the release paid for instead of paying again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from feature_party.db import Database
from feature_party.orm import PendingReleaseKey
from labeldp.processes import ServiceProcess, free_port, running
from tests.feature_party.conftest import ADMIN, AUTH, csv_bytes, synthetic
from tests.feature_party.fake_labels_party import TOKEN, FakeLabelsParty, serve

pytestmark = pytest.mark.slow


def _service(data_dir: Path, log: Path) -> ServiceProcess:
    port = free_port()
    env = {"LABELDP_DATA_DIR": str(data_dir), "LABELDP_ADMIN_TOKEN": ADMIN,
           "LABELDP_CLIENT_BACKOFF_SECONDS": "0.05"}  # fmt: skip
    return ServiceProcess("features party", ["feature-party", "serve", "--port", str(port)],
                          env, log, port)  # fmt: skip


def _pending(data_dir: Path) -> list[str]:
    database = Database(f"sqlite:///{data_dir / 'feature-party.db'}")
    try:
        with database.session() as session:
            return list(session.scalars(select(PendingReleaseKey.idempotency_key)))
    finally:
        database.dispose()


def test_a_keyless_release_retried_after_a_crash_is_not_paid_twice(tmp_path: Path) -> None:
    data_dir, data = tmp_path / "data", synthetic(200, seed=3)
    with serve(FakeLabelsParty()) as fake:
        fake.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
        first = _service(data_dir, tmp_path / "server.log")
        with running(first), httpx.Client(base_url=first.url, timeout=60) as http:
            r = http.post("/v1/feature-sets", headers=AUTH,
                          files={"file": ("features.csv", csv_bytes(data.features))})  # fmt: skip
            assert r.status_code == 201, r.text
            body: dict[str, Any] = {
                "feature_set_id": r.json()["id"], "labels_party_url": fake.url, "token": TOKEN,
                "dataset_id": fake.dataset_id,
                "release": {"mechanism": {"name": "laplace"}, "epsilon": 1.0},
            }  # fmt: skip
            # The service dies while the labels party makes (and charges) the release.
            fake.on_release = first.kill
            with pytest.raises(httpx.TransportError):
                http.post("/v1/received-labels", headers=AUTH, json=body)
        assert fake.spent == 1.0 and len(fake.releases) == 1
        fake.on_release = None
        again = _service(data_dir, tmp_path / "server.log")
        with running(again), httpx.Client(base_url=again.url, timeout=60) as http:
            r = http.post("/v1/received-labels", headers=AUTH, json=body)
            assert r.status_code == 201, r.text
            assert r.json()["release_id"] == "rel-1"  # the one paid for, replayed
            assert fake.spent == 1.0 and len(fake.releases) == 1
            assert _pending(data_dir) == []  # stored: its key is done
            # The same request once more is a new release, at a new cost.
            r = http.post("/v1/received-labels", headers=AUTH, json=body)
            assert r.status_code == 201 and r.json()["release_id"] == "rel-2", r.text
            assert fake.spent == 2.0
            # A failure whose outcome is unknown keeps the key; the answer names it,
            # and the same request again sends it.
            fake.on_release = lambda: (_ for _ in ()).throw(RuntimeError("lost"))
            r = http.post("/v1/received-labels", headers=AUTH, json=body)
            assert r.status_code == 502, r.text
            [kept] = _pending(data_dir)
            assert r.json()["detail"]["idempotency_key"] == kept
            fake.on_release = None
            r = http.post("/v1/received-labels", headers=AUTH, json=body)
            assert r.status_code == 201, r.text
            assert fake.releases[r.json()["release_id"]].idempotency_key == kept
            assert _pending(data_dir) == []
            # A final answer ends the key: a failure charged at the labels party (the
            # answer names the key to replay it), or a refusal. The same request
            # again is a new one, not that answer forever.
            fake.mechanism_fails = True
            r = http.post("/v1/received-labels", headers=AUTH, json=body)
            assert r.json()["error"] == "release_failed" and _pending(data_dir) == []
            fake.mechanism_fails = False
            r = http.post("/v1/received-labels", headers=AUTH, json=body)
            assert r.status_code == 201, r.text
            fake.budget = fake.spent
            r = http.post("/v1/received-labels", headers=AUTH, json=body)
            assert r.json()["error"] == "budget_exceeded" and _pending(data_dir) == []


def test_a_settled_request_forgets_only_its_own_key(tmp_path: Path) -> None:
    """Three identical keyless requests: A and B share K1; A stores its labels and
    drops K1; C makes K2 and its answer is lost; B, settling late, dropped the
    fingerprint's row, which was C's K2 by then, so C's retry made K3 and paid
    again (helper-68: 3 releases for 2)."""
    from feature_party.db import migrate
    from feature_party.received_labels import service as received
    from feature_party.received_labels.schemas import ReceivedLabelsCreate

    database = Database(f"sqlite:///{tmp_path / 'feature-party.db'}")
    migrate(database.engine)
    request = ReceivedLabelsCreate.model_validate({
        "feature_set_id": "fs", "labels_party_url": "http://127.0.0.1:9", "token": TOKEN,
        "dataset_id": "ds", "release": {"mechanism": {"name": "laplace"}, "epsilon": 1.0},
    })  # fmt: skip
    try:
        with database.session() as session:
            a, fingerprint = received._with_key(session, request)
            b, _ = received._with_key(session, request)
            assert a.release is not None and b == a  # one key for both: K1
            received._forget(session, fingerprint, a)  # A stored its labels
            session.commit()
            c, _ = received._with_key(session, request)  # K2
            assert c.release is not None and c.release.idempotency_key != a.release.idempotency_key
            received._forget(session, fingerprint, b)  # B settles after C made K2
            session.commit()
    finally:
        database.dispose()
    assert _pending(tmp_path) == [c.release.idempotency_key]
