"""A bug's exception leaves either service as a JSON 500 like any error: the
request id on it, the access log and metrics seeing the 500, and the client's
keep-alive connection still open (Starlette's handler for ``Exception`` answers
outside the middleware and re-raises, so uvicorn closed the connection)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request

from feature_party.app import create_app as feature_party_app
from feature_party.config import Settings as FeaturePartySettings
from label_party.app import create_app as label_party_app
from label_party.config import Settings as LabelPartySettings
from label_party.observability import ACCESS_LOGGER
from tests.feature_party.fake_labels_party import serve_app

TOKEN = "bug-test-admin-token-0123456789abcdef"


def _labels_party(tmp_path: Path) -> FastAPI:
    return label_party_app(
        LabelPartySettings(data_dir=tmp_path, admin_token=TOKEN)  # type: ignore[call-arg]
    )


def _features_party(tmp_path: Path) -> FastAPI:
    return feature_party_app(
        FeaturePartySettings(data_dir=tmp_path, admin_token=TOKEN)  # type: ignore[call-arg]
    )


@contextmanager
def _access_log() -> Iterator[list[logging.LogRecord]]:
    """The access log's records, whatever logging set-up earlier tests left."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # type: ignore[method-assign]
    loggers = [logging.getLogger(name) for name in (ACCESS_LOGGER, "feature_party.access")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


def _with_bug_and_peer(app: FastAPI) -> FastAPI:
    """Two routes: one with a bug whose text quotes a label; one that says which
    client port the request came from (the same port: the same connection)."""

    async def bug() -> None:
        raise ValueError("label 41.5 of e7 is odd")

    async def peer(request: Request) -> dict[str, int]:
        assert request.client is not None
        return {"port": request.client.port}

    app.add_api_route("/bug", bug)
    app.add_api_route("/peer", peer)
    return app


@pytest.mark.parametrize("make", [_labels_party, _features_party], ids=["labels", "features"])
def test_a_bug_is_a_json_500_on_a_connection_that_stays_open(
    make: Callable[[Path], FastAPI], tmp_path: Path
) -> None:
    app = _with_bug_and_peer(make(tmp_path))
    with serve_app(app) as url, httpx.Client(base_url=url) as c, _access_log() as access:
        before = c.get("/peer").json()["port"]
        r = c.get("/bug", headers={"X-Request-ID": "req-bug-1"})
        after = c.get("/peer").json()["port"]
    assert r.status_code == 500
    assert r.json() == {"error": "internal_error", "message": "internal error", "detail": None}
    assert r.headers["x-request-id"] == "req-bug-1"
    assert before == after  # the same keep-alive connection served the next request
    assert {"route": "/bug", "status": 500} in [
        {k: rec.fields[k] for k in ("route", "status")}
        for rec in access  # type: ignore[attr-defined]
    ]
    assert "41.5" not in r.text


@pytest.mark.parametrize("make", [_labels_party, _features_party], ids=["labels", "features"])
def test_a_body_that_cannot_be_parsed_is_422_invalid_request(
    make: Callable[[Path], FastAPI], tmp_path: Path
) -> None:
    """FastAPI and Starlette answer 400 for a body that is not JSON or not UTF-8, or a
    multipart body without its boundary; DESIGN.md §6 says 422 for what is invalid."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    path = "/v1/mechanisms/preview" if make is _labels_party else "/v1/jobs"
    upload = "/v1/datasets/x/labels" if make is _labels_party else "/v1/feature-sets"
    with serve_app(make(tmp_path)) as url, httpx.Client(base_url=url, headers=auth) as c:
        for body in (b"{not json", b'{"a": "\xff"}'):
            r = c.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text
        r = c.post(upload, content=b"x", headers={"content-type": "multipart/form-data"})
        assert r.status_code in (404, 422) and r.json()["error"] != "bad_request", r.text
