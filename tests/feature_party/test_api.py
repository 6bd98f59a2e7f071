"""The HTTP API on SQLite (in-process app, a real fake labels party on loopback,
the worker run in-process)."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from feature_party.config import Settings
from feature_party.db import Database, migrate
from feature_party.jobs.worker import Worker
from feature_party.orm import FeatureSet
from feature_party.received_labels import service as received_labels_service
from feature_party.received_labels.schemas import ReceivedLabelsCreate
from shared import watching
from shared.pagination import every_row
from tests.feature_party.conftest import (
    ADMIN,
    AUTH,
    csv_bytes,
    make_settings,
    running_service,
    seed_inputs,
    synthetic,
)
from tests.feature_party.fake_labels_party import TOKEN, FakeLabelsParty, free_port


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def upload(
    client: httpx.Client, table: pa.Table, *, schema: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    data = {"schema": json.dumps(schema)} if schema else {}
    r = client.post(
        "/v1/feature-sets",
        headers=AUTH,
        files={"file": ("features.csv", csv_bytes(table), "text/csv")},
        data=data,
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


def receive(
    client: httpx.Client, fake: FakeLabelsParty, feature_set_id: str, **extra: object
) -> httpx.Response:
    body = {
        "feature_set_id": feature_set_id,
        "labels_party_url": fake.url,
        "token": TOKEN,
        "dataset_id": fake.dataset_id,
        "release": {"mechanism": {"name": "laplace"}, "epsilon": 1.0},
        **extra,
    }
    return client.post("/v1/received-labels", headers=AUTH, json=body)


def test_auth_is_required(client: httpx.Client) -> None:
    r = client.get("/v1/jobs/x")
    assert r.status_code == 401
    assert r.json()["error"] == "unauthorized"
    r = client.get("/v1/jobs/x", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").json() == {"status": "ready"}  # no token: for probes


def test_unknown_ids_are_404(client: httpx.Client) -> None:
    for path in (
        "/v1/feature-sets/nope",
        "/v1/received-labels/nope",
        "/v1/jobs/nope",
        "/v1/models/nope",
        "/v1/models/nope/artifact",
    ):
        r = client.get(path, headers=AUTH)
        assert r.status_code == 404, path
        assert r.json()["error"] == "not_found"
    assert client.delete("/v1/jobs/nope", headers=AUTH).status_code == 404
    r = client.post("/v1/models/nope/predict", headers=AUTH, json={"rows": [{"x0": 1}]})
    assert r.status_code == 404
    r = client.post("/v1/jobs", headers=AUTH, json={"feature_set_id": "a", "labels_id": "b"})
    assert r.status_code == 404
    # A NUL is no id: Postgres text cannot hold one (422 there, 404 on SQLite), never 500.
    for path in ("/v1/jobs/a%00b", "/v1/feature-sets/a%00b", "/v1/multistage/a%00b"):
        assert client.get(path, headers=AUTH).status_code in {404, 422}, path
    r = client.post("/v1/jobs", headers=AUTH, json={"feature_set_id": "\u0000", "labels_id": "b"})
    assert r.status_code in {404, 422}


def test_feature_set_roles_inferred_and_declared(client: httpx.Client) -> None:
    data = synthetic(50)
    inferred = upload(client, data.features)
    roles = {c["name"]: c["role"] for c in inferred["columns"]}
    assert roles == {
        "x0": "numeric",
        "x1": "numeric",
        "x2": "numeric",
        "x3": "numeric",
        "city": "categorical",
        "device": "categorical",
    }
    assert inferred["num_rows"] == 50
    declared = upload(client, data.features, schema={"numeric": ["x0"], "categorical": ["city"]})
    roles = {c["name"]: c["role"] for c in declared["columns"]}
    assert roles["x0"] == "numeric" and roles["city"] == "categorical"
    assert roles["x1"] == "ignored" and roles["device"] == "ignored"
    # Parquet works too, and a numeric column may be declared categorical.
    buf = io.BytesIO()
    pq.write_table(data.features, buf)
    r = client.post(
        "/v1/feature-sets",
        headers=AUTH,
        files={"file": ("f.parquet", buf.getvalue())},
        data={"schema": json.dumps({"categorical": ["x0"]})},
    )
    assert r.status_code == 201, r.text


def test_times_are_answered_in_utc(client: httpx.Client) -> None:
    """The store keeps naive UTC; answers said ``…T20:00:00`` with no zone, so a
    client west of Greenwich read every time hours off (the labels party says UTC)."""
    before = datetime.now(UTC) - timedelta(seconds=1)
    made = upload(client, synthetic(5).features)
    got = client.get(f"/v1/feature-sets/{made['id']}", headers=AUTH).json()
    listed = client.get("/v1/feature-sets", headers=AUTH).json()
    for stamp in (made["created_at"], got["created_at"], listed[-1]["created_at"]):
        at = datetime.fromisoformat(stamp)
        assert at.utcoffset() == timedelta(0), stamp
        assert before <= at <= datetime.now(UTC), stamp


@pytest.mark.parametrize(
    ("text", "schema", "expected"),
    [
        (
            "example_id,a\n1,2\n2,x\n3,4\n4,y\n",
            {"numeric": ["a"]},
            {"column": "a", "rows": [2, 4], "reason": "not a number"},
        ),
        (
            "example_id,a\n1,2\n,3\n3,4\n",
            None,
            {"column": "example_id", "rows": [2], "reason": "missing example_id"},
        ),
        (
            "example_id,a\n1,2\n2,3\n1,4\n",
            None,
            {"column": "example_id", "rows": [1, 3], "reason": "duplicate example_id"},
        ),
        (
            "example_id,a\n1,2\n",
            {"numeric": ["b"]},
            {"columns": ["b"], "reason": "declared but not in the file"},
        ),
        (  # accepted, it failed every job on the set once queued
            "example_id,__labeldp_target\n1,2\n",
            None,
            {"column": "__labeldp_target", "reason": "reserved for the received label"},
        ),
        (  # declared: refused as well (left out of a declared schema, it is not stored)
            "example_id,__labeldp_target,a\n1,2,3\n",
            {"numeric": ["a", "__labeldp_target"]},
            {"column": "__labeldp_target", "reason": "reserved for the received label"},
        ),
    ],
)
def test_bad_feature_files_are_422_with_reasons(
    client: httpx.Client, text: str, schema: dict[str, list[str]] | None, expected: dict[str, Any]
) -> None:
    data = {"schema": json.dumps(schema)} if schema else {}
    r = client.post("/v1/feature-sets", headers=AUTH, files={"file": ("f.csv", text)}, data=data)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "bad_file"
    assert expected in body["detail"]


def test_a_header_that_is_not_utf8_is_a_bad_file_not_a_500(client: httpx.Client) -> None:
    """Latin-1 and UTF-16 headers raised UnicodeDecodeError as pyarrow decoded the
    names: 500 at upload and at predict (helper-71)."""
    for body in (b"example_id,\xe9ge\nu1,1\nu2,2\n", "example_id,age\nu1,1\n".encode("utf-16")):
        r = client.post("/v1/feature-sets", headers=AUTH, files={"file": ("f.csv", body)})
        assert r.status_code == 422 and r.json()["error"] == "bad_file", r.text
        assert body.startswith(b"\xff") or "UTF-8" in r.json()["message"]


def test_a_csv_column_that_is_not_utf8_is_named_not_dropped(client: httpx.Client) -> None:
    """Read as binary, it was stored as an ignored column: the feature silently
    lost (helper-71)."""
    body = b"example_id,age,city\nu01,1,M\xe1laga\nu02,2,Madrid\n"
    r = client.post("/v1/feature-sets", headers=AUTH, files={"file": ("f.csv", body)})
    assert r.status_code == 422 and r.json()["error"] == "bad_file", r.text
    assert r.json()["detail"] == [{"column": "city", "reason": "not UTF-8 text"}]


def test_a_null_example_id_is_reported_missing_on_its_row(client: httpx.Client) -> None:
    """``or_`` of a null id and its test for "" is null, so the null row went unmarked
    and the file was refused as "duplicate example_id" with no rows."""
    table = pa.table({"example_id": [None, "b"], "a": [1.0, 2.0]})
    r = client.post("/v1/feature-sets", headers=AUTH,
                    files={"file": ("f.parquet", parquet_bytes(table))})  # fmt: skip
    assert r.status_code == 422, r.text
    assert {"column": "example_id", "rows": [1], "reason": "missing example_id"} in r.json()[
        "detail"
    ]


def test_columns_of_types_no_feature_has_are_422(client: httpx.Client) -> None:
    """Lists, structs and binary ids or categories raised in pyarrow's casts (500);
    a uint64 feature past 2⁶³ is a number like any other."""
    table = synthetic(20, seed=2).features
    listed = table.set_column(0, "example_id", pa.array([[i] for i in range(20)]))
    r = client.post("/v1/feature-sets", headers=AUTH,
                    files={"file": ("f.parquet", parquet_bytes(listed))})  # fmt: skip
    assert r.status_code == 422 and "text or integers" in r.json()["message"], r.text
    structs = table.append_column("s", pa.array([{"a": i} for i in range(20)]))
    schema = json.dumps({"numeric": ["x0"], "categorical": ["s"]})
    r = client.post("/v1/feature-sets", headers=AUTH, data={"schema": schema},
                    files={"file": ("f.parquet", parquet_bytes(structs))})  # fmt: skip
    assert r.status_code == 422 and "cannot be a category" in r.text, r.text
    huge = table.append_column("u", pa.array([2**64 - 1] * 20, pa.uint64()))
    r = client.post("/v1/feature-sets", headers=AUTH,
                    files={"file": ("f.parquet", parquet_bytes(huge))})  # fmt: skip
    assert r.status_code == 201, r.text
    jsonl = b'{"example_id": "u1", "x0": 3}\n'
    r = client.post("/v1/feature-sets", headers=AUTH, files={"file": ("f.jsonl", jsonl)})
    assert r.status_code == 422 and "CSV or Parquet" in r.json()["message"], r.text
    deep = "[" * 100_000 + "]" * 100_000
    r = client.post("/v1/feature-sets", headers=AUTH, data={"schema": deep},
                    files={"file": ("f.parquet", parquet_bytes(table))})  # fmt: skip
    assert r.status_code == 422 and r.json()["detail"][0]["msg"] == "nested too deeply", r.text
    for path, body in (
        ("/v1/received-labels", {"feature_set_id": "f", "labels_party_url": "http://[::1",
                                 "token": "t" * 40, "dataset_id": "d", "release_id": "r"}),
        ("/v1/models/import", {"labels_party_url": "http://[::1", "token": "t" * 40,
                               "training_id": "t"}),
    ):  # fmt: skip
        r = client.post(path, headers=AUTH, json=body)
        assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text


def test_a_bad_schema_says_where(client: httpx.Client) -> None:
    files = {"file": ("f.csv", "example_id,a\n1,2\n")}
    r = client.post("/v1/feature-sets", headers=AUTH, files=files,
                    data={"schema": '{"numeric": "a", "categorial": []}'})  # fmt: skip
    assert r.status_code == 422
    assert [d["loc"] for d in r.json()["detail"]] == [
        ["schema", "numeric"],
        ["schema", "categorial"],
    ]
    r = client.post("/v1/feature-sets", headers=AUTH, files=files, data={"schema": "{"})
    assert r.json()["detail"][0]["msg"].startswith("not JSON")


def test_unreadable_and_oversized_files(tmp_path: Path, client: httpx.Client) -> None:
    r = client.post("/v1/feature-sets", headers=AUTH, files={"file": ("f.csv", "a,b\n1,2\n")})
    assert r.status_code == 422 and "example_id" in r.json()["message"]
    r = client.post(
        "/v1/feature-sets", headers=AUTH, files={"file": ("f.parquet", b"PAR1 not really")}
    )
    assert r.status_code == 422
    with running_service(make_settings(tmp_path / "small", max_upload_bytes=10)) as small:
        r = small.post(
            "/v1/feature-sets", headers=AUTH, files={"file": ("f.csv", "example_id,a\n1,2\n2,3\n")}
        )
    assert r.status_code == 413
    assert r.json()["error"] == "payload_too_large"


def test_bodies_are_bounded_and_anonymous_bodies_are_refused_first(tmp_path: Path) -> None:
    """Without a token a body is 401 before it is read (an upload was spooled to disk
    whole first); JSON has its own bound, uploads theirs; a failed upload leaves no
    temporary file."""
    settings = make_settings(tmp_path / "s", max_upload_bytes=4096, max_json_bytes=1000)
    csv = "example_id,a\n" + "".join(f"{i},{i}\n" for i in range(200))  # ~1.5 kB
    job = {"feature_set_id": "x" * 2000, "labels_id": "y"}
    with running_service(settings) as fp:
        r = fp.post("/v1/feature-sets", files={"file": ("f.csv", csv)})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = fp.post("/v1/feature-sets", headers={"Authorization": "Bearer wrong"},
                    files={"file": ("f.csv", csv)})  # fmt: skip
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        r = fp.post("/v1/jobs", headers=AUTH, json=job)
        assert r.status_code == 413 and r.json()["detail"] == {"limit": 1000}
        # Calling itself multipart does not lift a JSON route to the upload bound.
        r = fp.post("/v1/jobs", headers=AUTH, files={"file": ("f.csv", "x" * 2000)})
        assert r.status_code == 413 and r.json()["detail"] == {"limit": 1000}, r.text
        r = fp.post("/v1/jobs", headers={**AUTH, "content-type": "application/json"},
                    content=iter([json.dumps(job).encode()]))  # fmt: skip
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
        r = fp.post("/v1/feature-sets", headers=AUTH, files={"file": ("f.csv", csv)})
        assert r.status_code == 201, r.text
        r = fp.post("/v1/feature-sets", headers=AUTH, files={"file": ("f.csv", csv * 3)})
        assert r.status_code == 413
        # Media types are case-insensitive: an upload stays an upload.
        upload = httpx.Request("POST", fp.base_url, files={"file": ("f.csv", csv)})
        mixed_case = upload.headers["content-type"].replace("multipart/form-data",
                                                            "Multipart/Form-Data")  # fmt: skip
        r = fp.post("/v1/feature-sets", headers={**AUTH, "content-type": mixed_case},
                    content=upload.read())  # fmt: skip
        assert r.status_code == 201, r.text
        # No Content-Length: counted as it streams, and still 413 (not FastAPI's 400).
        big = httpx.Request("POST", fp.base_url, files={"file": ("f.csv", csv * 3)})
        body = big.read()
        pieces = [body[i : i + 1000] for i in range(0, len(body), 1000)]
        headers = {**AUTH, "content-type": big.headers["content-type"]}
        r = fp.post("/v1/feature-sets", headers=headers, content=iter(pieces))
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large", r.text
    assert list((settings.data_dir / "tmp").glob("*.upload")) == []


def test_receive_train_predict(
    client: httpx.Client, settings: Settings, labels_party: FakeLabelsParty
) -> None:
    data = synthetic(3000, seed=1)
    ids = data.features.column("example_id").to_pylist()
    # 2800 of the 3000 labels join; 200 have no feature row.
    labels_party.set_labels(ids[:2800] + [f"other{i}" for i in range(200)], list(data.noisy[:3000]))
    fs = upload(client, data.features)
    r = receive(client, labels_party, fs["id"])
    assert r.status_code == 201, r.text
    received = r.json()
    assert (received["num_labels"], received["matched"], received["unmatched"]) == (3000, 2800, 200)
    assert received["release_id"] == "rel-1"
    stored = settings.data_dir / "received" / f"{received['sha256']}.parquet"
    assert stored.exists()
    # Fetching the same release again by id is free: no new spend at the labels party,
    # and no second row for it in this feature set.
    again = receive(client, labels_party, fs["id"], release=None, release_id="rel-1")
    assert again.status_code == 200, again.text
    assert again.json() == received
    assert labels_party.spent == 1.0

    r = client.post(
        "/v1/jobs",
        headers=AUTH,
        json={
            "feature_set_id": fs["id"],
            "labels_id": received["id"],
            "task": "regression",
            "loss": "squared",
            "epochs": 3,
            "batch_size": 256,
            "hidden": [32, 16],
            "seed": 3,
        },
    )
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] == "queued"

    database = Database(settings.resolved_database_url)
    try:
        assert Worker(database, settings).run(once=True) == 1
    finally:
        database.dispose()
    job = client.get(f"/v1/jobs/{job['id']}", headers=AUTH).json()
    assert job["status"] == "succeeded", job
    progress = job["progress"]
    assert progress["epoch"] == progress["epochs"] == 3, job
    assert progress["step"] == progress["steps_per_epoch"]
    assert job["metrics"]["epochs_run"] == 3
    model_id = job["model_id"]

    rows = data.features.slice(0, 5).to_pylist()
    by_json = client.post(f"/v1/models/{model_id}/predict", headers=AUTH, json={"rows": rows})
    assert by_json.status_code == 200, by_json.text
    by_file = client.post(
        f"/v1/models/{model_id}/predict",
        headers=AUTH,
        files={"file": ("rows.csv", csv_bytes(data.features.slice(0, 5)))},
    )
    assert by_file.status_code == 200, by_file.text
    assert by_json.json()["example_id"] == ids[:5] == by_file.json()["example_id"]
    np.testing.assert_allclose(
        by_json.json()["prediction"], by_file.json()["prediction"], rtol=1e-5
    )
    r = client.post(f"/v1/models/{model_id}/predict", headers=AUTH, json={"rows": [{"x0": 1.0}]})
    assert r.status_code == 422
    assert "missing_columns" in r.json()["detail"]
    bad = [dict(rows[0]), {**rows[1], "x0": "s3cr3t"}]
    r = client.post(f"/v1/models/{model_id}/predict", headers=AUTH, json={"rows": bad})
    assert r.status_code == 422 and "s3cr3t" not in r.text
    assert r.json()["message"].endswith("column 'x0' holds a value that is not a number (row 2)")
    partial = [dict(rows[0]), {k: v for k, v in rows[1].items() if k != "example_id"}]
    r = client.post(f"/v1/models/{model_id}/predict", headers=AUTH, json={"rows": partial})
    assert r.status_code == 422 and r.json()["detail"] == {"rows_without_example_id": 1}
    empty = [dict(rows[0]), {**rows[1], "example_id": ""}]  # was answered with id ""
    r = client.post(f"/v1/models/{model_id}/predict", headers=AUTH, json={"rows": empty})
    assert r.status_code == 422 and r.json()["detail"] == {"rows_without_example_id": 1}
    latin1 = b"example_id,x0,\xe9ge\nu1,1,1\n"  # pyarrow could not decode its names: a 500
    r = client.post(f"/v1/models/{model_id}/predict", headers=AUTH,
                    files={"file": ("rows.csv", latin1)})  # fmt: skip
    assert r.status_code == 422 and "UTF-8" in r.json()["message"], r.text
    # Values no column can hold are 422s naming the column, not 500s.
    for odd in ({"example_id": {"a": 1}}, {"city": {"a": 1}}):
        r = client.post(f"/v1/models/{model_id}/predict", headers=AUTH,
                        json={"rows": [{**rows[0], **odd}]})  # fmt: skip
        assert r.status_code == 422, r.text
    # Past float64 (as JSON allows) is not finite: imputed, as NaN and ±inf are.
    r = client.post(f"/v1/models/{model_id}/predict", headers=AUTH,
                    json={"rows": [{**rows[0], "x0": 10**400}]})  # fmt: skip
    assert r.status_code == 200, r.text
    listed = data.features.slice(0, 2)
    listed = listed.set_column(0, "example_id", pa.array([["a"], ["b"]]))
    r = client.post(f"/v1/models/{model_id}/predict", headers=AUTH,
                    files={"file": ("rows.parquet", parquet_bytes(listed))})  # fmt: skip
    assert r.status_code == 422 and "example_id" in r.json()["message"], r.text
    header = ",".join([*data.features.column_names, "x0"])
    repeated = f"{header}\n" + ",".join(["e1", *["1"] * (data.features.num_columns - 1), "5"])
    r = client.post(f"/v1/models/{model_id}/predict", headers=AUTH,
                    files={"file": ("rows.csv", repeated.encode())})  # fmt: skip
    assert r.status_code == 422 and r.json()["detail"] == {"repeated_columns": ["x0"]}, r.text

    artifact = client.get(f"/v1/models/{model_id}/artifact", headers=AUTH)
    assert artifact.status_code == 200
    import torch

    blob = torch.load(io.BytesIO(artifact.content), weights_only=True)
    assert blob["preprocessing"]["categorical"] == ["city", "device"]
    assert len(blob["preprocessing"]["vocabularies"][0]) == 20

    # Finished jobs cannot be cancelled.
    r = client.delete(f"/v1/jobs/{job['id']}", headers=AUTH)
    assert r.status_code == 409


def test_labels_that_do_not_join_are_422(
    client: httpx.Client, labels_party: FakeLabelsParty
) -> None:
    data = synthetic(100)
    labels_party.set_labels([f"zz{i}" for i in range(40)], [1.0] * 40)
    fs = upload(client, data.features)
    r = receive(client, labels_party, fs["id"])
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "no_join"
    assert body["detail"]["matched"] == 0 and body["detail"]["unmatched"] == 40
    assert body["detail"]["num_features"] == 100
    # A new release was spent on it: the message says so, and how to reuse it.
    release_id = body["detail"]["release_id"]
    assert "ε spent" in body["message"] and release_id in body["message"]
    again = receive(client, labels_party, fs["id"], release=None, release_id=release_id)
    assert again.json()["error"] == "no_join" and "ε spent" not in again.json()["message"]


def test_job_on_labels_of_another_feature_set_that_does_not_join(
    client: httpx.Client, labels_party: FakeLabelsParty
) -> None:
    data = synthetic(100)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    fs = upload(client, data.features)
    received = receive(client, labels_party, fs["id"]).json()
    other = synthetic(30).features.set_column(
        0, "example_id", pa.array([f"q{i}" for i in range(30)])
    )
    fs2 = upload(client, other)
    r = client.post(
        "/v1/jobs", headers=AUTH, json={"feature_set_id": fs2["id"], "labels_id": received["id"]}
    )
    assert r.status_code == 422
    assert r.json()["detail"] == {
        "num_labels": 100,
        "num_features": 30,
        "matched": 0,
        "unmatched": 100,
    }


def test_labels_party_down_is_502_and_stores_nothing(
    client: httpx.Client, settings: Settings
) -> None:
    fs = upload(client, synthetic(20).features)
    fake = FakeLabelsParty(url=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    r = receive(client, fake, fs["id"])
    assert r.status_code == 502
    body = r.json()
    assert body["error"] == "labels_party_unavailable"
    assert body["detail"]["attempts"] == settings.client_retries + 1
    assert not (settings.data_dir / "received").exists()
    assert list((settings.data_dir / "tmp").glob("*")) == []


def test_hash_mismatch_is_refused(
    client: httpx.Client, settings: Settings, labels_party: FakeLabelsParty
) -> None:
    data = synthetic(50)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    labels_party.wrong_hash = True
    fs = upload(client, data.features)
    r = receive(client, labels_party, fs["id"])
    assert r.status_code == 502
    assert r.json()["error"] == "release_integrity_error"
    assert r.json()["detail"]["release_id"] == "rel-1" and "ε spent" in r.json()["message"]
    assert not (settings.data_dir / "received").exists()
    # The release exists (it was spent); fetching it again by id is refused too.
    r = receive(client, labels_party, fs["id"], release=None, release_id="rel-1")
    assert r.status_code == 502


def test_the_idempotency_key_header_is_the_release_s_key(
    client: httpx.Client, labels_party: FakeLabelsParty
) -> None:
    """The labels party takes the header as the key; so must the features party, or a
    retry that sends only the header buys a second release."""
    data = synthetic(30)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    fs = upload(client, data.features)
    body = {"feature_set_id": fs["id"], "labels_party_url": labels_party.url, "token": TOKEN,
            "dataset_id": labels_party.dataset_id,
            "release": {"mechanism": {"name": "laplace"}, "epsilon": 1.0}}  # fmt: skip
    keyed = {**AUTH, "Idempotency-Key": "retry-me-1"}
    first = client.post("/v1/received-labels", headers=keyed, json=body)
    again = client.post("/v1/received-labels", headers=keyed, json=body)
    assert (first.status_code, again.status_code) == (201, 200), again.text
    # The retry's answer is the row the first made, not a second row for one release.
    assert again.json() == first.json()
    listed = client.get("/v1/received-labels", headers=AUTH, params={"feature_set_id": fs["id"]})
    assert [row["id"] for row in listed.json()] == [first.json()["id"]]
    assert labels_party.spent == 1.0 and "retry-me-1" in labels_party.by_key
    other = {**body, "release": {**body["release"], "idempotency_key": "another"}}
    r = client.post("/v1/received-labels", headers=keyed, json=other)
    assert r.status_code == 422 and "differ" in r.json()["message"]
    fetch = {**body, "release": None, "release_id": first.json()["release_id"]}
    assert client.post("/v1/received-labels", headers=keyed, json=fetch).status_code == 422
    assert labels_party.spent == 1.0


def test_a_release_file_past_its_label_count_is_refused_not_stored(
    client: httpx.Client,
    settings: Settings,
    labels_party: FakeLabelsParty,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A labels party that streams more than num_labels can make (bounded per label)
    must not fill the data directory: the download stops there."""
    data = synthetic(200)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    monkeypatch.setattr(received_labels_service, "MOST_BYTES_PER_LABEL", 1)
    monkeypatch.setattr(received_labels_service, "ROOM_BASE", 1000)
    fs = upload(client, data.features)
    r = receive(client, labels_party, fs["id"])
    assert r.status_code == 502 and r.json()["error"] == "release_integrity_error", r.text
    assert "more than 1200 bytes" in r.json()["message"]
    assert not (settings.data_dir / "received").exists()
    assert list((settings.data_dir / "tmp").glob("*")) == []


def test_a_download_that_fails_after_the_release_names_the_release(
    client: httpx.Client, settings: Settings, labels_party: FakeLabelsParty
) -> None:
    """The release was made and paid for: the error must say which, so that the
    retry fetches it by id instead of buying another under a fresh idempotency key."""
    data = synthetic(30)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    labels_party.fail_gets = settings.client_retries + 1
    fs = upload(client, data.features)
    r = receive(client, labels_party, fs["id"])
    assert r.status_code == 502, r.text
    body = r.json()
    release_id = body["detail"]["release_id"]
    assert body["error"] == "labels_party_error"  # its 500, every try: its failure, not an outage
    assert body["detail"]["status"] == 500 and body["detail"]["error"] == "internal_error"
    assert "ε spent" in body["message"] and release_id in body["message"]
    assert list((settings.data_dir / "tmp").glob("*")) == []
    labels_party.fail_gets = 0
    again = receive(client, labels_party, fs["id"], release=None, release_id=release_id)
    assert again.status_code == 201, again.text
    assert labels_party.spent == 1.0  # one release, paid once
    twice = receive(client, labels_party, fs["id"], release=None, release_id=release_id)
    assert twice.status_code == 200 and twice.json()["id"] == again.json()["id"]
    elsewhere = upload(client, data.features)  # another feature set records its own row
    assert receive(client, labels_party, elsewhere["id"], release=None,
                   release_id=release_id).status_code == 201  # fmt: skip


def test_a_release_whose_answer_was_lost_names_its_idempotency_key(
    client: httpx.Client, settings: Settings, labels_party: FakeLabelsParty
) -> None:
    """The labels party made (and charged) the release, then every answer was lost:
    the key the features party made up must come back, or the caller's retry pays
    again under a fresh one."""
    data = synthetic(30)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    labels_party.fail_posts = settings.client_retries + 1
    fs = upload(client, data.features)
    r = receive(client, labels_party, fs["id"])
    assert r.status_code == 502, r.text
    body = r.json()
    key = body["detail"]["idempotency_key"]
    assert key in body["message"] and "without spending again" in body["message"]
    assert labels_party.spent == 1.0
    release = {"mechanism": {"name": "laplace"}, "epsilon": 1.0, "idempotency_key": key}
    again = receive(client, labels_party, fs["id"], release=release)
    assert again.status_code == 201, again.text
    assert labels_party.spent == 1.0  # the same release, paid once
    assert len(labels_party.releases) == 1


def test_a_charged_mechanism_failure_names_the_key_that_replays_it(
    client: httpx.Client, labels_party: FakeLabelsParty
) -> None:
    """It came back as labels_party_refused, which reads as nothing spent, without
    the key the features party had made up (review of 0226214)."""
    data = synthetic(20)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    labels_party.mechanism_fails = True
    fs = upload(client, data.features)
    r = receive(client, labels_party, fs["id"])
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "release_failed"
    key = body["detail"]["idempotency_key"]
    assert key in body["message"]
    release = {"mechanism": {"name": "laplace"}, "epsilon": 1.0, "idempotency_key": key}
    again = receive(client, labels_party, fs["id"], release=release)
    assert again.json()["error"] == "release_failed"
    assert labels_party.spent == 1.0  # replayed, not paid again


@pytest.mark.parametrize("token", [TOKEN + "\n", " " + TOKEN, TOKEN[:-1] + "é"])
def test_a_token_that_cannot_be_a_header_is_422_and_never_echoed(
    client: httpx.Client, labels_party: FakeLabelsParty, token: str
) -> None:
    """Before, httpx refused the header with a message quoting it, token and all,
    into the 502's body and the log; a non-ASCII token was a 500."""
    fs = upload(client, synthetic(20).features)
    r = receive(client, labels_party, fs["id"], token=token)
    assert r.status_code == 422, r.text
    assert TOKEN[:12] not in r.text
    r = client.post(
        "/v1/models/import",
        headers=AUTH,
        json={"labels_party_url": labels_party.url, "token": token, "training_id": "t"},
    )
    assert r.status_code == 422, r.text
    assert TOKEN[:12] not in r.text
    assert labels_party.spent == 0


def test_start_up_sweeps_what_a_write_killed_before_its_row_left(
    settings: Settings, client: httpx.Client
) -> None:
    """A feature set or a release is written, then its row commits: SIGKILLed
    between the two, its file (73 MB for one upload) or its partial write was left
    where rows name files, and nothing swept it (helper-68). Partial writes go;
    complete files are set aside under orphans/; named and young files stay."""
    named = upload(client, synthetic(20).features)
    data = settings.data_dir
    stale = {
        "partial": data / "feature_sets" / "killed.tmp",
        "complete": data / "feature_sets" / "killed.parquet",
        "received": data / "received" / f"{'a' * 64}.parquet",
        "received partial": data / "received" / f".{'b' * 64}.c.tmp",
        "import partial": data / "models" / "imported" / f"{'c' * 64}.pt.1.part",
    }
    young = data / "received" / f"{'d' * 64}.parquet"
    for path in (*stale.values(), young):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    hours_ago = time.time() - 2 * 3600
    for path in stale.values():
        os.utime(path, (hours_ago, hours_ago))
    kept = [p for p in (data / "feature_sets").iterdir() if p.name.startswith(named["id"])]
    for path in kept:  # the named feature set, old as it is, stays where it is
        os.utime(path, (hours_ago, hours_ago))
    with running_service(settings) as c:
        assert c.get(f"/v1/feature-sets/{named['id']}", headers=AUTH).status_code == 200
    assert not any(p.exists() for p in stale.values()) and young.exists()
    assert all(p.exists() for p in kept) and kept
    orphans = data / "orphans"
    assert (orphans / "feature_sets" / "killed.parquet").exists()
    assert (orphans / "received" / f"{'a' * 64}.parquet").exists()


def test_start_up_sweeps_the_parts_a_killed_process_left(settings: Settings) -> None:
    """A download cut by SIGKILL left its ``.part`` in ``tmp/`` for good; a young
    file may be another process's, writing now, and stays."""
    tmp = settings.data_dir / "tmp"
    tmp.mkdir(parents=True)
    stale, young = tmp / "a.parquet.1.part", tmp / "b.upload"
    stale.write_bytes(b"half")
    young.write_bytes(b"writing")
    hours_ago = time.time() - 2 * 3600
    os.utime(stale, (hours_ago, hours_ago))
    with running_service(settings) as c:
        assert c.get("/healthz").status_code == 200
    assert not stale.exists() and young.exists()


def test_no_database_connection_is_held_while_the_labels_party_answers(
    settings: Settings, labels_party: FakeLabelsParty
) -> None:
    """Held across a stalled labels party, every such request kept a pooled
    connection, and 15 of them starved the whole service."""
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    fs_id, _labels = seed_inputs(database, settings, n=30)
    with database.session() as session:
        ids = pq.read_table(
            settings.data_dir / session.get(FeatureSet, fs_id).path  # type: ignore[union-attr]
        ).column("example_id")
    labels_party.set_labels(ids.to_pylist(), [1.0] * len(ids))
    held: list[int] = []
    labels_party.on_release = lambda: held.append(database.engine.pool.checkedout())  # type: ignore[attr-defined]
    request = ReceivedLabelsCreate.model_validate(
        {
            "feature_set_id": fs_id,
            "labels_party_url": labels_party.url,
            "token": TOKEN,
            "dataset_id": labels_party.dataset_id,
            "release": {"mechanism": {"name": "laplace"}, "epsilon": 1.0},
        }
    )
    with database.session() as session:
        received, _created = received_labels_service.receive(session, settings, request)
    assert received.matched == len(ids)
    assert held == [0]
    database.dispose()


def _three_class_rr_release(
    client: httpx.Client, labels_party: FakeLabelsParty, name: str = "rr"
) -> dict[str, str]:
    """A received release of 3 classes by ``name`` (rr, rr-with-prior; with no
    matrix, as the labels party describes them) → the ids a job names."""
    data = synthetic(40)
    ids = data.features.column("example_id").to_pylist()
    labels_party.set_labels(ids, [float(i % 3) for i in range(len(ids))])
    labels_party.mechanism = {"name": name, "epsilon": 1.0, "params": {}, "outputs": [0, 1, 2]}
    fs = upload(client, data.features)
    received = receive(client, labels_party, fs["id"]).json()
    return {"feature_set_id": fs["id"], "labels_id": received["id"]}


def test_num_classes_below_the_release_s_classes_is_422(
    client: httpx.Client, labels_party: FakeLabelsParty
) -> None:
    job = {**_three_class_rr_release(client, labels_party),
           "task": "classification", "loss": "cross-entropy"}  # fmt: skip
    r = client.post("/v1/jobs", headers=AUTH, json={**job, "num_classes": 2})
    assert r.status_code == 422 and "below the release's 3 classes" in r.json()["message"]
    r = client.post("/v1/jobs", headers=AUTH, json={**job, "num_classes": 3})
    assert r.status_code == 202, r.text


def test_the_debiased_loss_is_for_randomized_response_releases_only(
    client: httpx.Client, labels_party: FakeLabelsParty
) -> None:
    """It inverts K-ary RR's matrix, which an rr manifest gives by (K, ε); an
    rr-with-prior release is RRTop-k, whose matrix has no inverse: refused at once,
    not corrected as if it were RR."""
    job = {"task": "classification", "loss": "rr-debiased-cross-entropy", "epochs": 1}
    rr = {**_three_class_rr_release(client, labels_party), **job}
    assert client.post("/v1/jobs", headers=AUTH, json=rr).status_code == 202
    top_k = {**_three_class_rr_release(client, labels_party, "rr-with-prior"), **job}
    r = client.post("/v1/jobs", headers=AUTH, json=top_k)
    assert r.status_code == 422 and "'rr-with-prior'" in r.json()["message"], r.text


def test_a_job_of_the_other_task_than_the_release_is_422(
    client: httpx.Client, labels_party: FakeLabelsParty
) -> None:
    labels_party.task = "classification"
    job = {**_three_class_rr_release(client, labels_party), "task": "regression"}
    r = client.post("/v1/jobs", headers=AUTH, json=job)
    assert r.status_code == 422 and r.json()["error"] == "task_mismatch"
    assert r.json()["detail"] == {"release_task": "classification", "task": "regression"}


def test_what_the_worker_would_refuse_is_422_at_submit(
    client: httpx.Client, settings: Settings, labels_party: FakeLabelsParty
) -> None:
    """A Poisson loss on labels that go negative, a classifier started from a
    regression model, a billion classes: each was queued, then failed by the worker."""
    data = synthetic(40)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    labels_party.mechanism = {"name": "unbiased", "epsilon": 1.0, "params": {},
                              "outputs": [-3.5, 1.0, 6.0]}  # fmt: skip
    fs = upload(client, data.features)
    ids = {
        "feature_set_id": fs["id"],
        "labels_id": receive(client, labels_party, fs["id"]).json()["id"],
    }
    r = client.post("/v1/jobs", headers=AUTH, json={**ids, "loss": "poisson"})
    assert r.status_code == 422 and "non-negative labels" in r.json()["message"], r.text
    job = client.post("/v1/jobs", headers=AUTH, json={**ids, "epochs": 1, "batch_size": 64})
    database = Database(settings.resolved_database_url)
    try:
        Worker(database, settings, worker_id="w").run(once=True)
    finally:
        database.dispose()
    model_id = client.get(f"/v1/jobs/{job.json()['id']}", headers=AUTH).json()["model_id"]
    assert model_id is not None
    classifier = {**_three_class_rr_release(client, labels_party), "task": "classification",
                  "loss": "cross-entropy"}  # fmt: skip
    r = client.post("/v1/jobs", headers=AUTH, json={**classifier, "init_model_id": model_id})
    assert r.status_code == 422 and r.json()["detail"]["init_model_task"] == "regression"
    r = client.post("/v1/jobs", headers=AUTH, json={**classifier, "num_classes": 3_000_000_000})
    assert r.status_code == 422
    # An init model must have the job's shape and columns (load_state_dict failed in the worker).
    warm = {**ids, "epochs": 1, "init_model_id": model_id}
    assert client.post("/v1/jobs", headers=AUTH, json=warm).status_code == 202
    r = client.post("/v1/jobs", headers=AUTH, json={**warm, "hidden": [16]})
    assert r.status_code == 422 and r.json()["error"] == "init_model_mismatch", r.text
    assert r.json()["detail"] == {"hidden": {"model": [128, 64], "job": [16]}}
    narrower = upload(client, data.features.drop_columns(["x3"]))
    other = {"feature_set_id": narrower["id"], "labels_id": ids["labels_id"]}
    r = client.post("/v1/jobs", headers=AUTH, json={**other, "init_model_id": model_id})
    assert r.status_code == 422 and "other feature columns" in r.json()["message"], r.text
    assert "x3" not in r.json()["detail"]["feature_set_columns"]["numeric"]


def test_what_the_labels_party_refuses_is_a_4xx(
    client: httpx.Client, settings: Settings, labels_party: FakeLabelsParty
) -> None:
    fs = upload(client, synthetic(20).features)
    # The caller's mistakes, not the labels party failing: an unknown release, an
    # unknown dataset, a token it does not know (403 here: the forwarded token).
    cases = [
        ({"release": None, "release_id": "nope"}, 404),
        ({"dataset_id": "nope"}, 404),
        ({"token": "unknown-token-123456"}, 403),
    ]
    for extra, status in cases:
        r = receive(client, labels_party, fs["id"], **extra)
        assert r.status_code == status, r.text
        assert r.json()["error"] == "labels_party_refused"
        assert r.json()["detail"]["status"] in (status, 401)
    assert not (settings.data_dir / "received").exists()


def test_budget_exceeded_is_409(client: httpx.Client, labels_party: FakeLabelsParty) -> None:
    data = synthetic(20)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    labels_party.budget = 0.5
    fs = upload(client, data.features)
    r = receive(client, labels_party, fs["id"])
    assert r.status_code == 409
    assert r.json()["error"] == "budget_exceeded"


def test_cancel_a_queued_job(client: httpx.Client, labels_party: FakeLabelsParty) -> None:
    data = synthetic(100)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    fs = upload(client, data.features)
    received = receive(client, labels_party, fs["id"]).json()
    job = client.post(
        "/v1/jobs", headers=AUTH, json={"feature_set_id": fs["id"], "labels_id": received["id"]}
    ).json()
    r = client.delete(f"/v1/jobs/{job['id']}", headers=AUTH)
    assert r.status_code == 200
    assert r.json()["status"] == "cancelled"


def test_the_cli_cancels_a_job(
    client: httpx.Client,
    labels_party: FakeLabelsParty,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from labeldp.cli import main

    data = synthetic(100)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    fs = upload(client, data.features)
    received = receive(client, labels_party, fs["id"]).json()
    body = {"feature_set_id": fs["id"], "labels_id": received["id"]}
    job = client.post("/v1/jobs", headers=AUTH, json=body).json()
    monkeypatch.setenv("LABELDP_ADMIN_TOKEN", ADMIN)
    # watch says once that no worker takes the job (it waited in silence), and ends
    # when the job does.
    monkeypatch.setattr(watching, "QUEUED_HINT_SECONDS", 0.0)
    url = str(client.base_url)
    timer = threading.Timer(1.0, lambda: client.delete(f"/v1/jobs/{job['id']}", headers=AUTH))
    timer.start()
    try:
        watched = main(["feature-party", "jobs", "watch", job["id"], "--url", url,
                        "--interval", "0.05"])  # fmt: skip
    finally:
        timer.join()
    assert watched == 1
    assert capsys.readouterr().err.count("labeldp feature-party worker") == 1
    command = ["feature-party", "jobs", "cancel", job["id"], "--url", url]
    assert main(command) == 2  # already cancelled
    assert "job_finished" in capsys.readouterr().err
    job = client.post("/v1/jobs", headers=AUTH, json=body).json()
    command = ["feature-party", "jobs", "cancel", job["id"], "--url", url]
    assert main(command) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cancelled"
    assert main(command) == 2  # already cancelled
    assert "job_finished" in capsys.readouterr().err
    # watch ends at once, saying why on stderr (it exited 1 in silence).
    assert main(["feature-party", "jobs", "watch", job["id"], "--url", str(client.base_url)]) == 1
    assert capsys.readouterr().err.strip() == "cancelled: by request"


def test_the_cli_drives_the_whole_publisher_flow(
    tmp_path: Path,
    client: httpx.Client,
    settings: Settings,
    labels_party: FakeLabelsParty,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """feature-sets upload → labels receive → jobs submit → models predict, from the
    CLI alone (DESIGN.md §6: client commands for both APIs)."""
    from labeldp.cli import main

    def run(*command: str) -> dict[str, Any]:
        assert main(["feature-party", *command, "--url", str(client.base_url)]) == 0
        answer: dict[str, Any] = json.loads(capsys.readouterr().out)
        return answer

    data = synthetic(300, seed=2)
    ids = data.features.column("example_id").to_pylist()
    labels_party.set_labels(ids, list(data.noisy))
    features = tmp_path / "features.parquet"
    pq.write_table(data.features, features)
    monkeypatch.setenv("LABELDP_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("LABELDP_LABELS_PARTY_TOKEN", TOKEN)
    fs = run("feature-sets", "upload", str(features), "--name", "publisher")
    assert fs["num_rows"] == 300 and run("feature-sets", "get", fs["id"])["id"] == fs["id"]
    where = ("--feature-set", fs["id"], "--labels-party-url", labels_party.url,
             "--dataset", labels_party.dataset_id)  # fmt: skip
    received = run("labels", "receive", *where, "--mechanism", "laplace", "--epsilon", "1",
                   "--idempotency-key", "cli-1")  # fmt: skip
    again = run("labels", "receive", *where, "--mechanism", "laplace", "--epsilon", "1",
                "--idempotency-key", "cli-1")  # fmt: skip
    assert again["release_id"] == received["release_id"] and labels_party.spent == 1.0
    free = run("labels", "receive", *where, "--release", received["release_id"])
    assert free["sha256"] == received["sha256"] and labels_party.spent == 1.0
    assert main(["feature-party", "labels", "receive", *where, "--url", str(client.base_url),
                 "--release", "rel-1", "--epsilon", "1"]) == 2  # fmt: skip
    assert "give no release options" in capsys.readouterr().err
    config = {"task": "regression", "loss": "squared", "epochs": 1, "hidden": [8]}
    job = run("jobs", "submit", "--feature-set", fs["id"], "--labels", received["id"],
              "--config", json.dumps(config))  # fmt: skip
    database = Database(settings.resolved_database_url)
    try:
        # On Postgres the queue is the session's: other tests' jobs may be run too.
        assert Worker(database, settings).run(once=True) >= 1
    finally:
        database.dispose()
    finished = run("jobs", "get", job["id"])
    assert finished["status"] == "succeeded", finished
    model_id = finished["model_id"]
    rows = tmp_path / "rows.parquet"
    pq.write_table(data.features.slice(0, 4), rows)
    predicted = run("models", "predict", model_id, str(rows))
    assert predicted["example_id"] == ids[:4] and len(predicted["prediction"]) == 4
    out = tmp_path / "predictions.csv"
    assert main(["feature-party", "models", "predict", model_id, str(rows), "--output", str(out),
                 "--url", str(client.base_url)]) == 0  # fmt: skip
    assert out.read_text().splitlines()[0] == "example_id,prediction"
    assert len(out.read_text().splitlines()) == 5


def test_an_id_that_is_no_id_is_422_not_a_500(client: httpx.Client) -> None:
    """A lone surrogate in an id reached the database driver (UnicodeEncodeError: 500)."""
    for path, body in (
        ("/v1/jobs", '{"feature_set_id": "\\ud800", "labels_id": "x"}'),
        ("/v1/jobs", '{"feature_set_id": "f", "labels_id": "x", "init_model_id": "\\ud800"}'),
        ("/v1/received-labels", '{"feature_set_id": "\\ud800", "labels_party_url": '
         '"http://127.0.0.1:9", "token": "t", "dataset_id": "d", "release_id": "r"}'),
        ("/v1/multistage", '{"feature_set_id": "f", "labels_party_url": "http://127.0.0.1:9", '
         '"token": "t", "dataset_id": "\\ud800", "epsilon": 1}'),
    ):  # fmt: skip
        r = client.post(path, headers={**AUTH, "Content-Type": "application/json"}, content=body)
        assert r.status_code == 422, (path, r.text)


def test_invalid_job_config_is_422(client: httpx.Client) -> None:
    r = client.post(
        "/v1/jobs",
        headers=AUTH,
        json={
            "feature_set_id": "a",
            "labels_id": "b",
            "task": "regression",
            "loss": "cross-entropy",
        },
    )
    assert r.status_code == 422
    assert r.json()["error"] == "invalid_request"
    job = {"feature_set_id": "a", "labels_id": "b", "learning_rate": float("nan")}
    r = client.post("/v1/jobs", headers={**AUTH, "content-type": "application/json"},
                    content=json.dumps(job))  # fmt: skip
    assert r.status_code == 422 and "finite" in json.dumps(r.json()["detail"])


def test_a_release_with_repeated_ids_is_refused(
    client: httpx.Client, settings: Settings, labels_party: FakeLabelsParty
) -> None:
    labels_party.set_labels(["ex0", "ex1", "ex1"], [1.0, 2.0, 3.0])
    fs = upload(client, synthetic(20).features)
    r = receive(client, labels_party, fs["id"])
    assert r.status_code == 502
    assert r.json()["error"] == "release_integrity_error"
    assert not (settings.data_dir / "received").exists()


def test_a_release_is_read_by_its_two_columns_and_its_labels_must_be_numbers(
    client: httpx.Client, settings: Settings, labels_party: FakeLabelsParty
) -> None:
    """A release was read whole (1.5 kB of padding decoded to 1 GB) and text labels
    were accepted, to fail later in a job: now only example_id and label are
    read, and labels that are not numbers are the release's integrity error."""
    fs = upload(client, synthetic(20).features)
    ids = [f"ex{i}" for i in range(20)]
    padded = pa.table({"example_id": ids, "label": [1.0] * 20, "pad": [b"x" * 1000] * 20})
    labels_party.labels, labels_party.num_labels = parquet_bytes(padded), 20
    r = receive(client, labels_party, fs["id"])
    assert r.status_code == 201 and r.json()["matched"] == 20, r.text
    labels_party.labels = parquet_bytes(pa.table({"example_id": ids, "label": ["a"] * 20}))
    release = {"mechanism": {"name": "laplace"}, "epsilon": 1.0, "idempotency_key": "text"}
    r = receive(client, labels_party, fs["id"], release=release)
    assert r.status_code == 502 and r.json()["error"] == "release_integrity_error", r.text
    assert "not numbers" in r.json()["message"]
    # A null id was "repeats example_ids"; NaN and infinite labels were stored (helper-86).
    for n, (column, values, says) in enumerate([
        ("example_id", [None, *ids[1:]], "1 null example_ids"),
        ("label", [float("nan")] + [1.0] * 19, "null, NaN or infinite"),
        ("label", [float("-inf")] + [1.0] * 19, "null, NaN or infinite"),
        ("label", [None] + [1.0] * 19, "null, NaN or infinite"),
    ]):  # fmt: skip
        table = {"example_id": ids, "label": [1.0] * 20, column: values}
        labels_party.labels = parquet_bytes(pa.table(table))
        release = {**release, "idempotency_key": f"odd-{n}"}
        r = receive(client, labels_party, fs["id"], release=release)
        assert r.status_code == 502 and r.json()["error"] == "release_integrity_error", r.text
        assert says in r.json()["message"]


def test_model_import_refuses_odd_ids_and_odd_answers(client: httpx.Client) -> None:
    from fastapi import FastAPI

    from tests.feature_party.fake_labels_party import serve_app

    other = FastAPI()  # another service at the labels party's URL: 200, but a list

    @other.get("/v1/trainings/{training_id}")
    def listing(training_id: str) -> list[str]:
        return [training_id]

    with serve_app(other) as url:
        body = {"labels_party_url": url, "token": TOKEN, "training_id": "../datasets"}
        r = client.post("/v1/models/import", headers=AUTH, json=body)
        assert r.status_code == 422  # an id is one path segment, never a path
        r = client.post("/v1/models/import", headers=AUTH, json={**body, "training_id": "t-1"})
        assert r.status_code == 502 and r.json()["error"] == "labels_party_error", r.text
        assert r.json()["detail"]["training_id"] == "t-1"


def _artifact_bytes(*, hidden: list[int] | None = None, num_numeric: int = 2) -> bytes:
    """A small MLP's artifact; ``hidden`` overrides the architecture it declares and
    ``num_numeric`` the width its preprocessing feeds."""
    from shared.artifact import model_artifact
    from shared.torch_models import TabularMLP, TabularMLPConfig

    model = TabularMLP(TabularMLPConfig(num_numeric=2, hidden=(4,), outputs=3))
    config = model.config.to_dict()
    config["hidden"] = hidden or config["hidden"]
    names = [f"x{i}" for i in range(num_numeric)]
    blob = model_artifact(model=model, model_config=config, task="classification",
                          preprocessing={"numeric": names, "means": [0.0] * num_numeric,
                                         "stds": [1.0] * num_numeric, "categorical": [],
                                         "vocabularies": []},
                          loss="cross-entropy", num_classes=3, training={}, metrics={})  # fmt: skip
    buffer = io.BytesIO()
    torch.save(blob, buffer)
    return buffer.getvalue()


def _labels_party_with_one_training(
    artifact: bytes, *, before_download: Callable[[], object] = lambda: None
) -> Any:
    """A labels party (a FastAPI app) whose every training succeeded with
    ``artifact`` as its model; ``before_download`` runs as each download starts."""
    import hashlib

    from fastapi import FastAPI, Response

    sha = hashlib.sha256(artifact).hexdigest()
    app = FastAPI()

    @app.get("/v1/trainings/{training_id}")
    def training(training_id: str) -> dict[str, str]:
        return {"id": training_id, "status": "succeeded", "sha256": sha}

    @app.get("/v1/trainings/{training_id}/model")
    def model(training_id: str) -> Response:
        before_download()
        return Response(artifact, media_type="application/octet-stream",
                        headers={"X-Content-SHA256": sha})  # fmt: skip

    return app


@pytest.mark.parametrize(
    "artifact",
    [b"not a torch file", b"", b"junk", "huge", "too wide"],
    ids=[
        "garbage",
        "empty",
        "four-bytes",
        "declares-more-than-it-holds",
        "wider-than-its-preprocessing",
    ],
)
def test_a_model_that_does_not_load_is_a_502_and_leaves_nothing(
    client: httpx.Client, settings: Settings, artifact: bytes | str
) -> None:
    """Bytes that match their hash but are no model (a labels party's bug, a wrong
    file): 502 ``invalid_model``, not a 500, and no file kept under models/. A
    1.5 kB artifact declaring hidden [20000, 20000] allocated 1.8 GB before its
    weights were found not to fit; one wider than its preprocessing was
    registered and then answered every prediction with a 500."""
    why = {"huge": "architecture does not match its weights", "too wide": "mat1 and mat2"}
    reason = why.get(artifact) if isinstance(artifact, str) else None
    if artifact == "huge":
        artifact = _artifact_bytes(hidden=[20_000, 20_000])
    elif artifact == "too wide":
        artifact = _artifact_bytes(num_numeric=3)
    assert isinstance(artifact, bytes)

    from tests.feature_party.fake_labels_party import serve_app

    with serve_app(_labels_party_with_one_training(artifact)) as url:
        body = {"labels_party_url": url, "token": TOKEN, "training_id": "t-1"}
        r = client.post("/v1/models/import", headers=AUTH, json=body)
    assert r.status_code == 502 and r.json()["error"] == "invalid_model", r.text
    assert reason is None or reason in r.json()["message"]  # refused before it is built
    assert r.json()["detail"]["training_id"] == "t-1"
    assert not list((settings.data_dir / "models").rglob("*.pt"))


def test_two_imports_of_one_training_at_once_register_one_model(client: httpx.Client) -> None:
    """Both imports found no model, downloaded, and each registered one: two 201s
    and two models for one training, where an import again answers 200 and the first."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from tests.feature_party.fake_labels_party import serve_app

    both_downloading = threading.Barrier(2, timeout=30)  # both are past their lookup
    labels_party = _labels_party_with_one_training(
        _artifact_bytes(), before_download=both_downloading.wait
    )
    with serve_app(labels_party) as url:
        training_id = f"t-{os.urandom(4).hex()}"  # Postgres: the session's database is shared
        body = {"labels_party_url": url, "token": TOKEN, "training_id": training_id}
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(
                lambda _: client.post("/v1/models/import", headers=AUTH, json=body), range(2)
            ))  # fmt: skip
        both_downloading.reset()
        again = client.post("/v1/models/import", headers=AUTH, json=body)
    assert sorted(r.status_code for r in answers) == [200, 201], [r.text for r in answers]
    assert again.status_code == 200, again.text
    ids = {r.json()["id"] for r in [*answers, again]}
    models = client.get("/v1/models", headers=AUTH, params={"limit": 1000}).json()
    listed = [m["id"] for m in models if m["training_id"] == training_id]
    assert len(ids) == 1 and listed == list(ids)


def test_a_received_release_is_on_disk_before_its_row_commits(
    client: httpx.Client,
    settings: Settings,
    labels_party: FakeLabelsParty,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The file was renamed into received/ with no fsync of it or of the directory:
    after a power loss a committed row could name a missing or empty file, and a
    retry then found that row and answered with it."""
    data = synthetic(30)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    fs = upload(client, data.features)
    received = settings.data_dir / "received"
    synced: list[tuple[Path, bool]] = []  # (path, whether received/ held a file yet)
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        stored = received.exists() and any(received.iterdir())
        synced.append((Path(os.readlink(f"/proc/self/fd/{fd}")), stored))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    r = receive(client, labels_party, fs["id"])
    assert r.status_code == 201, r.text
    file_synced = [path for path, stored in synced if path.suffix == ".parquet" and not stored]
    assert file_synced and (received, True) in synced, synced


def test_two_receipts_of_one_release_at_once_record_one_row(
    client: httpx.Client, labels_party: FakeLabelsParty
) -> None:
    """Both found no row for the release, downloaded, and each recorded one: two 201s
    and two rows, where a receipt again answers 200 with the first."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    data = synthetic(30)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    made = receive(client, labels_party, upload(client, data.features)["id"])
    assert made.status_code == 201, made.text
    fs = upload(client, data.features)["id"]
    labels_party.on_download = threading.Barrier(2, timeout=30).wait  # both are downloading
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(
            lambda _: receive(client, labels_party, fs, release=None,
                              release_id=made.json()["release_id"]),
            range(2),
        ))  # fmt: skip
    assert sorted(r.status_code for r in answers) == [200, 201], [r.text for r in answers]
    listed = client.get("/v1/received-labels", headers=AUTH, params={"feature_set_id": fs})
    assert [row["id"] for row in listed.json()] == [answers[0].json()["id"]]
    assert answers[0].json() == answers[1].json()


@pytest.mark.parametrize("sha", ["../../../escaped/x", ""], ids=["a-path", "empty"])
def test_a_training_whose_sha256_is_no_hash_is_refused_before_a_file_is_named(
    client: httpx.Client, settings: Settings, sha: str
) -> None:
    """The training's sha256 named the download's file before it was checked: a
    labels party answering "../../../escaped/x" made a directory outside the data
    directory and wrote its bytes there."""
    from fastapi import FastAPI, Response

    from tests.feature_party.fake_labels_party import serve_app

    other = FastAPI()

    @other.get("/v1/trainings/{training_id}")
    def training(training_id: str) -> dict[str, str]:
        return {"id": training_id, "status": "succeeded", "sha256": sha or " "}

    @other.get("/v1/trainings/{training_id}/model")
    def model(training_id: str) -> Response:
        return Response(b"bytes", media_type="application/octet-stream")

    with serve_app(other) as url:
        body = {"labels_party_url": url, "token": TOKEN, "training_id": "t-1"}
        r = client.post("/v1/models/import", headers=AUTH, json=body)
    assert r.status_code == 502 and r.json()["error"] == "release_integrity_error", r.text
    assert "64 hex digits" in r.json()["message"]
    assert not (settings.data_dir.parent / "escaped").exists()
    assert not (settings.data_dir / "models").exists()


def test_declared_categorical_csv_columns_are_read_as_text(tmp_path: Path) -> None:
    from feature_party.feature_sets.ingest import ingest
    from feature_party.feature_sets.schemas import SchemaDeclaration

    path = tmp_path / "features.csv"
    path.write_text("example_id,zip,age\na,01234,1\nb,00042,2\n")
    schema = SchemaDeclaration(numeric=["age"], categorical=["zip"])
    table = ingest(path, filename="features.csv", schema=schema).table
    assert table.column("zip").to_pylist() == ["01234", "00042"]  # not 1234 and 42
    # The received label's column name, left out of the schema, is not stored.
    path.write_text("example_id,zip,age,__labeldp_target\na,01234,1,7\n")
    stored = ingest(path, filename="features.csv", schema=schema).table
    assert "__labeldp_target" not in stored.column_names


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a worker without GPUs")
def test_a_job_asking_for_gpus_fails_saying_why(
    client: httpx.Client, settings: Settings, labels_party: FakeLabelsParty
) -> None:
    job = {**_three_class_rr_release(client, labels_party),
           "task": "classification", "loss": "cross-entropy"}  # fmt: skip
    for device in (True, "2", 0):  # not numbers of GPUs
        r = client.post("/v1/jobs", headers=AUTH, json={**job, "device": device})
        assert r.status_code == 422, device
    # Strict: a value of the wrong JSON type is refused, not coerced.
    for wrong in ({"epochs": "2"}, {"dropout": True}, {"hidden": ["16"]}, {"seed": 1.0}):
        r = client.post("/v1/jobs", headers=AUTH, json={**job, **wrong})
        assert r.status_code == 422, wrong
    r = client.post("/v1/jobs", headers=AUTH, json={**job, "device": 2})
    assert r.status_code == 202, r.text
    database = Database(settings.resolved_database_url)
    try:
        assert Worker(database, settings, gpus=0).run(once=True) == 0  # left for a GPU worker
        # A worker that offers GPUs it cannot use (a broken driver) fails the job.
        assert Worker(database, settings, gpus=2).run(once=True) == 1
    finally:
        database.dispose()
    failed = client.get(f"/v1/jobs/{r.json()['id']}", headers=AUTH).json()
    assert failed["status"] == "failed"
    assert failed["error"] == "ValueError: the job asks for CUDA but this worker has no GPU"


def test_configs_that_could_only_fail_in_the_worker_are_422(
    client: httpx.Client, labels_party: FakeLabelsParty
) -> None:
    job = {**_three_class_rr_release(client, labels_party),
           "task": "classification", "loss": "cross-entropy"}  # fmt: skip
    r = client.post("/v1/jobs", headers=AUTH, json={**job, "architecture": "cnn"})
    assert r.status_code == 422 and "the cnn reads 1×28×28 = 784" in r.json()["message"]
    r = client.post("/v1/jobs", headers=AUTH, json={**job, "validation_fraction": 0.99})
    assert r.status_code == 422 and "leaves none to train on" in r.json()["message"]
    for huge in ({"max_vocab": 10**30}, {"min_count": 10**30}):  # TypeError, OverflowError
        r = client.post("/v1/jobs", headers=AUTH, json={**job, **huge})
        assert r.status_code == 422, r.text


def test_end_reads_refuses_a_session_that_flushed_a_write(settings: Settings) -> None:
    """It checked unflushed changes only: a flushed row was rolled back silently."""
    from feature_party.db import end_reads

    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    fs_id, _labels = seed_inputs(database, settings, n=10)
    with database.session() as session:
        session.get(FeatureSet, fs_id)
        end_reads(session)  # reads only: fine
        row = session.get(FeatureSet, fs_id)
        assert row is not None
        row.name = "renamed"
        session.flush()
        with pytest.raises(RuntimeError, match="would be lost"):
            end_reads(session)
    with database.session() as session:
        assert session.get(FeatureSet, fs_id).name == "renamed"  # type: ignore[union-attr]
        end_reads(session)  # a new transaction: nothing written yet
    database.dispose()


def test_json_naming_a_key_twice_is_refused(client: httpx.Client) -> None:
    """A schema naming ``numeric`` twice kept the last list, and a JSON body naming a
    key twice its last value (helper-70): neither is guessed at."""
    features = csv_bytes(synthetic(5).features)
    before = every_row(client.get("/v1/feature-sets", headers=AUTH), _get(client))
    r = client.post(
        "/v1/feature-sets",
        headers=AUTH,
        files={"file": ("f.csv", features, "text/csv")},
        data={"schema": '{"numeric": ["x0"], "numeric": ["x1"]}'},
    )
    assert r.status_code == 422 and "'numeric' appears twice" in r.text, r.text
    body = b'{"feature_set_id": "a", "feature_set_id": "b", "received_labels_id": "c"}'
    r = client.post("/v1/jobs", headers=AUTH | {"Content-Type": "application/json"}, content=body)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "duplicate_key", r.text
    assert every_row(client.get("/v1/feature-sets", headers=AUTH), _get(client)) == before


def _get(client: httpx.Client) -> Any:
    return lambda path: client.get(path, headers=AUTH)
