"""Every role against every endpoint (admin, granted client, other client, auditor,
anonymous), and the rules behind the table: clients see only granted datasets and
their own releases, auditors read budgets and audit only, nobody reads raw labels."""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from label_party.auth import Principal, confirm
from label_party.db import connect, transaction
from label_party.example_priors import service as priors
from label_party.exceptions import UnauthorizedError
from label_party.partitions import service as partitions
from label_party.releases import service as releases
from label_party.trainings import service as trainings
from label_party.trainings.schemas import TrainingSpec
from shared.protocol import ReleaseCreate
from tests.label_party.conftest import Server
from tests.label_party.helpers import (
    create_client,
    create_dataset,
    parquet_bytes,
    release,
    upload_labels,
)

pytestmark = pytest.mark.slow

ROLES = ("anonymous", "auditor", "other", "client", "admin")  # the order requests are made in


def test_role_endpoint_matrix(server: Server) -> None:
    admin = server.client()
    client_id, client_token = create_client(admin, "client", "granted")
    _other_id, other_token = create_client(admin, "client", "other")
    _auditor_id, auditor_token = create_client(admin, "auditor", "auditor")
    spare_id, _ = create_client(admin, "client", "spare")
    victim_id, _ = create_client(admin, "client", "to-revoke")
    ds = create_dataset(admin, epsilon_budget=10)
    assert admin.post(f"/v1/datasets/{ds}/grants", json={"client_id": client_id}).status_code == 201
    unknown = admin.post(f"/v1/datasets/{ds}/grants", json={"client_id": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"] == "not_found"
    ids = [f"e{i}" for i in range(50)]
    assert upload_labels(admin, ds, ids, [1.0] * 50).status_code == 200
    clients = {
        "anonymous": server.client(None),
        "auditor": server.client(auditor_token),
        "other": server.client(other_token),
        "client": server.client(client_token),
        "admin": admin,
    }
    own = release(clients["client"], ds).json()["id"]
    admins = release(admin, ds).json()["id"]
    plan = parquet_bytes({"example_id": ids, "part": ["p"] * 50})
    labels_file = parquet_bytes({"example_id": ["z"], "label": [1.0]})
    preview = {"mechanism": "rr", "epsilon": 1, "values": [0, 1], "prior": [0.5, 0.5]}

    # (method, path, kwargs, {role: status}); roles missing from the dict expect 401/403.
    N, F = 404, 403
    matrix: list[tuple[str, str, dict[str, Any], dict[str, int]]] = [
        (
            "POST",
            "/v1/datasets",
            {
                "json": {
                    "name": "n",
                    "task": "regression",
                    "label_domain": {"min": 0, "max": 1},
                    "epsilon_budget": 1,
                }
            },
            {"auditor": F, "other": F, "client": F, "admin": 201},
        ),
        ("GET", "/v1/datasets", {}, {"auditor": F, "other": 200, "client": 200, "admin": 200}),
        ("GET", f"/v1/datasets/{ds}", {}, {"auditor": F, "other": N, "client": 200, "admin": 200}),
        (
            "POST",
            f"/v1/datasets/{ds}/labels",
            {"files": {"file": ("l.parquet", labels_file)}},
            {"auditor": F, "other": F, "client": F, "admin": 409},
        ),
        ("GET", f"/v1/datasets/{ds}/labels", {}, {r: 405 for r in ROLES}),
        (
            "POST",
            f"/v1/datasets/{ds}/partitions",
            {"files": {"file": ("p.parquet", plan)}},
            # The admin sends the same assignment again: the registered plan (200).
            {"auditor": F, "other": N, "client": 201, "admin": 200},
        ),
        (
            "GET",
            f"/v1/datasets/{ds}/partitions",
            {},
            {"auditor": F, "other": N, "client": 200, "admin": 200},
        ),
        (
            "GET",
            f"/v1/datasets/{ds}/budget",
            {},
            {"auditor": 200, "other": N, "client": 200, "admin": 200},
        ),
        (
            "POST",
            f"/v1/datasets/{ds}/releases",
            {"json": {"mechanism": {"name": "laplace"}, "epsilon": 0.1}},
            {"auditor": F, "other": N, "client": 201, "admin": 201},
        ),
        (
            "GET",
            f"/v1/datasets/{ds}/releases",
            {},
            {"auditor": F, "other": N, "client": 200, "admin": 200},
        ),
        ("GET", f"/v1/releases/{own}", {}, {"auditor": F, "other": N, "client": 200, "admin": 200}),
        (
            "GET",
            f"/v1/releases/{admins}",
            {},
            {"auditor": F, "other": N, "client": N, "admin": 200},
        ),
        (
            "GET",
            f"/v1/releases/{own}/labels",
            {},
            {"auditor": F, "other": N, "client": 200, "admin": 200},
        ),
        (
            "GET",
            f"/v1/releases/{admins}/labels",
            {},
            {"auditor": F, "other": N, "client": N, "admin": 200},
        ),
        (
            "GET",
            f"/v1/datasets/{ds}/audit",
            {},
            {"auditor": 200, "other": F, "client": F, "admin": 200},
        ),
        ("GET", "/v1/audit/verify", {}, {"auditor": 200, "other": F, "client": F, "admin": 200}),
        ("GET", "/v1/audit", {}, {"auditor": 200, "other": F, "client": F, "admin": 200}),
        (
            "POST",
            "/v1/clients",
            {"json": {"name": "x", "role": "client"}},
            {"auditor": F, "other": F, "client": F, "admin": 201},
        ),
        (
            "POST",
            f"/v1/datasets/{ds}/grants",
            {"json": {"client_id": spare_id}},
            {"auditor": F, "other": F, "client": F, "admin": 201},
        ),
        (
            "DELETE",
            f"/v1/clients/{victim_id}",
            {},
            {"auditor": F, "other": F, "client": F, "admin": 200},
        ),
        (
            "POST",
            "/v1/mechanisms/preview",
            {"json": preview},
            {"auditor": 200, "other": 200, "client": 200, "admin": 200},
        ),
        ("GET", "/healthz", {}, {r: 200 for r in ROLES}),
        ("GET", "/readyz", {}, {r: 200 for r in ROLES}),
        # Every dataset id and its spend: not for clients, nor for anyone without a token.
        ("GET", "/metrics", {}, {"admin": 200, "auditor": 200, "client": F, "other": F}),
    ]
    failures = []
    for method, path, kwargs, expected in matrix:
        for role in ROLES:
            want = expected.get(role, 401 if role == "anonymous" else 403)
            got = clients[role].request(method, path, **kwargs)
            if got.status_code != want:
                failures.append(f"{role:9} {method} {path}: {got.status_code} != {want}")
            elif got.status_code >= 400 and got.status_code != 405:
                assert set(got.json()) == {"error", "message", "detail"}
    assert not failures, "\n".join(failures)

    # Listing shows a client only what it was granted, and only its own releases.
    assert [d["id"] for d in clients["client"].get("/v1/datasets").json()] == [ds]
    assert clients["other"].get("/v1/datasets").json() == []
    mine = clients["client"].get(f"/v1/datasets/{ds}/releases").json()
    assert own in {r["id"] for r in mine} and admins not in {r["id"] for r in mine}
    # A revoked token no longer works.
    assert victim_id
    revoked_id, revoked_token = create_client(admin, "client", "revoked")
    assert admin.delete(f"/v1/clients/{revoked_id}").status_code == 200
    assert server.client(revoked_token).get("/v1/datasets").status_code == 401


def test_a_forbidden_role_is_refused_before_its_body_is_validated(server: Server) -> None:
    """403 for any body from a role that may not use the route: a 422 would tell it
    which fields the route takes and which values it accepts."""
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=10)
    _client_id, client_token = create_client(admin, "client", "granted")
    _auditor_id, auditor_token = create_client(admin, "auditor", "auditor")
    callers = {"client": server.client(client_token), "auditor": server.client(auditor_token)}
    routes = [  # (path, roles refused)
        ("/v1/datasets", ("client", "auditor")),
        ("/v1/clients", ("client", "auditor")),
        (f"/v1/datasets/{ds}/grants", ("client", "auditor")),
        (f"/v1/datasets/{ds}/releases", ("auditor",)),
    ]
    for path, refused in routes:
        for role in refused:
            for body in ({"bogus": 1}, [], {"epsilon": "not a number"}):
                got = callers[role].post(path, json=body)
                assert got.status_code == 403, (role, path, body, got.text)
                assert got.json()["error"] == "forbidden"
        assert admin.post(path, json={"bogus": 1}).status_code == 422  # still validated


def test_a_client_revoked_while_its_request_runs_writes_nothing(server: Server) -> None:
    """A request is authenticated when it arrives; a revocation committed while it
    ran (a slow upload, seconds of planning) stopped nothing: its release or
    training spent ε, its partition plan became the dataset's for good. Each write
    now re-reads the client under the dataset lock: here each is called as the
    request authenticated before the revocation would call it."""
    admin = server.client()
    r = admin.post("/v1/datasets", json={"name": "d", "task": "classification",
                                         "label_domain": {"num_classes": 3},
                                         "epsilon_budget": 10, "delta_budget": 0.01})  # fmt: skip
    ds = r.json()["id"]
    ids = [f"e{i}" for i in range(60)]
    assert upload_labels(admin, ds, ids, [i % 3 for i in range(60)]).status_code == 200
    client_id, _ = create_client(admin)
    assert admin.post(f"/v1/datasets/{ds}/grants", json={"client_id": client_id}).is_success
    principal = Principal(client_id, "client")  # what authenticate() gave the request
    assert admin.delete(f"/v1/clients/{client_id}").status_code == 200
    budget = admin.get(f"/v1/datasets/{ds}/budget").json()
    audit = admin.get(f"/v1/datasets/{ds}/audit").json()["entries"]

    settings, db = server.settings, connect(server.settings.resolved_database_url)

    def upload(columns: dict[str, list[Any]]) -> io.BytesIO:
        return io.BytesIO(parquet_bytes({"example_id": ids, **columns}))

    spec = TrainingSpec.model_validate_json('{"epsilon": 1, "delta": 1e-4, "denoiser": "noop", '
                                            '"architecture": "mlp", "hidden": [4]}')  # fmt: skip
    writes: dict[str, Callable[[Session], object]] = {
        "release": lambda s: releases.create(
            s, settings, principal, ds,
            ReleaseCreate.model_validate({"mechanism": {"name": "rr"}, "epsilon": 1}),
            unlocked=db.reader,
        ),
        "training": lambda s: trainings.create(
            s, settings, principal, ds, spec, upload({"x": [0.5] * 60}), "parquet",
            unlocked=db.reader,
        ),
        "partition plan": lambda s: partitions.register(
            s, settings, principal, ds, upload({"part": ["a"] * 60}), "parquet",
            unlocked=db.reader,
        ),
        "prior set": lambda s: priors.upload(
            s, settings, principal, ds, upload({"group": ["g"] * 60}), "parquet", "groups",
            unlocked=db.reader,
        ),
    }  # fmt: skip
    try:
        for what, write in writes.items():
            with pytest.raises(UnauthorizedError), transaction(db.writer) as session:
                write(session)
                pytest.fail(f"a revoked client's {what} was written")
    finally:
        db.dispose()
    assert admin.get(f"/v1/datasets/{ds}/budget").json() == budget
    assert admin.get(f"/v1/datasets/{ds}/audit").json()["entries"] == audit
    assert admin.get(f"/v1/datasets/{ds}/partitions").status_code == 404
    assert admin.get(f"/v1/datasets/{ds}/trainings").json() == []


def test_a_revocation_is_not_held_off_by_the_client_s_new_requests(server: Server) -> None:
    """On Postgres each new write's FOR SHARE of the client's row went ahead of a
    waiting revocation's FOR UPDATE: a client that kept sending was not revoked
    until it stopped, and its requests after the DELETE spent ε. A revocation now
    waits only for the writes already holding the client; a write arriving after
    it waits for it, and finds the client revoked."""
    url = server.settings.resolved_database_url
    if not url.startswith("postgresql"):
        pytest.skip("SQLite's writers are serial: there is no queue to jump")
    admin = server.client()
    client_id, _ = create_client(admin)
    principal = Principal(client_id, "client")  # as its requests were authenticated
    db = connect(url)

    def write() -> None:
        with transaction(db.writer) as session:
            confirm(session, principal)

    def waiting_locks() -> int:
        with transaction(db.reader) as session:
            query = ("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                     "WHERE NOT l.granted AND a.datname = current_database()")  # fmt: skip
            return int(session.execute(text(query)).scalar_one())

    holding = db.writer()
    try:
        confirm(holding, principal)  # a write of the client's, under way
        with ThreadPoolExecutor(2) as pool:
            revoked = pool.submit(admin.delete, f"/v1/clients/{client_id}")
            deadline = time.monotonic() + 20
            while waiting_locks() < 1:
                assert time.monotonic() < deadline, "the revocation never waited"
                time.sleep(0.05)
            later = pool.submit(write)  # a new request, after the DELETE
            time.sleep(0.5)
            assert not later.done() and not revoked.done()
            holding.commit()
            assert revoked.result(timeout=20).status_code == 200
            with pytest.raises(UnauthorizedError):
                later.result(timeout=20)
    finally:
        holding.close()
        db.dispose()


def test_no_endpoint_serves_raw_labels(server: Server) -> None:
    """The only label download is a release's; no GET route reads a dataset's labels."""
    spec = server.client(None).get("/openapi.json").json()
    for path, operations in spec["paths"].items():
        if "get" in operations:
            assert not (path.startswith("/v1/datasets/") and path.endswith("/labels")), path
    assert "/v1/releases/{release_id}/labels" in spec["paths"]


def test_openapi_declares_every_endpoint_and_its_errors(server: Server) -> None:
    anonymous = server.client(None)
    assert anonymous.get("/docs").status_code == 200
    assert anonymous.get("/redoc").status_code == 404  # not a second, undocumented one
    spec = anonymous.get("/openapi.json").json()
    assert "ErrorBody" in spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert operation.get("summary"), (method, path)
            if path.startswith("/v1/"):
                declared = set(operation["responses"])
                assert "401" in declared, (method, path)
                if method in ("post", "delete"):
                    assert "422" in declared or "404" in declared, (method, path)


def _grant(admin: Any, ds: str, name: str) -> tuple[str, Any]:
    client_id, token = create_client(admin, "client", name)
    assert admin.post(f"/v1/datasets/{ds}/grants", json={"client_id": client_id}).status_code == 201
    return client_id, token


def test_a_client_reads_its_own_releases_only_while_it_holds_the_grant(server: Server) -> None:
    """Reads by id compared the release's maker alone: with its grant row gone, a
    client still read the release and its labels (helper-79)."""
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=10)
    assert upload_labels(admin, ds, [f"e{i}" for i in range(20)], [1.0] * 20).status_code == 200
    client_id, token = _grant(admin, ds, "grant-lost")
    client = server.client(token)
    made = release(client, ds).json()["id"]
    assert client.get(f"/v1/releases/{made}/labels").status_code == 200
    db = connect(server.settings.resolved_database_url)
    try:
        with transaction(db.writer) as session:  # no endpoint removes one grant
            session.execute(text("DELETE FROM grants WHERE client_id = :c"), {"c": client_id})
    finally:
        db.dispose()
    for path in (f"/v1/releases/{made}", f"/v1/releases/{made}/labels"):
        assert client.get(path).status_code == 404, path
    assert admin.get(f"/v1/releases/{made}").status_code == 200


def test_prior_sets_are_their_client_s_own(server: Server) -> None:
    """Two clients of one dataset: the second listed the first's prior sets and
    released with one, its groups in the manifest (helper-79)."""
    admin = server.client()
    ds = create_dataset(admin, task="classification", domain={"num_classes": 3},
                        epsilon_budget=10)  # fmt: skip
    ids = [f"e{i}" for i in range(30)]
    assert upload_labels(admin, ds, ids, [i % 3 for i in range(30)]).status_code == 200
    first = server.client(_grant(admin, ds, "first")[1])
    second = server.client(_grant(admin, ds, "second")[1])
    groups = parquet_bytes({"example_id": ids, "group": [f"g{i % 2}" for i in range(30)]})
    r = first.post(f"/v1/datasets/{ds}/priors", files={"file": ("g.parquet", groups)},
                   data={"kind": "groups"})  # fmt: skip
    assert r.status_code == 201, r.text
    prior = r.json()["id"]
    assert [p["id"] for p in first.get(f"/v1/datasets/{ds}/priors").json()] == [prior]
    assert second.get(f"/v1/datasets/{ds}/priors").json() == []
    assert second.get(f"/v1/datasets/{ds}/priors/{prior}").status_code == 404
    mechanism = {"name": "rr-with-prior", "prior_source": "groups", "prior_id": prior}
    body = {"mechanism": mechanism, "epsilon": 1, "prior_epsilon": 0.5}
    refused = second.post(f"/v1/datasets/{ds}/releases", json=body)
    assert refused.status_code == 404, refused.text
    assert second.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0
    assert first.post(f"/v1/datasets/{ds}/releases", json=body).status_code == 201
    assert [p["id"] for p in admin.get(f"/v1/datasets/{ds}/priors").json()] == [prior]


@pytest.mark.parametrize("route", ["priors", "partitions", "trainings"])
def test_an_upload_to_a_dataset_the_client_may_not_see_is_refused_before_its_body(
    server: Server, route: str
) -> None:
    """A client granted another dataset made the service read and spool a whole
    upload (30 MB in the review) before its 404 (helper-79). Here the body never
    comes: the answer must not wait for it."""
    admin = server.client()
    ds = create_dataset(admin, task="classification", domain={"num_classes": 3})
    other = create_dataset(admin, name="other")
    _, token = _grant(admin, other, f"elsewhere-{route}")
    host, port = server.url.removeprefix("http://").split(":")
    head = (f"POST /v1/datasets/{ds}/{route} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: 30000000\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\n\r\n")  # fmt: skip
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + b"--b\r\n")
        answer = sock.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 404"), answer[:200]
