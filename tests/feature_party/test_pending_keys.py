"""A new release asked of the features party without an idempotency key: the key
it makes is kept until the labels are stored, so the same request after a crash
(``python -m feature_party serve`` SIGKILLed while the labels party spends) gets
the release paid for instead of paying again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from feature_party.db import Database
from feature_party.orm import PendingReleaseKey
from tests.feature_party.conftest import ADMIN, AUTH, csv_bytes, synthetic
from tests.feature_party.fake_labels_party import TOKEN, FakeLabelsParty, free_port, serve

pytestmark = pytest.mark.slow


@contextmanager
def service(
    env: dict[str, str], log: Path
) -> Iterator[tuple[subprocess.Popen[bytes], httpx.Client]]:
    port = free_port()
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "feature_party", "serve", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the service did not start"
                time.sleep(0.2)
            yield process, http
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _pending(data_dir: Path) -> list[str]:
    database = Database(f"sqlite:///{data_dir / 'feature-party.db'}")
    try:
        with database.session() as session:
            return list(session.scalars(select(PendingReleaseKey.idempotency_key)))
    finally:
        database.dispose()


def test_a_keyless_release_retried_after_a_crash_is_not_paid_twice(tmp_path: Path) -> None:
    env = {**os.environ, "LABELDP_DATA_DIR": str(tmp_path / "data"),
           "LABELDP_ADMIN_TOKEN": ADMIN, "LABELDP_CLIENT_BACKOFF_SECONDS": "0.05"}  # fmt: skip
    env.pop("LABELDP_DATABASE_URL", None)
    data = synthetic(200, seed=3)
    with serve(FakeLabelsParty()) as fake:
        fake.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
        with service(env, tmp_path / "server.log") as (process, http):
            r = http.post("/v1/feature-sets", headers=AUTH,
                          files={"file": ("features.csv", csv_bytes(data.features))})  # fmt: skip
            assert r.status_code == 201, r.text
            body: dict[str, Any] = {
                "feature_set_id": r.json()["id"], "labels_party_url": fake.url, "token": TOKEN,
                "dataset_id": fake.dataset_id,
                "release": {"mechanism": {"name": "laplace"}, "epsilon": 1.0},
            }  # fmt: skip
            # The service dies while the labels party makes (and charges) the release.
            fake.on_release = lambda: process.send_signal(signal.SIGKILL)
            with pytest.raises(httpx.TransportError):
                http.post("/v1/received-labels", headers=AUTH, json=body)
            process.wait(timeout=20)
        assert fake.spent == 1.0 and len(fake.releases) == 1
        fake.on_release = None
        with service(env, tmp_path / "server.log") as (_, http):
            r = http.post("/v1/received-labels", headers=AUTH, json=body)
            assert r.status_code == 201, r.text
            assert r.json()["release_id"] == "rel-1"  # the one paid for, replayed
            assert fake.spent == 1.0 and len(fake.releases) == 1
            assert _pending(tmp_path / "data") == []  # stored: its key is done
            # The same request once more is a new release, at a new cost.
            r = http.post("/v1/received-labels", headers=AUTH, json=body)
            assert r.status_code == 201 and r.json()["release_id"] == "rel-2", r.text
            assert fake.spent == 2.0
            # A failure whose outcome is unknown keeps the key; the answer names it,
            # and the same request again sends it.
            fake.on_release = lambda: (_ for _ in ()).throw(RuntimeError("lost"))
            r = http.post("/v1/received-labels", headers=AUTH, json=body)
            assert r.status_code == 502, r.text
            [kept] = _pending(tmp_path / "data")
            assert r.json()["detail"]["idempotency_key"] == kept
            fake.on_release = None
            r = http.post("/v1/received-labels", headers=AUTH, json=body)
            assert r.status_code == 201, r.text
            assert fake.releases[r.json()["release_id"]].idempotency_key == kept
            assert _pending(tmp_path / "data") == []
