"""A server killed between reservation and commit leaves nothing half-visible (§3.3)."""

from __future__ import annotations

import shutil
import signal
import tempfile
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


def _crash_mid_release(make_server: Any) -> Path:
    """A server killed before its release's commit: the data directory, holding an
    unreferenced release file."""
    crashing = make_server(
        subprocess=True, LABELDP_TEST_CRASH_POINT="release_before_commit"
    ).start()
    admin = crashing.client()
    ds = create_dataset(admin, epsilon_budget=1.0)
    assert upload_labels(admin, ds, ["a", "b", "c"], [1.0, 2.0, 3.0]).status_code == 200
    with pytest.raises(httpx.TransportError):
        release(admin, ds, 0.3, mechanism={"name": "rr-on-bins"})
    assert crashing.wait_exit() == -signal.SIGKILL
    return Path(crashing.env["LABELDP_DATA_DIR"])


def test_a_restart_starts_whatever_becomes_of_the_orphans(make_server: Any) -> None:
    """``releases/`` may be a filesystem of its own: setting its orphan aside was a
    rename that failed (EXDEV) and aborted the start-up, and restarting looped on it.
    Across filesystems the file is now copied; one that cannot be moved stays."""
    data = _crash_mid_release(make_server)
    (data / "orphans").write_text("a file where the orphans directory would be")
    restarted = make_server(subprocess=True).start()  # it starts
    assert restarted.client().get("/v1/datasets").status_code == 200
    assert len(list((data / "releases").glob("*.parquet"))) == 1  # left in place
    assert "could not set an unreferenced file aside" in restarted.logs()
    restarted.stop()

    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == data.stat().st_dev:
        pytest.skip("no second filesystem (/dev/shm) to put orphans/ on")
    other = Path(tempfile.mkdtemp(dir=shm))
    try:
        (data / "orphans").unlink()
        (data / "orphans").symlink_to(other)  # orphans/ on another filesystem
        make_server(subprocess=True).start()
        assert list((data / "releases").glob("*.parquet")) == []
        assert len(list((other / "releases").glob("*.parquet"))) == 1
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_labels_replaced_before_a_crash_are_deleted_at_the_restart(make_server: Any) -> None:
    """A server killed between a correction's commit and the old file's deletion
    left the replaced raw labels whole in ``orphans/labels/`` at the next start,
    though a correction or a deletion request must not leave them (helper-83). The
    upload names the file it replaces in its transaction; the sweep deletes it."""
    crashing = make_server(subprocess=True, LABELDP_TEST_CRASH_POINT="labels_after_commit")
    admin = crashing.start().client()
    ds = create_dataset(admin)
    assert upload_labels(admin, ds, ["a", "b", "c"], [1.0, 2.0, 9.0]).status_code == 200
    data = Path(crashing.env["LABELDP_DATA_DIR"])
    (replaced,) = (data / "labels" / ds).glob("*.parquet")
    with pytest.raises(httpx.TransportError):  # the correction: c is to be forgotten
        upload_labels(admin, ds, ["a", "b"], [1.0, 2.0])
    assert crashing.wait_exit() == -signal.SIGKILL
    assert replaced.exists()  # the crash came before the deletion

    admin = make_server(subprocess=True).start().client()
    assert admin.get(f"/v1/datasets/{ds}").json()["num_labels"] == 2
    assert not replaced.exists() and not any((data / "orphans").rglob(replaced.name))
    (current,) = (data / "labels" / ds).glob("*.parquet")  # the correction's, kept
    assert release(admin, ds, 0.1).status_code == 201
    assert admin.get("/v1/audit/verify").json()["ok"] is True
    assert current.exists()
