"""The whole labels-party flow against a real server, on SQLite and on Postgres."""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from label_party.config import Settings
from tests.label_party.conftest import Server
from tests.label_party.helpers import (
    create_client,
    create_dataset,
    parquet_bytes,
    release,
    upload_labels,
)

pytestmark = pytest.mark.slow


def test_whole_flow(server: Server) -> None:
    admin = server.client()
    client_id, token = create_client(admin, name="publisher")
    client = server.client(token)
    ds = create_dataset(admin, epsilon_budget=1.0)
    assert admin.post(f"/v1/datasets/{ds}/grants", json={"client_id": client_id}).status_code == 201

    ids = [f"ex{i}" for i in range(2000)]
    labels = [float(i % 11) for i in range(2000)]
    r = upload_labels(admin, ds, ids, labels)
    assert r.status_code == 200 and r.json() == {"num_labels": 2000}

    # CSV and JSON lines are accepted too (re-upload replaces while nothing is released).
    csv = "example_id,label\n" + "\n".join(f"{i},{lab}" for i, lab in zip(ids, labels, strict=True))
    files = {"file": ("labels.csv", csv.encode(), "text/csv")}
    assert admin.post(f"/v1/datasets/{ds}/labels", files=files).json()["num_labels"] == 2000
    jsonl = "\n".join(
        json.dumps({"example_id": i, "label": v}) for i, v in zip(ids, labels, strict=True)
    )
    files = {"file": ("labels.jsonl", jsonl.encode())}
    assert admin.post(f"/v1/datasets/{ds}/labels", files=files).json()["num_labels"] == 2000

    # A finite mechanism with a private prior: ε₁ is part of the release's ε.
    r = release(client, ds, 0.1, mechanism={"name": "rr-on-bins"}, idempotency_key="k1")
    assert r.status_code == 201, r.text
    manifest = r.json()
    assert manifest["epsilon"] == 0.1 and 0 < manifest["prior_epsilon"] < 0.1
    assert manifest["mechanism"]["epsilon"] == pytest.approx(0.1 - manifest["prior_epsilon"])
    assert len(manifest["mechanism"]["matrix"]) == 11 and len(manifest["prior"]) == 11
    assert manifest["num_labels"] == 2000 and manifest["task"] == "regression"

    # Idempotent replay: same release, nothing spent.
    again = release(client, ds, 0.1, mechanism={"name": "rr-on-bins"}, idempotency_key="k1")
    assert again.status_code == 200 and again.json()["id"] == manifest["id"]
    other = release(client, ds, 0.2, mechanism={"name": "rr-on-bins"}, idempotency_key="k1")
    assert other.status_code == 409 and other.json()["error"] == "idempotency_conflict"
    # The Idempotency-Key header is the same key (a retry that sends only the header
    # must not spend twice); a header that disagrees with the body is refused.
    body = {"mechanism": {"name": "rr-on-bins"}, "epsilon": 0.1}
    by_header = client.post(
        f"/v1/datasets/{ds}/releases", json=body, headers={"Idempotency-Key": "k1"}
    )
    assert by_header.status_code == 200 and by_header.json()["id"] == manifest["id"]
    both = client.post(
        f"/v1/datasets/{ds}/releases",
        json={**body, "idempotency_key": "k1"},
        headers={"Idempotency-Key": "k2"},
    )
    assert both.status_code == 422 and both.json()["error"] == "invalid_request"
    assert client.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0.1

    # Downloads are free and byte-identical; the sha256 names the Parquet bytes.
    rid = manifest["id"]
    first = client.get(f"/v1/releases/{rid}/labels?format=parquet")
    second = client.get(f"/v1/releases/{rid}/labels")
    assert first.status_code == 200 and first.content == second.content
    assert hashlib.sha256(first.content).hexdigest() == manifest["sha256"]
    table = pq.read_table(io.BytesIO(first.content))
    assert table.column_names == ["example_id", "label"] and table.num_rows == 2000
    assert set(table.column("example_id").to_pylist()) == set(ids)
    as_json = client.get(f"/v1/releases/{rid}/labels?format=json")
    assert as_json.json()["example_id"] == table.column("example_id").to_pylist()
    assert as_json.json()["label"] == table.column("label").to_pylist()
    assert client.get(f"/v1/releases/{rid}/labels?format=json").content == as_json.content
    assert client.get(f"/v1/releases/{rid}").json() == manifest

    # Labels are frozen now.
    r = upload_labels(admin, ds, ids, labels)
    assert r.status_code == 409 and r.json()["error"] == "labels_frozen"

    # Nine more releases of 0.1 exhaust 1.0 exactly; the eleventh is refused.
    for _ in range(9):
        r = release(client, ds, 0.1)
        assert r.status_code == 201, r.text
        assert r.json()["mechanism"]["params"]  # additive: noise parameters
    budget = client.get(f"/v1/datasets/{ds}/budget").json()
    assert budget["epsilon_spent"] == 1.0 and budget["epsilon_remaining"] == 0.0
    refused = release(client, ds, 0.1)
    assert refused.status_code == 409
    body = refused.json()
    assert body["error"] == "budget_exceeded"
    assert body["detail"]["requested_epsilon"] == 0.1 and body["detail"]["remaining_epsilon"] == 0
    assert client.get(f"/v1/datasets/{ds}/budget").json() == budget

    # The audit log pages through everything, and verifies.
    entries, after = [], 0
    while True:
        page = admin.get(f"/v1/datasets/{ds}/audit", params={"after": after, "limit": 4}).json()
        assert page["entries"], "next_after led to an empty page"
        entries += page["entries"]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    actions = [e["action"] for e in entries]
    assert actions.count("release.created") == 10 and actions.count("release.refused") == 1
    assert actions.count("labels.uploaded") == 3 and "labels.refused" in actions
    assert "grant.created" in actions and actions[0] == "dataset.created"
    assert "labels.rejected" not in actions
    verify = admin.get("/v1/audit/verify").json()
    assert verify["ok"] is True and verify["entries"] >= len(entries)
    assert admin.get("/v1/audit", params={"after": 2**64}).status_code == 422

    releases = client.get(f"/v1/datasets/{ds}/releases").json()
    assert len(releases) == 10
    assert server.client(None).get("/metrics").status_code == 401
    metrics = admin.get("/metrics").text
    assert "labeldp_ledger_up 1.0" in metrics
    assert f'labeldp_epsilon_spent{{dataset_id="{ds}"}} 1.0' in metrics
    assert "labeldp_releases_total" in metrics
    assert server.client(None).get("/readyz").status_code == 200


def test_partitions_compose_per_part(server: Server) -> None:
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=1.0)
    ids = [f"e{i}" for i in range(300)]
    assert upload_labels(admin, ds, ids, [float(i % 10) for i in range(300)]).status_code == 200
    plan = parquet_bytes({"example_id": ids[:200], "part": ["a"] * 100 + ["b"] * 100})
    r = admin.post(f"/v1/datasets/{ds}/partitions", files={"file": ("plan.parquet", plan)})
    assert r.status_code == 201 and r.json()["parts"] == {"a": 100, "b": 100}
    # The same assignment again (a retry that lost its answer; any row order, any
    # format) is the plan; the same part sizes with other examples in them are not.
    same = "example_id,part\n" + "".join(
        f"{i},{'a' if int(i[1:]) < 100 else 'b'}\n" for i in reversed(ids[:200])
    )
    again = admin.post(f"/v1/datasets/{ds}/partitions", files={"file": ("plan.csv", same)})
    assert again.status_code == 200 and again.json()["id"] == r.json()["id"], again.text
    swapped = parquet_bytes({"example_id": ids[:200], "part": ["b"] * 100 + ["a"] * 100})
    other = admin.post(f"/v1/datasets/{ds}/partitions", files={"file": ("p.parquet", swapped)})
    assert other.status_code == 409 and "another partition plan" in other.json()["message"]
    actions = [e["action"] for e in admin.get(f"/v1/datasets/{ds}/audit").json()["entries"]]
    assert actions.count("partition.created") == 1

    r = release(admin, ds, 0.6, parts=["a"])
    assert r.status_code == 201 and r.json()["num_labels"] == 100
    table = pq.read_table(io.BytesIO(admin.get(f"/v1/releases/{r.json()['id']}/labels").content))
    assert set(table.column("example_id").to_pylist()) == set(ids[:100])
    assert release(admin, ds, 0.6, parts=["b"]).status_code == 201  # disjoint: allowed
    assert release(admin, ds, 0.5, parts=["a"]).status_code == 409  # a would reach 1.1
    whole = release(admin, ds, 0.5)  # touches every part
    assert whole.status_code == 409
    assert whole.json()["detail"]["remaining_epsilon"] == pytest.approx(0.4)
    assert release(admin, ds, 0.4).status_code == 201
    budget = admin.get(f"/v1/datasets/{ds}/budget").json()
    assert budget["epsilon_spent"] == 1.0
    assert {p["name"]: p["epsilon_spent"] for p in budget["parts"]} == {"a": 1.0, "b": 1.0}
    unknown = release(admin, ds, 0.1, parts=["nope"])
    assert unknown.status_code == 422
    assert unknown.json()["detail"] == {"unknown": ["nope"], "num_unknown": 1}
    many = release(admin, ds, 0.1, parts=["a", *(f"x{i:04d}" for i in range(500))]).json()
    assert len(many["detail"]["unknown"]) == 100 and many["detail"]["num_unknown"] == 500
    assert many["message"].endswith("and 480 more") and len(many["message"]) < 300
    empty = release(admin, ds, 0.1, parts=[])
    assert empty.status_code == 422 and empty.json()["detail"][0]["loc"][-1] == "parts"
    assert admin.get("/v1/audit/verify").json()["ok"] is True


def test_a_retry_replays_whatever_order_its_parts_are_listed_in(server: Server) -> None:
    """The key's fingerprint was of the body as sent, the ledger's of its parts as a
    set: a retry listing them as the manifest does (sorted), or naming the default
    loss, was refused as another request (409), and its release was lost to it."""
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=1.0)
    ids = [f"e{i}" for i in range(100)]
    assert upload_labels(admin, ds, ids, [float(i % 10) for i in range(100)]).status_code == 200
    plan = parquet_bytes({"example_id": ids, "part": ["a"] * 50 + ["b"] * 50})
    assert admin.post(f"/v1/datasets/{ds}/partitions", files={"file": ("p.parquet", plan)})
    first = release(admin, ds, 0.1, parts=["b", "a"], idempotency_key="k")
    assert first.status_code == 201, first.text
    for retry in (
        {"parts": first.json()["parts"]},
        {"parts": ["a", "b", "a"]},
        {"parts": ["b", "a"], "mechanism": {"name": "laplace", "loss": "squared"}},
    ):
        again = release(admin, ds, 0.1, idempotency_key="k", **retry)
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"], retry
    for other in ({"parts": ["a"]}, {"parts": ["a", "b"], "mechanism": {"name": "staircase"}}):
        r = release(admin, ds, 0.1, idempotency_key="k", **other)
        assert r.status_code == 409 and r.json()["error"] == "idempotency_conflict", other
    assert release(admin, ds, "0.10", idempotency_key="k", parts=["a", "b"]).status_code == 200
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0.1


def test_a_key_tells_apart_two_epsilons_that_one_double_stands_for(server: Server) -> None:
    """The fingerprint hashed ε as a JSON double: 100000.000000000003 replayed the
    release charged 100000.000000000001, though the ledger tells them apart."""
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=300_000)
    assert upload_labels(admin, ds, ["a", "b"], [0.0, 1.0]).status_code == 200
    first = release(admin, ds, "100000.000000000001", idempotency_key="k")
    assert first.status_code == 201, first.text
    other = release(admin, ds, "100000.000000000003", idempotency_key="k")
    assert other.status_code == 409 and other.json()["error"] == "idempotency_conflict"
    assert release(admin, ds, "100000.000000000001", idempotency_key="k").status_code == 200


def test_classification_releases(server: Server) -> None:
    admin = server.client()
    ds = create_dataset(
        admin, task="classification", domain={"classes": ["cat", "dog", "emu"]}, epsilon_budget=5
    )
    # Where the domain names its classes, text labels are names (a CSV's "1" too),
    # and indices are numbers (JSON lines, Parquet), as the walkthrough says.
    csv_index = b"example_id,label\ne0,1\n"
    r = admin.post(f"/v1/datasets/{ds}/labels", files={"file": ("l.csv", csv_index)})
    assert r.status_code == 422 and r.json()["detail"]["rows"][0]["reason"] == "unknown class"
    jsonl = b'{"example_id": "e0", "label": 1}\n{"example_id": "e1", "label": 2}\n'
    assert admin.post(f"/v1/datasets/{ds}/labels", files={"file": ("l.jsonl", jsonl)}).is_success
    mixed = jsonl.replace(b"2}", b'"emu"}')  # a column with text is text: 1 is no name
    r = admin.post(f"/v1/datasets/{ds}/labels", files={"file": ("l.jsonl", mixed)})
    assert r.status_code == 422 and r.json()["detail"]["rows"] == [
        {"row": 1, "reason": "unknown class"}
    ]
    ids = [f"e{i}" for i in range(600)]
    names = [["cat", "dog", "emu"][i % 3] for i in range(600)]
    assert upload_labels(admin, ds, ids, names).status_code == 200
    r = release(admin, ds, 1.0, mechanism={"name": "rr"})
    assert r.status_code == 201, r.text
    labels = pq.read_table(io.BytesIO(admin.get(f"/v1/releases/{r.json()['id']}/labels").content))
    assert set(labels.column("label").to_pylist()) <= {0.0, 1.0, 2.0}
    # Given by its parameters, not its K×K matrix; its outputs say K to features
    # parties that read it there.
    described = r.json()["mechanism"]
    assert described["matrix"] is None and described["outputs"] == [0, 1, 2]
    assert described["params"]["num_classes"] == 3
    r = release(admin, ds, 1.0, mechanism={"name": "rr-with-prior"}, prior_epsilon=0.25)
    assert r.status_code == 201, r.text
    assert r.json()["mechanism"]["outputs"] == [0, 1, 2] and r.json()["mechanism"]["matrix"] is None
    assert r.json()["prior_epsilon"] == 0.25 and r.json()["mechanism"]["epsilon"] == 0.75
    assert r.json()["task"] == "classification"
    # A mechanism runs at the double not above its charge: float("19.900000004948")
    # is above it, and randomized response ran at it (helper-69).
    wide = create_dataset(admin, task="classification", domain={"num_classes": 3},
                          epsilon_budget=20)  # fmt: skip
    assert upload_labels(admin, wide, ids, [i % 3 for i in range(600)]).status_code == 200
    r = release(admin, wide, "19.900000004948", mechanism={"name": "rr"})
    assert r.status_code == 201, r.text
    assert Fraction(r.json()["mechanism"]["epsilon"]) <= Fraction("19.900000004948")
    wrong = release(admin, ds, 1.0, mechanism={"name": "laplace"})
    assert wrong.status_code == 422
    bad = upload_labels(
        admin,
        create_dataset(admin, task="classification", domain={"num_classes": 3}),
        ["a", "b"],
        [1, 7],
    )
    assert bad.status_code == 422
    assert bad.json()["detail"]["rows"] == [{"row": 2, "reason": "unknown class"}]


def test_upload_limits_and_errors(make_server: object) -> None:
    server: Server = make_server(LABELDP_MAX_UPLOAD_BYTES="2000").start()  # type: ignore[operator]
    admin = server.client()
    ds = create_dataset(admin)
    big = "example_id,label\n" + "\n".join(f"e{i},1" for i in range(1000))
    r = admin.post(f"/v1/datasets/{ds}/labels", files={"file": ("l.csv", big.encode())})
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="l.csv"\r\n\r\n'
        yield b"example_id,label\n"
        for i in range(300):
            yield f"e{i},1\n".encode()
        yield b"\r\n--b--\r\n"

    r = admin.post(
        f"/v1/datasets/{ds}/labels",
        content=chunked(),
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    r = admin.post(f"/v1/datasets/{ds}/labels", files={"file": ("l.xlsx", b"x")})
    # It names every format the service reads, as the docs do.
    assert r.status_code == 422
    assert all(kind in r.json()["message"] for kind in (".txt", ".ndjson", ".json", "text/csv"))
    r = admin.post(f"/v1/datasets/{ds}/labels", files={"file": ("l.csv", b"example_id,label\na,x")})
    assert r.status_code == 422 and r.json()["detail"]["rows"][0]["row"] == 1
    audit = admin.get(f"/v1/datasets/{ds}/audit").json()["entries"]
    assert audit[-1]["action"] == "labels.rejected" and "x" not in str(audit[-1]["payload"])
    assert admin.get("/v1/datasets/nope").status_code == 404
    assert admin.post("/v1/datasets", json={"name": "x"}).status_code == 422
    r = admin.post(
        "/v1/datasets/" + ds + "/releases", json={"mechanism": {"name": "laplace"}, "epsilon": 0.1}
    )
    assert r.status_code == 409  # no labels yet
    for r in (admin.get("/v1/datasets/nope"), admin.post("/v1/datasets", json={})):
        assert set(r.json()) == {"error", "message", "detail"}


def test_replaced_labels_are_deleted_once_the_new_ones_commit(server: Server) -> None:
    """Replacing raw labels (a correction, a deletion request) must not leave the
    old ones on disk, not even set aside in orphans/."""
    admin = server.client()
    ds = create_dataset(admin)
    labels_dir = Path(server.env["LABELDP_DATA_DIR"]) / "labels" / ds
    ids = [f"e{i}" for i in range(50)]
    assert upload_labels(admin, ds, ids, [1.0] * 50).status_code == 200
    (first,) = labels_dir.iterdir()
    assert upload_labels(admin, ds, ids, [1.0] * 50).status_code == 200  # the same: kept
    assert list(labels_dir.iterdir()) == [first]
    assert upload_labels(admin, ds, ids, [2.0] * 50).status_code == 200
    (second,) = labels_dir.iterdir()
    assert second != first and not first.exists()
    orphans = Path(server.env["LABELDP_DATA_DIR"]) / "orphans"
    assert not any(orphans.rglob(first.name))
    r = admin.post(f"/v1/datasets/{ds}/releases", json={"mechanism": {"name": "laplace"},
                                                        "epsilon": 0.1})  # fmt: skip
    assert r.status_code == 201, r.text


def test_labels_published_again_are_not_deleted_by_the_upload_they_replaced(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upload B replaced A and deleted A's file after its commit; an upload of A
    that committed in between (same content, same file) lost its file, and the
    next release failed (helper-72, with an injected delay). Here that upload of
    A is made to commit exactly there."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    from label_party.labels import service as labels_service
    from label_party.ledger.service import lock_dataset

    admin = server.client()
    ds = create_dataset(admin)
    labels_dir = Path(server.env["LABELDP_DATA_DIR"]) / "labels" / ds
    assert upload_labels(admin, ds, ["a", "b"], [1.0, 2.0]).status_code == 200
    (first,) = labels_dir.iterdir()
    real = labels_service.delete_after_commit

    def racing(session: Session, path: Path, what: str, **options: Any) -> None:
        def upload_a_again(committed: Session) -> None:
            with Session(committed.get_bind()) as other, other.begin():
                lock_dataset(other, ds).labels_sha256 = first.stem

        event.listen(session, "after_commit", upload_a_again, once=True)  # before the delete
        real(session, path, what, **options)

    monkeypatch.setattr(labels_service, "delete_after_commit", racing)
    assert upload_labels(admin, ds, ["a", "b"], [3.0, 4.0]).status_code == 200
    assert first.is_file()
    r = release(admin, ds, 0.1)
    assert r.status_code == 201, r.text


def test_json_bodies_are_bounded_and_anonymous_bodies_are_refused_first(
    make_server: object,
) -> None:
    """A JSON body is parsed whole in memory: it has its own, smaller bound than an
    upload, also when it calls itself multipart. A body without a known token is 401
    before it is read (FastAPI would parse it before resolving authentication)."""
    server: Server = make_server(  # type: ignore[operator]
        LABELDP_MAX_JSON_BYTES="1000", LABELDP_MAX_UPLOAD_BYTES="10000"
    ).start()
    admin = server.client()
    ds = create_dataset(admin)
    big = {"mechanism": {"name": "laplace"}, "epsilon": 0.1, "parts": ["p" * 100] * 20}
    anonymous = server.client(token=None)
    r = anonymous.post(f"/v1/datasets/{ds}/releases", json=big)
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"
    # Any token used to be enough to be read; now it must be one the service knows
    # (past the upload bound: a body that was read would be 413).
    huge_upload = {"files": {"file": ("l.csv", "example_id,label\n" + "e,1\n" * 5000)}}
    r = server.client(token="made-up").post(f"/v1/datasets/{ds}/labels", **huge_upload)
    assert r.status_code == 401 and r.json()["message"] == "unknown or revoked token", r.text
    # Multipart on a JSON route: FastAPI would read it whole, up to the upload bound.
    fake_form = {"files": {"file": ("x", b"x" * 5000)}}
    r = admin.post(f"/v1/datasets/{ds}/releases", **fake_form)  # type: ignore[arg-type]
    assert r.status_code == 413 and r.json()["detail"] == {"limit": 1000}, r.text
    r = admin.post(f"/v1/datasets/{ds}/releases", json=big)
    assert r.status_code == 413 and r.json()["detail"] == {"limit": 1000}

    def chunked() -> Iterator[bytes]:  # no Content-Length: read up to the bound
        body = json.dumps(big).encode()
        yield from (body[i : i + 100] for i in range(0, len(body), 100))

    headers = {"content-type": "application/json"}
    r = admin.post(f"/v1/datasets/{ds}/releases", content=chunked(), headers=headers)
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    # A small chunked body is read and handed on whole.
    small = json.dumps({"mechanism": {"name": "laplace"}, "epsilon": 0.1}).encode()
    r = admin.post(f"/v1/datasets/{ds}/releases", content=iter([small[:10], small[10:]]),
                   headers=headers)  # fmt: skip
    assert r.status_code == 409 and "no labels" in r.json()["message"], r.text
    # Uploads keep the upload bound, far above the JSON one.
    ids = [f"e{i}" for i in range(200)]
    assert upload_labels(admin, ds, ids, [1.0] * 200).status_code == 200
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0


def test_non_finite_and_huge_amounts_say_what_is_wrong(server: Server) -> None:
    admin = server.client()
    headers = {"content-type": "application/json"}
    preview = {"mechanism": "rr", "epsilon": float("nan"), "values": [0, 1], "prior": [0.5, 0.5]}
    r = admin.post("/v1/mechanisms/preview", content=json.dumps(preview), headers=headers)
    assert r.status_code == 422 and "finite" in json.dumps(r.json()["detail"])
    auto = {"mechanism": "auto", "loss": "absolute", "epsilon": 1, "values": [0, 1, 2],
            "prior": [0.2, 0.5, 0.3]}  # fmt: skip
    chosen = admin.post("/v1/mechanisms/preview", json=auto).json()
    assert chosen["selected"] == "rr-on-bins" and "absolute loss" in chosen["params"]["reason"]
    body = {"name": "x", "task": "regression", "label_domain": {"min": 0, "max": 1},
            "epsilon_budget": 1e7}  # fmt: skip
    r = admin.post("/v1/datasets", json=body)
    assert r.status_code == 422 and "at most 4611686.018427" in r.json()["message"]
    # The stated maximum, sent back as a JSON number, is a budget the ledger holds.
    stated = float(r.json()["message"].rsplit("at most ", 1)[1].split()[0])
    # Text that only Python reads as a number is no amount: "1_0" spent ε = 10.
    ds = create_dataset(admin, epsilon_budget=20)
    assert upload_labels(admin, ds, ["a", "b"], [0.0, 1.0]).status_code == 200
    for spelling in ("1_0", "\u0661", " 0.1 ", "+0.1", ".5", "NaN"):
        r = release(admin, ds, spelling)
        assert r.status_code == 422 and "spelled as one" in r.text, (spelling, r.text)
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0
    assert release(admin, ds, "1e-1").status_code == 201
    r = admin.post("/v1/datasets", json={**body, "epsilon_budget": stated})
    assert r.status_code == 201, r.text


def test_a_prior_epsilon_the_ledger_cannot_hold_is_refused_before_any_label_is_read(
    server: Server,
) -> None:
    """A ``prior_epsilon`` with 13 decimals was checked when the release row was
    written: after the labels were randomized and their file published, so each
    such request left a label-derived file behind for free (helper-69)."""
    admin = server.client()
    ds = create_dataset(admin, domain={"min": 0, "max": 4, "grid_size": 5})
    assert upload_labels(admin, ds, ["a", "b", "c"], [0.0, 2.0, 4.0]).status_code == 200
    before = set(server.settings.releases_dir.glob("*"))  # the server's other tests'
    r = release(admin, ds, "1", mechanism={"name": "rr-on-bins"}, prior_epsilon="0.1000000000001")
    assert set(server.settings.releases_dir.glob("*")) == before
    assert r.status_code == 422 and "prior_epsilon has more than 12" in r.json()["message"], r.text
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0


def test_text_that_is_not_valid_unicode_is_refused_not_a_500(server: Server) -> None:
    """A lone surrogate (JSON's "\\ud800") in a class name failed the answer's
    serialization and in a prior id the database driver: two 500s (helper-70)."""
    admin = server.client()
    headers = {"content-type": "application/json"}
    for classes in ('["\\ud800", "b"]', '["", "b"]', f'["{"x" * 201}", "b"]'):
        body = ('{"name": "x", "task": "classification", "label_domain": {"classes": '
                f'{classes}}}, "epsilon_budget": 1}}')  # fmt: skip
        r = admin.post("/v1/datasets", content=body, headers=headers)
        assert r.status_code == 422 and "class name" in r.text, (classes, r.text)
    ds = create_dataset(admin, task="classification", domain={"num_classes": 3})
    assert upload_labels(admin, ds, ["a", "b"], [0, 1]).status_code == 200
    body = ('{"mechanism": {"name": "rr-with-prior", "prior_source": "groups", '
            '"prior_id": "\\ud800"}, "epsilon": 0.1}')  # fmt: skip
    r = admin.post(f"/v1/datasets/{ds}/releases", content=body, headers=headers)
    assert r.status_code == 422, r.text
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0
    # A NUL: taken on SQLite, refused on Postgres with an error logged as a bug.
    nul = {"name": "a\x00b", "task": "regression", "label_domain": {"min": 0, "max": 1},
           "epsilon_budget": 1}  # fmt: skip
    assert admin.post("/v1/datasets", json=nul).status_code == 422
    assert admin.post("/v1/clients", json={"name": "a\x00b", "role": "client"}).status_code == 422
    r = release(admin, ds, 0.1, mechanism={"name": "rr"}, idempotency_key="k\x00")
    assert r.status_code == 422, r.text


def test_a_domain_whose_noise_overflows_a_float_is_refused_free(server: Server) -> None:
    """[−1.7e308, 1.7e308] passed (finite ends) and its releases were charged and
    all ±inf/NaN; a finite width whose noise at a small ε overflows is refused
    before anything is reserved."""
    admin = server.client()
    body = {"name": "x", "task": "regression", "label_domain": {"min": -1.7e308, "max": 1.7e308},
            "epsilon_budget": 1}  # fmt: skip
    r = admin.post("/v1/datasets", json=body)
    assert r.status_code == 422 and "max − min" in r.text, r.text
    ds = create_dataset(admin, domain={"min": 0, "max": 1e306})
    assert upload_labels(admin, ds, ["a", "b"], [1.0, 2.0]).status_code == 200
    for mechanism in ("laplace", "staircase", "exponential"):
        r = release(admin, ds, 0.01, mechanism={"name": mechanism})
        assert r.status_code == 422 and "overflows" in r.json()["message"], r.text
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0
    # debiased-rr's outputs reached ±inf on a wide domain: charged, and released ±Infinity.
    wide = create_dataset(admin, domain={"min": -1e307, "max": 1e307})  # 101 values
    assert upload_labels(admin, wide, ["a", "b", "c"], [-1e307, 0.0, 1e307]).status_code == 200
    r = release(admin, wide, 1, mechanism={"name": "debiased-rr"})
    assert r.status_code == 422 and "overflow" in r.json()["message"], r.text
    assert admin.get(f"/v1/datasets/{wide}/budget").json()["epsilon_spent"] == 0
    # Two 500s: a step so small that its count overflows, a preview whose loss does.
    tiny = {**body, "label_domain": {"min": 0, "max": 1, "step": 1e-320}}
    r = admin.post("/v1/datasets", json=tiny)
    assert r.status_code == 422 and "100,000 steps" in r.text, r.text
    # A domain so narrow that its lattice step underflowed: additive releases gave
    # every label exactly, NaN for min and min for max (helper-86).
    narrow = {**body, "label_domain": {"min": 0, "max": 1e-320}}
    r = admin.post("/v1/datasets", json=narrow)
    assert r.status_code == 422 and "narrower than the mechanisms" in r.text, r.text
    r = admin.post("/v1/mechanisms/preview", json={"mechanism": "laplace", "epsilon": 1,
                   "values": [0, 1e-320], "prior": [0.5, 0.5]})  # fmt: skip
    assert r.status_code == 422 and "narrower than" in r.json()["message"], r.text
    preview = {"mechanism": "exponential", "epsilon": 1, "values": [0, 1e300],
               "prior": [0.5, 0.5]}  # fmt: skip
    r = admin.post("/v1/mechanisms/preview", json=preview)
    assert r.status_code == 422 and r.json()["error"] == "invalid_mechanism", r.text
    # A loss that numpy took to inf without raising was answered as a null number.
    for mechanism, top in (("rr-on-bins", 1e308), ("debiased-rr", 1e200)):
        overflowing = {"mechanism": mechanism, "epsilon": 1, "values": [0, top],
                       "prior": [0.5, 0.5]}  # fmt: skip
        r = admin.post("/v1/mechanisms/preview", json=overflowing)
        assert r.status_code == 422 and r.json()["error"] == "invalid_mechanism", r.text
    assert "not finite" in r.json()["message"]  # (the first warns here: tests raise warnings)
    # Outputs ≤ 0 have no Poisson loss: undefined (null), not an overflow, and the
    # mechanism auto picks for the Poisson loss could not be previewed with it.
    for mechanism in ("laplace", "auto"):
        body = {"mechanism": mechanism, "epsilon": 1, "values": [0, 1, 2, 3],
                "prior": [0.4, 0.3, 0.2, 0.1], "loss": "poisson"}  # fmt: skip
        r = admin.post("/v1/mechanisms/preview", json=body)
        assert r.status_code == 200 and r.json()["noisy_label_loss"] is None, r.text
        assert r.json()["max_abs_bias"] < 1e-9


def test_a_domain_whose_kind_is_not_the_task_s_is_refused(server: Server) -> None:
    """``kind`` was dropped before validation: a regression dataset declared with a
    classification domain's kind was created as if the kind were absent."""
    admin = server.client()
    for task, domain in (
        ("regression", {"kind": "classification", "min": 0, "max": 1}),
        ("classification", {"kind": "regression", "num_classes": 3}),
    ):
        body = {"name": "x", "task": task, "label_domain": domain, "epsilon_budget": 1}
        r = admin.post("/v1/datasets", json=body)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["kind"], r.text
        agreeing = {**domain, "kind": task}
        assert (
            admin.post("/v1/datasets", json={**body, "label_domain": agreeing}).status_code == 201
        )


def test_previews_are_bounded_in_size_and_in_number_at_once(make_server: Any) -> None:
    """Any token, an auditor's too, could fit rr-on-bins over 100,000 values, four at
    a time: 18.7 GB. A preview takes at most a dataset's largest grid, and
    LABELDP_MAX_CONCURRENT_PREVIEWS fits at once."""
    server = make_server(LABELDP_MAX_CONCURRENT_PREVIEWS="1").start()
    admin = server.client()
    _, auditor_token = create_client(admin, role="auditor")
    auditor = server.client(auditor_token)
    k = 10_002
    too_many = {"mechanism": "rr-on-bins", "epsilon": 1, "values": list(range(k)),
                "prior": [1 / k] * k}  # fmt: skip
    r = auditor.post("/v1/mechanisms/preview", json=too_many)
    assert r.status_code == 422 and "at most 10001 values" in r.json()["message"], r.text
    k = 10_001
    largest = {**too_many, "values": list(range(k)), "prior": [1 / k] * k}
    # Four at once, each fit taking seconds: one holds the only slot, others are told to wait.
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: auditor.post("/v1/mechanisms/preview", json=largest),
                                range(4)))  # fmt: skip
    statuses = sorted(a.status_code for a in answers)
    assert statuses[0] == 200 and statuses[-1] == 429 and set(statuses) == {200, 429}, statuses
    busy = next(a for a in answers if a.status_code == 429)
    assert busy.json()["error"] == "busy" and busy.headers["Retry-After"] == "5"
    assert auditor.post("/v1/mechanisms/preview", json=largest).status_code == 200  # free again


def test_a_preview_fit_is_bounded_in_time(make_server: Any) -> None:
    """The unbiased LP over a few thousand values ran for minutes, holding a preview
    slot; past LABELDP_PREVIEW_SECONDS it is given up (422) and the slot is free."""
    server = make_server(LABELDP_MAX_CONCURRENT_PREVIEWS="1", LABELDP_PREVIEW_SECONDS="0.3").start()
    admin = server.client()
    k = 1000  # about 7 s on 2 cores
    slow = {"mechanism": "unbiased", "epsilon": 1, "values": list(range(k)), "prior": [1 / k] * k}
    r = admin.post("/v1/mechanisms/preview", json=slow)
    assert r.status_code == 422 and r.json()["error"] == "invalid_mechanism", r.text
    assert "time allowed" in r.json()["message"]
    quick = {**slow, "values": list(range(8)), "prior": [1 / 8] * 8}
    assert admin.post("/v1/mechanisms/preview", json=quick).status_code == 200


def test_metrics_still_count_when_the_ledger_cannot_be_read(tmp_path: Path) -> None:
    from label_party.db import connect
    from label_party.observability import scrape

    db = connect(f"sqlite:///{tmp_path / 'missing' / 'ledger.sqlite3'}")  # no such directory
    try:
        text = scrape(db).decode()
    finally:
        db.dispose()
    assert "labeldp_ledger_up 0.0" in text and "labeldp_requests_total" in text
    assert "labeldp_epsilon_spent{" not in text


def test_metrics_read_the_ledger_of_their_own_app(tmp_path: Path) -> None:
    """Two labels parties in one process (as in tests, or an embedding app): each
    /metrics reports its own ledger, also after the other one stopped (a collector
    shared by the process used to read whichever database started last, and
    leaked connections of it once it was disposed)."""
    import asyncio

    import httpx

    from label_party.app import create_app
    from label_party.config import Settings

    token = "metrics-admin-" + "y" * 24
    a, b = (create_app(Settings(mode="test", data_dir=tmp_path / name, admin_token=token))
            for name in ("a", "b"))  # fmt: skip

    def client(app: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://lp",
                                 headers={"Authorization": f"Bearer {token}"})  # fmt: skip

    async def scenario() -> None:
        async with a.router.lifespan_context(a), client(a) as first:
            body = {"name": "m", "task": "classification", "label_domain": {"num_classes": 2},
                    "epsilon_budget": 1.0}  # fmt: skip
            created = await first.post("/v1/datasets", json=body)
            assert created.status_code == 201, created.text
            gauge = f'labeldp_epsilon_spent{{dataset_id="{created.json()["id"]}"}} 0.0'
            async with b.router.lifespan_context(b), client(b) as second:
                assert gauge not in (await second.get("/metrics")).text
                assert gauge in (await first.get("/metrics")).text
            assert gauge in (await first.get("/metrics")).text

    asyncio.run(scenario())


def test_the_release_list_comes_a_page_at_a_time(server: Server) -> None:
    """It returned every release in one answer; now pages of ``limit`` linked by
    ``Link: rel="next"``, oldest first, none missed or repeated."""
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=10)
    assert upload_labels(admin, ds, ["a", "b"], [1.0, 2.0]).status_code == 200
    made = [release(admin, ds, 0.1).json()["id"] for _ in range(5)]
    seen: list[str] = []
    url: str | None = f"/v1/datasets/{ds}/releases?limit=2"
    pages = 0
    while url is not None:
        r = admin.get(url)
        assert r.status_code == 200, r.text
        seen += [m["id"] for m in r.json()]
        pages += 1
        link = r.headers.get("link")
        url = link.split(">")[0].lstrip("<") if link else None
    assert (seen, pages) == (made, 3)
    assert [m["id"] for m in admin.get(f"/v1/datasets/{ds}/releases").json()] == made
    r = admin.get(f"/v1/datasets/{ds}/releases", params={"after": "no-such-release"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_request"
    assert admin.get(f"/v1/datasets/{ds}/releases", params={"limit": 0}).status_code == 422


def test_a_release_whose_file_was_lost_says_so(server: Server) -> None:
    """A download whose file an operator removed failed with an anonymous 500 (or
    cut its streamed JSON short); it names the file to restore."""
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=3)
    assert upload_labels(admin, ds, ["a", "b", "c"], [1.0, 2.0, 3.0]).status_code == 200
    made = release(admin, ds, 1)
    assert made.status_code == 201, made.text
    (server.settings.releases_dir / f"{made.json()['sha256']}.parquet").unlink()
    for fmt in ("parquet", "json"):
        r = admin.get(f"/v1/releases/{made.json()['id']}/labels?format={fmt}")
        assert r.status_code == 500 and r.json()["error"] == "file_missing", r.text
        assert f"releases/{made.json()['sha256']}.parquet" in r.json()["message"]
    # The labels' file lost (two uploads that alternated could unlink it; helper-72):
    # a release said 500 internal_error; it names the file, and charges nothing.
    spent = admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"]
    for lost in (server.settings.labels_dir / ds).glob("*.parquet"):
        lost.unlink()
    r = release(admin, ds, 1)
    assert r.status_code == 500 and r.json()["error"] == "file_missing", r.text
    assert f"labels/{ds}/" in r.json()["message"]
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == spent
    # A prior set counts its ids against the labels' (a bare 500 too; helper-75).
    classes = create_dataset(admin, task="classification", domain={"num_classes": 2})
    assert upload_labels(admin, classes, ["a", "b"], [0, 1]).status_code == 200
    for lost in (server.settings.labels_dir / classes).glob("*.parquet"):
        lost.unlink()
    groups = b"example_id,group\na,x\nb,y\n"
    r = admin.post(f"/v1/datasets/{classes}/priors", files={"file": ("g.csv", groups)},
                   data={"kind": "groups"})  # fmt: skip
    assert r.status_code == 500 and r.json()["error"] == "file_missing", r.text
    # A partition plan's file: a release of its parts and the plan sent again were
    # anonymous 500s from pyarrow (helper-85); they name the file and charge nothing.
    parted = create_dataset(admin, epsilon_budget=3)
    assert upload_labels(admin, parted, ["a", "b"], [1.0, 2.0]).status_code == 200
    plan = b"example_id,part\na,A\nb,B\n"
    r = admin.post(f"/v1/datasets/{parted}/partitions", files={"file": ("p.csv", plan)})
    assert r.status_code == 201, r.text
    for lost in (server.settings.partitions_dir / parted).glob("*.parquet"):
        lost.unlink()
    r = release(admin, parted, 1, parts=["A"])
    assert r.status_code == 500 and r.json()["error"] == "file_missing", r.text
    assert f"partitions/{parted}/" in r.json()["message"]
    r = admin.post(f"/v1/datasets/{parted}/partitions", files={"file": ("p.csv", plan)})
    assert r.status_code == 500 and r.json()["error"] == "file_missing", r.text
    assert admin.get(f"/v1/datasets/{parted}/budget").json()["epsilon_spent"] == 0


def test_a_domain_larger_than_the_operator_allows_names_the_setting(server: Server) -> None:
    """Domains took up to 100,000 classes and LABELDP_MAX_GRID_SIZE (10,001) then
    refused 10,002 of them as "the label grid has more than 10001 values", naming
    neither classes nor the setting; a setting above 100,000 did nothing (helper-70)."""
    admin = server.client()
    r = admin.post("/v1/datasets", json={"name": "wide", "task": "classification",
                                         "label_domain": {"num_classes": 10_002},
                                         "epsilon_budget": 1})  # fmt: skip
    assert r.status_code == 422, r.text
    assert r.json()["message"] == (
        "the label domain has 10002 classes; this service takes at most 10001 "
        "(LABELDP_MAX_GRID_SIZE)"
    )
    with pytest.raises(ValidationError, match="less than or equal to 100000"):
        Settings(mode="dev", max_grid_size=100_001)


def test_a_release_whose_fit_runs_past_its_time_is_refused_for_free(
    make_server: Callable[..., Server],
) -> None:
    """The fit had no time limit: an unbiased LP of mesh 65,536 ran for more than
    12 minutes, and its locked fit would have held SQLite's write lock as long
    (helper-86). Its free check stops at LABELDP_RELEASE_FIT_SECONDS."""
    admin = make_server(LABELDP_RELEASE_FIT_SECONDS="1").start().client()
    ds = create_dataset(admin, domain={"min": 0, "max": 1000, "step": 1})
    assert upload_labels(admin, ds, ["a", "b"], [1.0, 2.0]).status_code == 200
    started = time.monotonic()
    r = release(admin, ds, 1, mechanism={"name": "unbiased", "mesh": 65536})
    assert r.status_code == 422 and "LABELDP_RELEASE_FIT_SECONDS" in r.json()["message"], r.text
    assert time.monotonic() - started < 120
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0
    assert release(admin, ds, 1).status_code == 201  # the dataset is not held
