"""The free checks of a release never hold the database's write lock while they
fit a mechanism (on SQLite a write transaction holds it from its first statement):
a request the budget cannot afford is refused before any fit, and the fit to a
uniform prior runs in a read transaction, so other writers go on meanwhile.
(A reviewer held the lock 20 s per request, for free, with a large LP.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from label_party.app import create_app
from label_party.config import Settings
from label_party.releases import service
from tests.feature_party.fake_labels_party import serve_app
from tests.label_party.helpers import create_dataset, release, upload_labels

TOKEN = "release-locking-admin-token-0123456789abcdef"


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[httpx.Client]:
    app = create_app(Settings(data_dir=tmp_path, admin_token=TOKEN))  # type: ignore[call-arg]
    with (
        serve_app(app) as url,
        httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
        ) as client,
    ):
        yield client


def _watch_preflight(
    monkeypatch: pytest.MonkeyPatch, during: Callable[[], None] = lambda: None
) -> list[int]:
    """Record each fit to a uniform prior (its number of labels), running ``during``
    inside it."""
    calls: list[int] = []
    original = service.preflight

    def watched(plan: Any, num_labels: int, **options: Any) -> Any:
        calls.append(num_labels)
        during()
        return original(plan, num_labels, **options)

    monkeypatch.setattr(service, "preflight", watched)
    return calls


def test_a_release_beyond_the_budget_is_refused_before_any_fit(
    admin: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = create_dataset(admin, epsilon_budget=1)
    assert upload_labels(admin, ds, ["a", "b", "c"], [1.0, 2.0, 3.0]).status_code == 200
    assert release(admin, ds, 1).status_code == 201
    calls = _watch_preflight(monkeypatch)
    r = release(admin, ds, 0.5, mechanism={"name": "unbiased", "mesh": 4096})
    assert r.status_code == 409 and r.json()["error"] == "budget_exceeded", r.text
    assert calls == []


def test_the_fit_to_a_uniform_prior_leaves_other_writers_free(
    admin: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = create_dataset(admin, epsilon_budget=1)
    assert upload_labels(admin, ds, ["a", "b", "c"], [1.0, 2.0, 3.0]).status_code == 200
    written: list[int] = []

    def another_writer() -> None:
        if not written:  # the first fit: the read-only precheck's
            with httpx.Client(base_url=admin.base_url, headers=admin.headers, timeout=20) as c:
                written.append(c.post("/v1/clients", json={"name": "w"}).status_code)

    calls = _watch_preflight(monkeypatch, another_writer)
    assert release(admin, ds, 0.5).status_code == 201
    assert written == [201]  # it would wait for the release's write lock, and time out
    assert calls == [3, 3]  # the precheck's fit, then the cached verdict under the lock


def test_labels_replaced_while_a_parts_release_is_checked_are_no_500(
    admin: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check outside the lock counts a parts release's labels from the file its
    row names; an upload committing in between had deleted that file: 500
    internal_error (56 of 1,129 releases in a reviewer's storm). The check steps
    aside and the locked path, reading the row anew, decides."""
    ds = create_dataset(admin, task="classification", domain={"num_classes": 3}, epsilon_budget=5)
    ids = [f"e{i}" for i in range(300)]
    assert upload_labels(admin, ds, ids, [i % 3 for i in range(300)]).status_code == 200
    plan = "example_id,part\n" + "".join(f"{e},p{i % 2}\n" for i, e in enumerate(ids))
    r = admin.post(f"/v1/datasets/{ds}/partitions", files={"file": ("plan.csv", plan)})
    assert r.status_code == 201, r.text
    original, replaced = service._labels_in_scope, []

    def racing(settings: Settings, dataset: Any, selected: Any) -> int:
        if not replaced:  # the unlocked check's read: labels replaced just before it
            with httpx.Client(base_url=admin.base_url, headers=admin.headers, timeout=20) as c:
                replaced.append(upload_labels(c, ds, ids, [(i + 1) % 3 for i in range(300)]))
        return original(settings, dataset, selected)

    monkeypatch.setattr(service, "_labels_in_scope", racing)
    r = release(admin, ds, 1, mechanism={"name": "rr"}, parts=["p0"])
    assert replaced[0].status_code == 200 and r.status_code == 201, r.text
    assert r.json()["num_labels"] == 150
