"""A full disk at the features party after the labels party has charged a release:
nothing paid for may be lost. The features party's SQLite database sits on a small
tmpfs (skipped where mounting is not permitted) that fills after the feature set
is stored; the labels party is a real one (``services``)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from feature_party.client import LabelsPartyClient
from labeldp.processes import ServiceProcess, free_port, running
from tests.e2e.conftest import Services, ok, parquet_bytes
from tests.file_limits import fill, full_disk

N = 300


def _dataset(services: Services) -> tuple[str, str]:
    """A 3-class dataset of N labels and a client granted it: (its id, the token)."""
    labels = pa.table(
        {"example_id": [f"ex-{i}" for i in range(N)], "label": [i % 3 for i in range(N)]}
    )
    with LabelsPartyClient(services.labels_url, services.labels_admin) as admin:
        dataset = admin.create_dataset(
            name="full", task="classification", label_domain={"num_classes": 3}, epsilon_budget=5
        )
        admin.upload_labels(dataset["id"], parquet_bytes(labels))
        client = admin.create_client(name="publisher", role="client")
        admin.create_grant(dataset["id"], client_id=client["id"])
    return dataset["id"], client["token"]


def test_a_full_features_party_loses_no_paid_release(services: Services, tmp_path: Path) -> None:
    """Its data directory plainly full: refused before the labels party is asked
    (nothing spent). Its database full once the release is made: the answer names
    the release, which is then fetched again at no cost."""
    dataset_id, client_token = _dataset(services)
    token = secrets.token_urlsafe(24)
    with (
        full_disk(tmp_path / "data", size=24 << 20) as data,
        full_disk(tmp_path / "db", size=4 << 20) as db,
    ):
        env = {"LABELDP_DATA_DIR": str(data), "LABELDP_ADMIN_TOKEN": token,
               "LABELDP_DATABASE_URL": f"sqlite:///{db / 'fp.sqlite3'}"}  # fmt: skip
        port = free_port()
        features = ServiceProcess("features party", ["feature-party", "serve", "--port",
                                  str(port)], env, tmp_path / "fp.log", port)  # fmt: skip
        headers = {"Authorization": f"Bearer {token}"}
        with running(features), httpx.Client(base_url=features.url, headers=headers,
                                             timeout=60) as http:  # fmt: skip
            table = pa.table({"example_id": [f"ex-{i}" for i in range(N)], "x": range(N)})
            upload = {"file": ("f.parquet", parquet_bytes(table))}
            fs = ok(http.post("/v1/feature-sets", files=upload), 201)
            body: dict[str, Any] = {"feature_set_id": fs["id"], "dataset_id": dataset_id,
                                    "labels_party_url": services.labels_url,
                                    "token": client_token}  # fmt: skip
            new = {**body, "release": {"mechanism": {"name": "rr"}, "epsilon": 1}}
            fill(data)
            refused = http.post("/v1/received-labels", json=new)
            assert refused.status_code == 507, refused.text
            assert "asked nothing of the labels party" in refused.json()["message"]
            assert _spent(services, dataset_id) == 0.0
            (data / "filler").unlink()
            fill(db)
            lost = http.post("/v1/received-labels", json=new)
            assert lost.status_code == 507, lost.text
            release_id = lost.json()["detail"]["release_id"]
            assert f"release {release_id} was made" in lost.json()["message"]
            (db / "filler").unlink()  # the operator frees space
            again = http.post("/v1/received-labels", json={**body, "release_id": release_id})
            assert ok(again, 201)["release_id"] == release_id
    assert _spent(services, dataset_id) == 1.0  # one release, paid once


def _spent(services: Services, dataset_id: str) -> float:
    with LabelsPartyClient(services.labels_url, services.labels_admin) as admin:
        return float(admin.get_budget(dataset_id)["epsilon_spent"])


def test_a_full_labels_party_is_told_apart_from_a_release_that_may_have_been_made(
    services: Services, tmp_path: Path
) -> None:
    """The labels party answers 507 before it spends anything (its data directory
    cannot take the release's file): the features party says so (502
    ``labels_party_storage_unavailable``), not "the release may have been made", and
    does not retry it; once space is freed the same request goes through."""
    dataset_id, client_token = _dataset(services)
    table = pa.table({"example_id": [f"ex-{i}" for i in range(N)], "x": range(N)})
    upload = {"file": ("f.parquet", parquet_bytes(table))}
    fs = ok(services.features.post("/v1/feature-sets", files=upload), 201)
    body = {"feature_set_id": fs["id"], "dataset_id": dataset_id, "token": client_token,
            "labels_party_url": services.labels_url,
            "release": {"mechanism": {"name": "rr"}, "epsilon": 1}}  # fmt: skip
    labels_tmp = tmp_path / "labels-party" / "tmp"  # the services fixture's data directory
    with full_disk(labels_tmp, size=64 << 10):
        fill(labels_tmp)
        full = services.features.post("/v1/received-labels", json=body)
    assert full.status_code == 502, full.text
    assert full.json()["error"] == "labels_party_storage_unavailable"
    assert "nothing was spent" in full.json()["message"]
    assert "may have been made" not in full.json()["message"]
    assert _spent(services, dataset_id) == 0.0
    assert ok(services.features.post("/v1/received-labels", json=body), 201)["num_labels"] == N


def test_a_labels_party_whose_tmp_is_its_own_filesystem_still_releases(
    services: Services, tmp_path: Path
) -> None:
    """An operator may mount tmp/ apart from releases/: publishing a release then
    copies across filesystems (a rename gives EXDEV) instead of failing it."""
    dataset_id, client_token = _dataset(services)
    labels_tmp = tmp_path / "labels-party" / "tmp"  # the services fixture's data directory
    with full_disk(labels_tmp, size=256 << 20):  # roomy: its own filesystem is the point
        with LabelsPartyClient(services.labels_url, client_token) as client:
            release = client.create_release(dataset_id, {"mechanism": {"name": "rr"},
                                                         "epsilon": 1})  # fmt: skip
            target = tmp_path / "got.parquet"
            client.download_labels(release.id, target, expected_sha256=release.sha256)
        assert pq.read_table(target).num_rows == N
        assert list(labels_tmp.iterdir()) == []  # nothing left behind
