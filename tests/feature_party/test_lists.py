"""The features party's lists (feature sets, received labels, jobs, models, LP-MST
runs): keyset pages oldest first, filters, and the CLI's ``list`` actions, on a
real service with SQLite and Postgres. On Postgres the database is the session's,
so other tests' rows may be listed too: each check is about this test's rows."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from feature_party.config import Settings
from feature_party.db import Database
from feature_party.jobs.worker import Worker
from tests.feature_party.conftest import ADMIN, AUTH, synthetic
from tests.feature_party.fake_labels_party import FakeLabelsParty
from tests.feature_party.test_api import receive, upload


def pages(client: httpx.Client, path: str, **params: object) -> tuple[list[Any], int]:
    """Every row of ``path``, following ``Link: rel="next"``, and how many pages."""
    rows: list[Any] = []
    response = client.get(path, headers=AUTH, params=params)
    count = 1
    while True:
        assert response.status_code == 200, response.text
        rows += response.json()
        following = response.links.get("next", {}).get("url")
        if following is None:
            return rows, count
        response = client.get(following, headers=AUTH)
        count += 1


def ids(rows: list[Any]) -> list[str]:
    return [row["id"] for row in rows]


def only(rows: list[Any], wanted: list[str]) -> list[str]:
    return [i for i in ids(rows) if i in wanted]


def test_every_list_pages_oldest_first_and_filters(
    client: httpx.Client, settings: Settings, labels_party: FakeLabelsParty
) -> None:
    data = synthetic(120)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    sets = [upload(client, data.features)["id"] for _ in range(3)]
    received = [receive(client, labels_party, fs).json()["id"] for fs in sets[:2]]
    body = {"feature_set_id": sets[0], "labels_id": received[0], "epochs": 1, "device": "cpu"}
    jobs = [client.post("/v1/jobs", headers=AUTH, json=body).json()["id"] for _ in range(3)]

    listed, count = pages(client, "/v1/feature-sets", limit=2)
    assert only(listed, sets) == sets and count >= 2
    assert len(set(ids(listed))) == len(listed)  # no row twice across pages
    assert ids(listed) == ids(client.get("/v1/feature-sets?limit=1000", headers=AUTH).json())

    labels, _ = pages(client, "/v1/received-labels", limit=1, feature_set_id=sets[1])
    assert ids(labels) == [received[1]]
    assert labels[0]["manifest"]["mechanism"]["name"] == "laplace"
    by_dataset, _ = pages(client, "/v1/received-labels", dataset_id=labels_party.dataset_id)
    assert only(by_dataset, received) == received

    queued, count = pages(client, "/v1/jobs", limit=2, feature_set_id=sets[0])
    assert ids(queued) == jobs and count == 2
    client.delete(f"/v1/jobs/{jobs[1]}", headers=AUTH)
    cancelled, _ = pages(client, "/v1/jobs", status="cancelled", feature_set_id=sets[0])
    assert ids(cancelled) == [jobs[1]]
    database = Database(settings.resolved_database_url)
    try:
        Worker(database, settings, worker_id="w").run(once=True)
    finally:
        database.dispose()
    done, _ = pages(client, "/v1/jobs", status="succeeded", feature_set_id=sets[0])
    models, _ = pages(client, "/v1/models")
    assert done and {job["model_id"] for job in done} <= set(ids(models))

    assert pages(client, "/v1/multistage")[0] is not None  # a list, even when empty


def test_a_status_list_pages_on_after_its_last_row_changed_status(
    client: httpx.Client, labels_party: FakeLabelsParty
) -> None:
    """The cursor was looked up through the status filter: once a page's last job
    was cancelled (or claimed), following the page's link was a 422."""
    data = synthetic(60)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    fs = upload(client, data.features)["id"]
    received = receive(client, labels_party, fs).json()["id"]
    body = {"feature_set_id": fs, "labels_id": received, "epochs": 1, "device": "cpu"}
    jobs = [client.post("/v1/jobs", headers=AUTH, json=body).json()["id"] for _ in range(3)]
    params = {"status": "queued", "feature_set_id": fs, "limit": 1}
    first = client.get("/v1/jobs", headers=AUTH, params=params)
    assert ids(first.json()) == jobs[:1]
    assert client.delete(f"/v1/jobs/{jobs[0]}", headers=AUTH).status_code == 200
    rest = client.get(first.links["next"]["url"], headers=AUTH)
    assert rest.status_code == 200, rest.text
    assert ids(rest.json()) == jobs[1:2]


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v1/jobs", {"after": "no-such-job"}),
        ("/v1/jobs", {"status": "sleeping"}),
        ("/v1/models", {"limit": 0}),
        ("/v1/feature-sets", {"limit": 1001}),
        ("/v1/received-labels", {"after": "x" * 37}),
        ("/v1/multistage", {"after": "gone"}),
    ],
)
def test_a_bad_page_request_is_422(
    client: httpx.Client, path: str, params: dict[str, object]
) -> None:
    r = client.get(path, headers=AUTH, params=params)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request"


def test_lists_need_the_admin_token(client: httpx.Client) -> None:
    for path in ("/v1/feature-sets", "/v1/received-labels", "/v1/jobs", "/v1/models",
                 "/v1/multistage"):  # fmt: skip
        assert client.get(path).status_code == 401, path


def test_the_cli_lists_follow_every_page(
    client: httpx.Client,
    labels_party: FakeLabelsParty,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from feature_party import cli_client
    from labeldp.cli import main

    data = synthetic(60)
    labels_party.set_labels(data.features.column("example_id").to_pylist(), list(data.noisy))
    sets = [upload(client, data.features)["id"] for _ in range(3)]
    received = receive(client, labels_party, sets[0]).json()["id"]
    job = client.post(
        "/v1/jobs", headers=AUTH, json={"feature_set_id": sets[0], "labels_id": received}
    ).json()["id"]
    monkeypatch.setenv("LABELDP_ADMIN_TOKEN", ADMIN)
    # Pages of one row, so that a list is whole only if the command follows the Links.
    monkeypatch.setattr(cli_client, "PAGE_SIZE", 1)

    def listed(*command: str) -> list[Any]:
        assert main(["feature-party", *command, "--url", str(client.base_url)]) == 0
        rows: list[Any] = json.loads(capsys.readouterr().out)
        return rows

    assert only(listed("feature-sets", "list"), sets) == sets
    assert ids(listed("labels", "list", "--feature-set-id", sets[0])) == [received]
    assert ids(listed("jobs", "list", "--feature-set-id", sets[0], "--status", "queued")) == [job]
    assert listed("jobs", "list", "--feature-set-id", sets[0], "--status", "failed") == []
    assert isinstance(listed("models", "list"), list)
    assert isinstance(listed("multistage", "list"), list)
    assert main(["feature-party", "jobs", "list", "--status", "sleeping", "--url",
                 str(client.base_url)]) == 2  # fmt: skip
    assert "invalid_request" in capsys.readouterr().err
