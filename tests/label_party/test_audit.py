"""The audit log is append-only and hash-chained (DESIGN.md §3.6): editing any row
in the database makes verification fail at the first bad entry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from label_party.audit import service as audit
from label_party.db import connect, migrate, transaction
from tests.label_party.conftest import Server
from tests.label_party.helpers import create_dataset, release, upload_labels

pytestmark = pytest.mark.slow


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(database_url)
    yield eng
    eng.dispose()


def _tampered(engine: Engine, server: Server, sql: str, restore: str, **params: object) -> dict:
    with engine.begin() as conn:
        conn.execute(text(sql), params)
    try:
        result: dict = server.client().get("/v1/audit/verify").json()
    finally:
        with engine.begin() as conn:
            conn.execute(text(restore), params)
    return result


def test_editing_any_row_is_detected(server: Server, engine: Engine) -> None:
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=1)
    assert upload_labels(admin, ds, ["a", "b", "c"], [1.0, 2.0, 3.0]).status_code == 200
    rel = release(admin, ds, 0.5)
    assert rel.status_code == 201
    assert admin.get("/v1/audit/verify").json()["ok"] is True
    entries = admin.get(f"/v1/datasets/{ds}/audit").json()["entries"]
    created = next(e for e in entries if e["action"] == "dataset.created")
    released = next(e for e in entries if e["action"] == "release.created")
    uploaded = next(e for e in entries if e["action"] == "labels.uploaded")

    with engine.connect() as conn:
        payload = conn.execute(
            text("SELECT payload FROM audit_entries WHERE seq = :s"), {"s": uploaded["seq"]}
        ).scalar_one()
    forged = json.dumps({**json.loads(payload), "num_labels": 4}, sort_keys=True)
    result = _tampered(
        engine,
        server,
        "UPDATE audit_entries SET payload = :forged WHERE seq = :s",
        "UPDATE audit_entries SET payload = :orig WHERE seq = :s",
        forged=forged,
        orig=payload,
        s=uploaded["seq"],
    )
    assert result["ok"] is False and result["first_bad_entry"] == uploaded["seq"]
    assert result["head"] is None

    # The ledger's spend re-derived from the log must match the ledger table.
    ledger_id = json.loads(json.dumps(released["payload"]))["ledger_entry_id"]
    result = _tampered(
        engine,
        server,
        "UPDATE ledger_entries SET epsilon = epsilon - 1 WHERE id = :i",
        "UPDATE ledger_entries SET epsilon = epsilon + 1 WHERE id = :i",
        i=ledger_id,
    )
    assert result["ok"] is False and result["first_bad_entry"] == released["seq"]
    # A failed check gives no head to keep as an anchor, wherever it failed (helper-82).
    assert result["head"] is None

    result = _tampered(
        engine,
        server,
        "UPDATE datasets SET epsilon_budget = epsilon_budget * 2 WHERE id = :d",
        "UPDATE datasets SET epsilon_budget = epsilon_budget / 2 WHERE id = :d",
        d=ds,
    )
    assert result["ok"] is False and result["first_bad_entry"] == created["seq"]
    assert result["head"] is None

    result = _tampered(
        engine,
        server,
        "UPDATE audit_entries SET seq = -seq WHERE seq = :s",
        "UPDATE audit_entries SET seq = -seq WHERE seq = -:s",
        s=created["seq"],
    )
    assert result["ok"] is False and result["first_bad_entry"] == created["seq"]
    assert result["head"] is None

    assert admin.get("/v1/audit/verify").json()["ok"] is True


def test_an_anchor_kept_elsewhere_catches_a_rewritten_chain(server: Server) -> None:
    """The chain is unkeyed: a database writer can rewrite it whole and recompute
    every hash, and verify still passes. A head recorded outside the service
    cannot be matched by the rewrite."""
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=1)
    assert upload_labels(admin, ds, ["a", "b"], [1.0, 2.0]).status_code == 200
    first = admin.get("/v1/audit/verify").json()
    seq, digest = first["head"].split(":")
    assert first["ok"] is True and int(seq) == first["entries"] and len(digest) == 64
    assert release(admin, ds, 0.5).status_code == 201  # the chain grows past the anchor
    later = admin.get("/v1/audit/verify", params={"anchor": first["head"]}).json()
    assert later["ok"] is True and later["head"] != first["head"]
    rewritten = f"{seq}:{'0' * 64}"  # what a recomputed chain has at that entry
    result = admin.get("/v1/audit/verify", params={"anchor": rewritten}).json()
    assert result["ok"] is False and result["first_bad_entry"] == int(seq)
    assert "rewritten" in result["reason"]
    beyond = f"{later['entries'] + 1}:{digest}"  # entries removed from the end
    result = admin.get("/v1/audit/verify", params={"anchor": beyond}).json()
    assert result["ok"] is False and "shorter" in result["reason"]
    bad = admin.get("/v1/audit/verify", params={"anchor": "nonsense"})
    assert bad.status_code == 422
    for anchor, says in (("1:abc", "has 3"), ("1:" + "g" * 64, "hexadecimal")):
        bad = admin.get("/v1/audit/verify", params={"anchor": anchor})
        assert bad.status_code == 422 and says in bad.text, bad.text


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"ledger_entry_id": "x", "epsilon_units": 1}, "lacks its amounts"),
        ({"ledger_entry_id": "x", "epsilon_units": "one", "delta_units": 0}, "lacks its amounts"),
        (["not", "an", "object"], "lacks its amounts"),
    ],
)
def test_a_chain_rewritten_with_malformed_payloads_fails_verification(
    tmp_path: Path, payload: object, reason: str
) -> None:
    """Whoever rewrites the chain whole can recompute its hashes over any payload:
    verification reports it as a bad entry instead of failing with a server error."""
    database = connect(f"sqlite:///{tmp_path}/labels.db")
    migrate(database.writer_engine)
    with transaction(database.writer) as session:
        audit.append(session, actor="a", action="labels.uploaded", payload={"n": 1})
        bad = audit.append(session, actor="a", action="release.created", dataset_id="d")
        text_ = audit.canonical(payload)
        bad.payload = text_
        bad.hash = audit.entry_hash(
            bad.seq, bad.created_at, bad.actor, bad.action, bad.dataset_id, text_, bad.prev_hash
        )
    with transaction(database.reader) as session:
        result = audit.verify(session)
    database.dispose()
    assert (result.ok, result.first_bad_entry) == (False, 2)
    assert reason in (result.reason or "")
