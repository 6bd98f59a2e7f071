"""The labels-party client against the fake labels party on loopback."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

import feature_party.client as client_module
from feature_party.client import (
    BudgetExceededError,
    LabelsPartyClient,
    LabelsPartyError,
    LabelsPartyHTTPError,
    LabelsPartyUnavailableError,
    ReleaseIntegrityError,
)
from shared.protocol import ReleaseCreate
from tests.feature_party.fake_labels_party import (
    TOKEN,
    FakeLabelsParty,
    dropping_server,
    free_port,
    serve_app,
    trickling_server,
)

REQUEST = ReleaseCreate.model_validate({"mechanism": {"name": "laplace"}, "epsilon": 1})


@pytest.fixture
def fake(labels_party: FakeLabelsParty) -> FakeLabelsParty:
    labels_party.set_labels(["a", "b", "c"], [1.0, 2.0, 3.0])
    return labels_party


def make(url: str) -> LabelsPartyClient:
    sleeps: list[float] = []
    c = LabelsPartyClient(url, TOKEN, timeout=2.0, retries=3, backoff=0.01, sleep=sleeps.append)
    c.sleeps = sleeps  # type: ignore[attr-defined]
    return c


def test_public_surface_is_complete() -> None:
    public = {n for n in dir(client_module) if not n.startswith("_")}
    exported = {
        n
        for n in public
        if isinstance(getattr(client_module, n), type)
        and getattr(client_module, n).__module__ == client_module.__name__
    }
    assert exported - {"T"} <= set(client_module.__all__)


def test_release_round_trip(tmp_path: Path, fake: FakeLabelsParty) -> None:
    with make(fake.url) as c:
        release = c.create_release(fake.dataset_id, REQUEST)
        assert release.num_labels == 3
        assert c.get_release(release.id) == release
        sha = c.download_labels(release.id, tmp_path / "l.parquet", expected_sha256=release.sha256)
    assert sha == hashlib.sha256(fake.labels).hexdigest() == release.sha256
    assert (tmp_path / "l.parquet").read_bytes() == fake.labels
    assert release.idempotency_key  # the client always sends one


def test_retried_release_spends_once(fake: FakeLabelsParty) -> None:
    fake.fail_posts = 2  # spent, then the answer is lost twice
    with make(fake.url) as c:
        release = c.create_release(fake.dataset_id, REQUEST)
        assert c.sleeps == [pytest.approx(s, abs=1) for s in c.sleeps] and len(c.sleeps) == 2  # type: ignore[attr-defined]
    assert fake.spent == 1.0
    assert list(fake.releases) == [release.id]
    posts = [r for r in fake.requests if r.startswith("POST")]
    assert len(posts) == 3


def test_download_retries_5xx(tmp_path: Path, fake: FakeLabelsParty) -> None:
    fake.fail_gets = 2
    with make(fake.url) as c:
        release = c.create_release(fake.dataset_id, REQUEST)
        c.download_labels(release.id, tmp_path / "l.parquet", expected_sha256=release.sha256)


def test_hash_mismatch_leaves_nothing(tmp_path: Path, fake: FakeLabelsParty) -> None:
    fake.wrong_hash = True
    with make(fake.url) as c:
        release = c.create_release(fake.dataset_id, REQUEST)
        with pytest.raises(ReleaseIntegrityError):
            c.download_labels(release.id, tmp_path / "l.parquet", expected_sha256=release.sha256)
    assert list(tmp_path.iterdir()) == []


def test_a_transfer_corrupted_once_is_fetched_again(tmp_path: Path, fake: FakeLabelsParty) -> None:
    fake.corrupt_gets = 1  # a flaky proxy, once
    with make(fake.url) as c:
        release = c.create_release(fake.dataset_id, REQUEST)
        sha = c.download_labels(release.id, tmp_path / "l.parquet", expected_sha256=release.sha256)
    assert sha == release.sha256 and (tmp_path / "l.parquet").read_bytes() == fake.labels
    fake.corrupt_gets = 2  # twice: an error, and nothing left behind
    with make(fake.url) as c, pytest.raises(ReleaseIntegrityError, match="hash to"):
        c.download_labels(release.id, tmp_path / "m.parquet", expected_sha256=release.sha256)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.parquet"]


def test_down_and_dropping_servers_raise_unavailable_after_retries() -> None:
    with (
        make(f"http://127.0.0.1:{free_port()}") as c,
        pytest.raises(LabelsPartyUnavailableError) as e,
    ):
        c.get_budget("ds")
    assert e.value.attempts == 4
    assert len(c.sleeps) == 3  # type: ignore[attr-defined]
    with dropping_server() as url, make(url) as c:
        with pytest.raises(LabelsPartyUnavailableError):
            c.create_release("ds", REQUEST)
        assert len(c.sleeps) == 3  # type: ignore[attr-defined]
        # A non-idempotent write is not retried after the request may have arrived.
        with pytest.raises(LabelsPartyUnavailableError) as e:
            c.create_client(name="x")
        assert e.value.attempts == 1


def test_an_answer_of_the_wrong_shape_is_the_labels_party_s_error(tmp_path: Path) -> None:
    """A captive portal's HTML, or JSON of another shape, with a 200: it was a 500
    (an unhandled ValueError) at the features party; now a LabelsPartyError (502)."""
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse, JSONResponse

    app = FastAPI()

    @app.post("/v1/datasets/{dataset_id}/releases")
    def html(dataset_id: str) -> HTMLResponse:
        return HTMLResponse("<html>captive portal</html>")

    @app.get("/v1/releases/{release_id}")
    def odd(release_id: str) -> JSONResponse:
        return JSONResponse({"unexpected": 1})

    with serve_app(app) as url, make(url) as c:
        with pytest.raises(LabelsPartyError, match="not JSON"):
            c.create_release("ds", REQUEST)
        with pytest.raises(
            LabelsPartyError, match="not a ReleaseRead: check created_at, dataset_id"
        ) as bad:
            c.get_release("r")
        assert "sha256" in str(bad.value)  # every missing field named


def test_deeply_nested_or_unencodable_answers_are_the_labels_party_s_error() -> None:
    """JSON nested past Python's recursion limit was a 500 at the features party,
    and a lone surrogate in a refusal's message failed to encode in its answer,
    read as the request's own fault (helper-86)."""
    from fastapi import FastAPI
    from fastapi.responses import Response

    app = FastAPI()

    @app.get("/v1/releases/{release_id}")
    def deep(release_id: str) -> Response:
        return Response("[" * 100_000, media_type="application/json")

    @app.post("/v1/datasets/{dataset_id}/releases")
    def refused(dataset_id: str) -> Response:
        body = '{"error": "conflict", "message": "a \\ud800 b", "detail": ["\\udfff"]}'
        return Response(body, status_code=409, media_type="application/json")

    with serve_app(app) as url, make(url) as c:
        with pytest.raises(LabelsPartyError, match="not JSON"):
            c.get_release("r")
        with pytest.raises(LabelsPartyHTTPError) as caught:
            c.create_release("ds", REQUEST)
        assert (caught.value.message, caught.value.detail) == ("a ? b", ["?"])
        caught.value.message.encode("utf-8")  # answerable


def test_a_manifest_s_sha256_must_be_a_hash_and_an_empty_one_is_checked(
    tmp_path: Path, fake: FakeLabelsParty
) -> None:
    """An empty sha256 turned the download's integrity check off (``if e and …``), and
    every such release was stored under one name, received/.parquet, each over the
    last: a manifest's sha256 must be 64 hex digits, and an expected hash that is
    present but empty fails the check."""
    from fastapi import FastAPI

    release = {"id": "r", "dataset_id": "d", "epsilon": "1", "num_labels": 1,
               "mechanism": {"name": "laplace", "epsilon": 1.0, "params": {}},
               "created_at": "2026-01-01T00:00:00Z"}  # fmt: skip
    hashes = {"empty": "", "upper": "A" * 64, "path": "../x", "good": "a" * 64}
    app = FastAPI()

    @app.get("/v1/releases/{release_id}")
    def manifest(release_id: str) -> dict[str, object]:
        return {**release, "sha256": hashes[release_id]}

    with serve_app(app) as url, make(url) as c:
        for odd in ("empty", "upper", "path"):
            with pytest.raises(LabelsPartyError, match="sha256"):
                c.get_release(odd)
        assert c.get_release("good").sha256 == "a" * 64
    with make(fake.url) as c:
        made = c.create_release(fake.dataset_id, REQUEST)
        with pytest.raises(ReleaseIntegrityError):
            c.download_labels(made.id, tmp_path / "l.parquet", expected_sha256="")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("headers_first", [False, True])
def test_a_trickling_labels_party_cannot_hold_a_request(
    tmp_path: Path, headers_first: bool
) -> None:
    """The read timeout bounds a silence, not a trickle: a byte every 50 ms kept a
    request (and its worker thread) for ever. Each attempt now has a watchdog."""
    with trickling_server(headers_first=headers_first) as url:
        c = LabelsPartyClient(url, TOKEN, timeout=0.5, retries=1, backoff=0.0)
        started = time.monotonic()
        with c, pytest.raises(LabelsPartyUnavailableError, match="did not come in time"):
            if headers_first:
                c.download_labels("r", tmp_path / "l.parquet")
            else:
                c.get_release("r")
        assert time.monotonic() - started < 10
    assert list(tmp_path.iterdir()) == []


def test_a_slow_but_steady_upload_is_not_cut(tmp_path: Path) -> None:
    """The watchdog cannot see an upload's sending: it cut healthy ones that took
    longer than twice the timeout to send (review of 311fe40)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    body = b'{"num_labels": 3}'

    def slow_reader() -> None:
        conn, _ = sock.accept()
        with conn:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, rest = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            got = len(rest)
            while got < length:  # about 3 MB/s: 14 MiB take 4.6 s, over 2 x 2 s
                time.sleep(0.02)
                got += len(conn.recv(65536))
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )

    thread = threading.Thread(target=slow_reader, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with LabelsPartyClient(url, TOKEN, timeout=2.0, retries=0) as c:
        started = time.monotonic()
        assert c.upload_labels("ds", b"x" * (14 << 20)) == {"num_labels": 3}
        assert time.monotonic() - started > 4.0  # it was slow, and it was not cut
    thread.join(timeout=5)
    sock.close()


def test_retry_after_is_honoured_and_a_429_retries_even_a_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 429 turns a request away unread, so even a write that is not idempotent
    may go again; both wait as long as the labels party asked, not a jittered
    guess (the retries of 4 × 0.5 s could all fall inside a 5 s restart)."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()
    answers = {"clients": 0, "budget": 0}

    @app.post("/v1/clients")
    def clients() -> JSONResponse:
        answers["clients"] += 1
        if answers["clients"] == 1:
            body = {"error": "too_many_requests", "message": "slow down"}
            return JSONResponse(body, status_code=429, headers={"Retry-After": "2"})
        if answers["clients"] == 2:  # shared.overload's: unread too (it failed a run)
            body = {"error": "overloaded", "message": "busy"}
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"id": "c1", "token": "t"})

    @app.get("/v1/datasets/{dataset_id}/budget")
    def budget(dataset_id: str) -> JSONResponse:
        answers["budget"] += 1
        body = {"error": "unavailable", "message": "restarting"}
        return JSONResponse(body, status_code=503, headers={"Retry-After": "1.5"})

    with serve_app(app) as url, make(url) as c, caplog.at_level("WARNING", "feature_party.client"):
        assert c.create_client(name="x") == {"id": "c1", "token": "t"}
        assert c.sleeps == [2.0, 1.0]  # type: ignore[attr-defined]
        # Each retry says what failed, why, and how long it waits (no silent hang).
        assert [r.getMessage() for r in caplog.records] == [
            "POST /v1/clients failed (HTTP 429 too_many_requests: slow down); "
            "retry 1 of 3 in 2.0 s",
            "POST /v1/clients failed (HTTP 503 overloaded: busy); retry 2 of 3 in 1.0 s",
        ]
        with pytest.raises(LabelsPartyUnavailableError, match="503 unavailable: restarting"):
            c.get_budget("ds")
        assert c.sleeps[2:] == [1.5, 1.5, 1.5]  # type: ignore[attr-defined]
    assert answers == {"clients": 3, "budget": 4}


def test_a_labels_party_that_keeps_failing_is_its_error_with_its_body() -> None:
    """A 500 on every try is the labels party's own failure, not an outage: after
    the retries the caller gets its status and body (its request id, for its
    operator's logs). A gateway's 502, 503 or 504 stays "unavailable"."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()
    answers = {"release": 0, "client": 0, "gateway": 0}
    failure = {"error": "internal_error", "message": "boom", "detail": {"request_id": "r1"}}

    @app.post("/v1/datasets/{dataset_id}/releases")
    def release(dataset_id: str) -> JSONResponse:
        answers["release"] += 1
        return JSONResponse(failure, status_code=500)

    @app.post("/v1/clients")
    def clients() -> JSONResponse:
        answers["client"] += 1
        return JSONResponse(failure, status_code=500)

    @app.get("/v1/datasets/{dataset_id}/budget")
    def budget(dataset_id: str) -> JSONResponse:
        answers["gateway"] += 1
        return JSONResponse({"error": "bad_gateway", "message": "upstream"}, status_code=502)

    with serve_app(app) as url, make(url) as c:
        with pytest.raises(LabelsPartyHTTPError) as e:
            c.create_release("ds", REQUEST)  # idempotent: retried, then its answer
        assert (e.value.status_code, e.value.error, e.value.detail) == (
            500,
            "internal_error",
            {"request_id": "r1"},
        )
        with pytest.raises(LabelsPartyHTTPError) as e:
            c.create_client(name="x")  # not idempotent: its first answer
        assert e.value.status_code == 500
        with pytest.raises(LabelsPartyUnavailableError):
            c.get_budget("ds")
    assert answers == {"release": 4, "client": 1, "gateway": 4}


def test_errors_are_typed(fake: FakeLabelsParty) -> None:
    fake.budget = 0.5
    with make(fake.url) as c:
        with pytest.raises(BudgetExceededError) as e:
            c.create_release(fake.dataset_id, REQUEST)
        assert e.value.status_code == 409 and e.value.error == "budget_exceeded"
        with pytest.raises(LabelsPartyHTTPError) as e2:
            c.get_release("nope")
        assert e2.value.status_code == 404
    with make(fake.url) as c:
        c._http.headers["Authorization"] = "Bearer wrong"
        with pytest.raises(LabelsPartyHTTPError) as e3:
            c.get_release("x")
        assert e3.value.status_code == 401
    assert issubclass(LabelsPartyUnavailableError, LabelsPartyError)


def test_sdk_methods_hit_the_contract_paths() -> None:
    seen: list[tuple[str, str, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.content))
        if request.url.path.endswith("/audit"):
            return httpx.Response(200, json=[])
        return httpx.Response(200, json={"id": "x", "ok": True})

    with LabelsPartyClient("http://lp", TOKEN, transport=httpx.MockTransport(handler)) as c:
        c.create_dataset(
            name="d", task="regression", label_domain={"min": 0, "max": 1}, epsilon_budget=2
        )
        c.get_dataset("d1")
        c.upload_labels("d1", b"example_id,label\na,1\n", filename="l.csv")
        c.get_budget("d1")
        c.create_client(name="pub", role="client")
        c.delete_client("c1")
        c.create_grant("d1", client_id="c1")
        assert c.get_audit("d1") == []
        c.verify_audit()
        c.preview_mechanism({"mechanism": "rr"})
        c.health()
    paths = [(m, p) for m, p, _ in seen]
    assert paths == [
        ("POST", "/v1/datasets"),
        ("GET", "/v1/datasets/d1"),
        ("POST", "/v1/datasets/d1/labels"),
        ("GET", "/v1/datasets/d1/budget"),
        ("POST", "/v1/clients"),
        ("DELETE", "/v1/clients/c1"),
        ("POST", "/v1/datasets/d1/grants"),
        ("GET", "/v1/datasets/d1/audit"),
        ("GET", "/v1/audit/verify"),
        ("POST", "/v1/mechanisms/preview"),
        ("GET", "/healthz"),
    ]
    assert b'filename="l.csv"' in seen[2][2]
