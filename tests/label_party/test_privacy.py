"""One test per privacy invariant of DESIGN.md §3 (§3.6, the audit chain, is
``test_audit.py``; the crash half of §3.3 is ``test_crash.py``)."""

from __future__ import annotations

import io
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel

from label_party.app import create_app
from label_party.config import Settings
from label_party.models import Base
from tests.label_party.conftest import Server
from tests.label_party.helpers import (
    create_client,
    create_dataset,
    parquet_bytes,
    release,
    upload_labels,
)

pytestmark = pytest.mark.slow

DISTINCTIVE = [7.123456789, 3.98765432101, 5.55544433322]
DISTINCTIVE_TEXT = ["7.1234567", "3.9876543", "5.5554443", "zq8x7v6w", "13.579135"]


def test_3_1_raw_labels_never_leave(server: Server) -> None:
    """No response body, log line, metric or error text of the whole flow quotes a label."""
    admin = server.client()
    bodies: list[str] = []
    cid, token = create_client(admin)
    client = server.client(token)
    ds = create_dataset(admin, epsilon_budget=3)
    bodies.append(admin.post(f"/v1/datasets/{ds}/grants", json={"client_id": cid}).text)
    bad = "example_id,label\na,7.123456789\nb,zq8x7v6w\nc,13.579135791\nc,3.98765432101\n"
    r = admin.post(f"/v1/datasets/{ds}/labels", files={"file": ("l.csv", bad.encode())})
    assert r.status_code == 422
    bodies.append(r.text)
    ids = [f"e{i}" for i in range(300)]
    labels = [DISTINCTIVE[i % 3] for i in range(300)]
    bodies.append(upload_labels(admin, ds, ids, labels).text)
    for mech in ("rr-on-bins", "laplace"):
        r = release(client, ds, 1.0, mechanism={"name": mech})
        assert r.status_code == 201
        bodies += [r.text, client.get(f"/v1/releases/{r.json()['id']}/labels?format=json").text]
        noisy = pq.read_table(
            io.BytesIO(client.get(f"/v1/releases/{r.json()['id']}/labels").content)
        )
        assert not set(noisy.column("label").to_pylist()) & set(DISTINCTIVE)
    bodies.append(release(client, ds, 5.0).text)  # refusal
    bodies.append(release(client, ds, 0.5, mechanism={"name": "rr-on-bins", "mesh": "x"}).text)
    for path in (
        f"/v1/datasets/{ds}",
        f"/v1/datasets/{ds}/budget",
        f"/v1/datasets/{ds}/audit",
        "/v1/audit/verify",
        f"/v1/datasets/{ds}/releases",
    ):
        bodies.append(admin.get(path).text)
    bodies.append(admin.get("/metrics").text)
    everything = "\n".join(bodies) + "\n" + server.logs()
    assert '"request_id"' in server.logs()
    for needle in DISTINCTIVE_TEXT:
        assert needle not in everything, needle
    # Not even a hash of the stored labels (it would confirm a guessed label vector).
    stored = list((Path(server.env["LABELDP_DATA_DIR"]) / "labels" / ds).glob("*.parquet"))
    assert len(stored) == 1 and stored[0].stem not in everything


def test_3_1_raw_label_rows_are_never_response_models() -> None:
    app = create_app(Settings(mode="test", data_dir="/nonexistent"))
    for route in app.routes:
        model = getattr(route, "response_model", None)
        if model is None:
            continue
        args = getattr(model, "__args__", (model,))
        for arg in args:
            assert isinstance(arg, type) and issubclass(arg, BaseModel), (route, arg)
            assert not issubclass(arg, Base)


def test_3_1_no_row_order_follows_the_labels(server: Server) -> None:
    """An export ``ORDER BY label`` put every label in a release's row order (at any
    ε), and in the free 422 of an example-prior release, which lists uncovered ids:
    ten such 422s recovered 1,000 binary labels exactly. Both now list rows in
    example_id order, a function of the public ids alone."""
    admin = server.client()
    ds = create_dataset(admin, task="classification", domain={"num_classes": 2}, epsilon_budget=1)
    rng = np.random.default_rng(7)
    ids = [f"u{x:012x}" for x in rng.integers(0, 2**40, size=400)]
    labels = rng.integers(0, 2, size=400)
    by_label = np.argsort(labels, kind="stable")  # the advertiser's export: zeros first
    file_ids = [ids[i] for i in by_label]
    assert upload_labels(admin, ds, file_ids, labels[by_label].tolist()).status_code == 200

    covered = sorted(ids)[::2]  # a prior set that covers every other id
    prior_set = admin.post(
        f"/v1/datasets/{ds}/priors",
        data={"kind": "probabilities"},
        files={"file": ("p.parquet", parquet_bytes({"example_id": covered,
                                                    "prior": [[0.5, 0.5]] * len(covered)}))},
    )  # fmt: skip
    assert prior_set.status_code == 201, prior_set.text
    mechanism = {
        "name": "rr-with-prior",
        "prior_source": "example",
        "prior_id": prior_set.json()["id"],
    }
    refused = release(admin, ds, 1, mechanism=mechanism)
    assert refused.status_code == 422, refused.text
    listed = refused.json()["detail"]["example_ids"]
    assert listed == sorted(ids)[1::2][: len(listed)] and len(listed) > 10

    made = release(admin, ds, "0.01", mechanism={"name": "rr"})
    assert made.status_code == 201, made.text
    body = admin.get(f"/v1/releases/{made.json()['id']}/labels").content
    assert pq.read_table(io.BytesIO(body)).column("example_id").to_pylist() == sorted(ids)


def test_3_1_labels_stored_before_the_order_rule_are_read_in_id_order(tmp_path: Path) -> None:
    """A labels file written before labels were stored in example_id order (no
    ``labeldp.order`` metadata) is sorted as it is read; a marked one is streamed."""
    import pyarrow as pa

    from label_party.storage import PUBLIC_ORDER, in_public_order, label_batches

    table = pa.table({"example_id": ["c", "a", "d", "b"], "label": [1.0, 0.0, 1.0, 0.0]})
    old = tmp_path / "old.parquet"
    pq.write_table(table, old)
    read = [b for batch in label_batches(old, 3) for b in batch.column(0).to_pylist()]
    assert read == ["a", "b", "c", "d"]
    marked = tmp_path / "new.parquet"
    pq.write_table(in_public_order(table), marked)
    assert pq.ParquetFile(marked).schema_arrow.metadata == PUBLIC_ORDER
    assert [b for batch in label_batches(marked, 3) for b in batch.column(0).to_pylist()] == read


def test_3_2_prior_is_private_and_charged_and_domain_is_declared(server: Server) -> None:
    admin = server.client()
    domain = {"min": 0, "max": 100, "grid_size": 21}
    ds = create_dataset(admin, domain=domain, epsilon_budget=2)
    assert upload_labels(admin, ds, [f"e{i}" for i in range(100)], [50.0] * 100).status_code == 200
    got = admin.get(f"/v1/datasets/{ds}").json()["label_domain"]
    assert (got["min"], got["max"], got["grid_size"]) == (0, 100, 21)  # not the labels' range
    r = release(admin, ds, 1.0, mechanism={"name": "rr-on-bins"})
    manifest = r.json()
    assert 0 < manifest["prior_epsilon"] < 1.0
    assert manifest["mechanism"]["epsilon"] == pytest.approx(1.0 - manifest["prior_epsilon"])
    assert manifest["prior"] != [1.0 if i == 10 else 0.0 for i in range(21)]  # noisy
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 1.0
    r = release(admin, ds, 0.5, mechanism={"name": "laplace"}, prior_epsilon=0.1)
    assert r.status_code == 422  # a prior-less mechanism cannot be charged for one


def test_3_3_failed_release_spends_nothing_downloads_are_free(server: Server) -> None:
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=1)
    assert upload_labels(admin, ds, ["a", "b"], [1.0, 2.0]).status_code == 200
    before = admin.get(f"/v1/datasets/{ds}/audit").json()["entries"]
    bad = release(admin, ds, 0.5, mechanism={"name": "laplace", "no_such_option": 1})
    assert bad.status_code == 422
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0
    assert admin.get(f"/v1/datasets/{ds}/audit").json()["entries"] == before
    ok = release(admin, ds, 0.5).json()
    downloads = {admin.get(f"/v1/releases/{ok['id']}/labels").content for _ in range(3)}
    assert len(downloads) == 1
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0.5


def test_3_3_a_mechanism_failing_after_reading_the_labels_is_charged(make_server: Any) -> None:
    """Whether a mechanism fails can depend on the labels (an LP on a noisy prior):
    rolled back, the failure was a free and repeatable query of them."""
    admin = make_server(LABELDP_TEST_CRASH_POINT="release_mechanism_fails").start().client()
    ds = create_dataset(admin, epsilon_budget=1)
    assert upload_labels(admin, ds, ["a", "b"], [1.0, 2.0]).status_code == 200
    for _attempt in range(2):  # the retry replays the failure: nothing more is spent
        r = release(admin, ds, 0.25, mechanism={"name": "rr-on-bins"}, idempotency_key="k")
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["error"] == "release_failed"
        assert "injected" not in body["message"]  # the reason is withheld
        assert body["detail"]["epsilon_spent"] == "0.25"
        assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0.25
    other = release(admin, ds, 0.5, mechanism={"name": "rr-on-bins"}, idempotency_key="k")
    assert other.json()["error"] == "idempotency_conflict"
    assert admin.get(f"/v1/datasets/{ds}/releases").json() == []
    actions = [e["action"] for e in admin.get(f"/v1/datasets/{ds}/audit").json()["entries"]]
    assert actions.count("release.failed") == 1 and actions[-1] == "release.failed"
    assert admin.get("/v1/audit/verify").json()["ok"] is True
    # The labels were read and paid for: they are frozen, as after a release.
    assert upload_labels(admin, ds, ["a", "b"], [3.0, 4.0]).status_code == 409


def test_3_3_a_release_file_the_disk_refuses_is_charged(
    make_server: Any, database_url: str
) -> None:
    """A release file's size depends on its noisy labels, so whether the disk takes
    it must not be a free, repeatable query. A server whose files stop at 64 KiB
    (``ulimit -f``: a real EFBIG) charges the release it cannot write, as any
    failure after the labels are read (the same answer on replay); a release the
    free space plainly cannot hold is refused before any ε. Postgres: on SQLite
    the limit would refuse the database's writes too."""
    if not database_url.startswith("postgresql"):
        pytest.skip("ulimit -f would refuse the SQLite database's writes too")
    admin = make_server().start().client()  # writes the labels, without a limit
    ds = create_dataset(admin, epsilon_budget=1)
    n = 20_000  # Laplace noise is incompressible: 8 bytes a label, far past 64 KiB
    assert upload_labels(admin, ds, [f"e{i}" for i in range(n)], [1.0] * n).status_code == 200
    limited = make_server(subprocess=True).start(file_size_limit=64 << 10).client()
    answers = [release(limited, ds, 0.25, idempotency_key="full") for _ in range(2)]
    assert [r.status_code for r in answers] == [422, 422], answers[0].text
    assert answers[0].json() == answers[1].json()  # the replay says the same, spends nothing
    assert answers[0].json()["error"] == "release_failed"
    assert answers[0].json()["detail"]["epsilon_spent"] == "0.25"
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0.25
    actions = [e["action"] for e in admin.get(f"/v1/datasets/{ds}/audit").json()["entries"]]
    assert actions.count("release.failed") == 1 and actions[-1] == "release.failed"
    huge = make_server().start(LABELDP_RELEASE_BYTES_PER_LABEL=str(1 << 50)).client()
    r = release(huge, ds, 0.25)
    assert r.status_code == 507 and r.json()["error"] == "storage_unavailable", r.text
    assert set(r.json()["detail"]) == {"needed_bytes"}  # not the disk's free space
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0.25
    assert admin.get("/v1/audit/verify").json()["ok"] is True


def test_3_3_a_storage_error_that_does_not_depend_on_the_labels_spends_nothing(
    make_server: Any,
) -> None:
    """A missing labels file, or a releases directory that cannot be created, fails
    the same whatever the labels: no charge (an operator's mistake must not burn ε)."""
    server = make_server().start()
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=1)
    assert upload_labels(admin, ds, ["a", "b"], [1.0, 2.0]).status_code == 200
    data = Path(server.env["LABELDP_DATA_DIR"])
    releases = data / "releases"
    shutil.rmtree(releases, ignore_errors=True)
    releases.write_text("not a directory")
    try:
        r = release(admin, ds, 0.25)
        assert r.status_code >= 500, r.text
    finally:
        releases.unlink()
    for labels_file in (data / "labels" / ds).iterdir():
        labels_file.unlink()
    assert release(admin, ds, 0.25).status_code >= 500
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0
    assert admin.get("/v1/audit/verify").json()["ok"] is True


def test_3_3_an_io_error_after_the_labels_are_read_is_rolled_back(make_server: Any) -> None:
    """An OS error that does not depend on what was written (here EIO, injected once
    the release's file is written) rolls back: only the disk having no room for the
    file is charged."""
    server = make_server(LABELDP_TEST_CRASH_POINT="release_io_error").start()
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=1)
    assert upload_labels(admin, ds, ["a", "b"], [1.0, 2.0]).status_code == 200
    r = release(admin, ds, 0.25, idempotency_key="io")
    assert r.status_code == 500 and r.json()["error"] == "internal_error", r.text
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0
    actions = [e["action"] for e in admin.get(f"/v1/datasets/{ds}/audit").json()["entries"]]
    assert "release.failed" not in actions


def test_3_3_a_fit_that_fails_whatever_the_labels_is_a_free_refusal(server: Server) -> None:
    """Checked at the release's own ε₂ before anything is reserved: the LP at ε ≈ 50
    fails for every prior, and the preflight at ε/2 passed, so it was charged."""
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=100)
    assert upload_labels(admin, ds, ["a", "b"], [1.0, 2.0]).status_code == 200
    r = release(admin, ds, 50, mechanism={"name": "unbiased"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0


def test_3_2_a_mechanism_not_private_by_itself_is_never_released(server: Server) -> None:
    """randomized-rounding is unbiased but not private: it may be previewed (no
    label is read), and a release of it is a free 422, in the CLI's choices or not."""
    from label_party.cli import RELEASABLE

    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=10)
    assert upload_labels(admin, ds, ["a", "b"], [1.0, 2.0]).status_code == 200
    r = release(admin, ds, 1, mechanism={"name": "randomized-rounding"})
    assert r.status_code == 422 and "cannot be released" in r.json()["message"], r.text
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0
    assert "randomized-rounding" not in RELEASABLE and "rr-on-bins" in RELEASABLE


def test_a_solver_crash_is_a_mechanism_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """A solver's IndexError went through as a free 500 after the reservation, and
    whether it happened depended on the noisy prior; ``fit`` now makes every
    failure a MechanismError, which a release charges."""
    import numpy as np

    from label_party.mechanisms import registry
    from label_party.mechanisms.base import MechanismError

    def crash(_request: object) -> None:
        raise IndexError("index 0 is out of bounds for axis 0 with size 0")

    spec = registry.get_spec("unbiased")
    monkeypatch.setattr(registry, "get_spec", lambda _name: replace(spec, factory=crash))
    with pytest.raises(MechanismError, match=r"could not be fitted \(IndexError\)"):
        registry.fit("unbiased", epsilon=1.0, values=np.arange(3.0), prior=np.ones(3) / 3)


def test_3_1_a_discrete_release_succeeds_whatever_the_labels_values(server: Server) -> None:
    """A discrete mechanism refused fractional labels, after its reservation was
    rolled back: per part of a client's plan, whether the label was an integer."""
    admin = server.client()
    ds = create_dataset(admin, domain={"min": 0, "max": 10, "step": 1}, epsilon_budget=10)
    ids = ["a", "b", "c"]
    assert upload_labels(admin, ds, ids, [3.0, 4.5, 9.25]).status_code == 200
    plan = parquet_bytes({"example_id": ids, "part": ids})
    assert admin.post(f"/v1/datasets/{ds}/partitions", files={"file": ("p.parquet", plan)})
    for part in ids:
        for name in ("laplace", "staircase"):
            mechanism = {"name": name, "discrete": True, "clip": True}
            r = release(admin, ds, 1, mechanism=mechanism, parts=[part])
            assert r.status_code == 201, r.text
            labels = admin.get(f"/v1/releases/{r.json()['id']}/labels?format=json").json()
            assert float(labels["label"][0]).is_integer()


def test_3_4_composition_is_per_part(server: Server) -> None:
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=1)
    ids = ["a", "b", "c", "d"]
    assert upload_labels(admin, ds, ids, [1.0, 2.0, 3.0, 4.0]).status_code == 200
    plan = parquet_bytes({"example_id": ids, "part": ["x", "x", "y", "y"]})
    assert admin.post(f"/v1/datasets/{ds}/partitions", files={"file": ("p.parquet", plan)})
    assert release(admin, ds, 1.0, parts=["x"]).status_code == 201
    assert release(admin, ds, 1.0, parts=["y"]).status_code == 201  # other examples
    assert release(admin, ds, 0.1, parts=["x"]).status_code == 409
    assert release(admin, ds, 0.1).status_code == 409


def test_3_5_randomness_comes_from_the_os(server: Server) -> None:
    admin = server.client()
    ds = create_dataset(admin, epsilon_budget=2)
    assert upload_labels(admin, ds, [f"e{i}" for i in range(50)], [5.0] * 50).status_code == 200
    one, two = release(admin, ds, 0.5).json(), release(admin, ds, 0.5).json()
    assert one["sha256"] != two["sha256"]  # same request, fresh randomness
    seeded = release(admin, ds, 0.5, mechanism={"name": "laplace", "seed": 1})
    assert seeded.status_code == 422
    with pytest.raises(ValueError, match="TEST_SEED"):
        Settings(mode="production", admin_token="a-long-enough-production-secret", test_seed=1)
