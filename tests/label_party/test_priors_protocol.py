"""Classification with priors (issue 6, labels-party side), against a real server
on SQLite and Postgres: prior sets (``POST /v1/datasets/{id}/priors``) of kind
``groups`` and ``probabilities``, and ``rr-with-prior`` releases with
``prior_source`` ``groups`` / ``example``; the per-part ledger of an LP-MST plan."""

from __future__ import annotations

import hashlib
import io
import json
import random
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from label_party.priors import group_counts, group_histograms, noise_scale
from tests.label_party.conftest import Server
from tests.label_party.helpers import create_client, create_dataset, parquet_bytes, upload_labels

pytestmark = pytest.mark.slow

K = 4


def _classification(admin: httpx.Client, budget: float = 2.0) -> str:
    return create_dataset(
        admin, task="classification", domain={"num_classes": K}, epsilon_budget=budget
    )


def _concentrated(n: int, seed: int = 0) -> tuple[list[str], np.ndarray, np.ndarray]:
    """3 groups; group g's labels are class g w.p. 0.85, else uniform over K."""
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, 3, size=n)
    labels = np.where(rng.random(n) < 0.85, groups, rng.integers(0, K, size=n))
    return [f"ex{i}" for i in range(n)], labels, groups


def _upload_priors(
    client: httpx.Client, ds: str, kind: str, body: bytes, name: str = "priors.parquet"
) -> httpx.Response:
    return client.post(
        f"/v1/datasets/{ds}/priors", files={"file": (name, body)}, data={"kind": kind}
    )


def _noisy(client: httpx.Client, release_id: str) -> dict[str, float]:
    r = client.get(f"/v1/releases/{release_id}/labels")
    assert r.status_code == 200
    table = pq.read_table(io.BytesIO(r.content))
    return dict(
        zip(table.column("example_id").to_pylist(), table.column("label").to_pylist(), strict=True)
    )


def _accuracy(noisy: dict[str, float], ids: list[str], labels: np.ndarray) -> float:
    return float(np.mean([noisy[i] == y for i, y in zip(ids, labels, strict=True)]))


def _release(
    client: httpx.Client, ds: str, mechanism: dict[str, Any], **extra: Any
) -> httpx.Response:
    body = {"mechanism": mechanism, "epsilon": 1.0, **extra}
    return client.post(f"/v1/datasets/{ds}/releases", json=body)


def _budget(client: httpx.Client, ds: str) -> dict[str, Any]:
    r = client.get(f"/v1/datasets/{ds}/budget")
    assert r.status_code == 200, r.text
    budget: dict[str, Any] = r.json()
    return budget


def test_group_priors_beat_rr_at_the_same_epsilon(server: Server) -> None:
    admin = server.client()
    client_id, token = create_client(admin, name="features")
    client = server.client(token)
    ds = _classification(admin, budget=2.0)
    assert admin.post(f"/v1/datasets/{ds}/grants", json={"client_id": client_id}).status_code == 201
    ids, labels, groups = _concentrated(3000)
    assert upload_labels(admin, ds, ids, labels.tolist()).status_code == 200

    # Groups as CSV with integer ids (stored as strings); label-independent.
    csv = "example_id,group\n" + "\n".join(f"{i},{g}" for i, g in zip(ids, groups, strict=True))
    r = _upload_priors(client, ds, "groups", csv.encode(), "groups.csv")
    assert r.status_code == 201, r.text
    prior_set = r.json()
    assert prior_set["kind"] == "groups" and prior_set["num_rows"] == 3000
    assert prior_set["num_groups"] == 3 and prior_set["num_unmatched"] == 0
    assert client.get(f"/v1/datasets/{ds}/priors/{prior_set['id']}").json()["id"] == prior_set["id"]
    assert [p["id"] for p in client.get(f"/v1/datasets/{ds}/priors").json()] == [prior_set["id"]]

    mechanism = {"name": "rr-with-prior", "prior_source": "groups", "prior_id": prior_set["id"]}
    r = _release(client, ds, mechanism, prior_epsilon=0.1)
    assert r.status_code == 201, r.text
    manifest = r.json()
    assert manifest["epsilon"] == 1.0 and manifest["prior_epsilon"] == 0.1
    assert manifest["mechanism"]["epsilon"] == pytest.approx(0.9)
    params = manifest["mechanism"]["params"]
    assert params["prior_source"] == "groups" and params["prior_id"] == prior_set["id"]
    assert params["groups"] == ["0", "1", "2"]
    group_priors = np.array(params["group_priors"])
    assert group_priors.shape == (3, K)
    np.testing.assert_allclose(group_priors.sum(axis=1), 1.0)
    assert list(group_priors.argmax(axis=1)) == [0, 1, 2]  # noisy, but informative
    assert sum(params["k_star_counts"].values()) == 3000
    assert manifest["prior"] is None and manifest["mechanism"]["matrix"] is None
    with_groups = _accuracy(_noisy(client, manifest["id"]), ids, labels)

    r = _release(client, ds, {"name": "rr"})
    assert r.status_code == 201, r.text
    plain = _accuracy(_noisy(client, r.json()["id"]), ids, labels)
    # RR at ε = 1, K = 4 keeps e/(e+3) ≈ 0.48; group priors give ≈ 0.89 (k* = 1).
    assert plain == pytest.approx(np.e / (np.e + 3), abs=0.05)
    assert with_groups > 0.8 and with_groups > plain + 0.25

    # Two releases over every example: ε_p counted once (not once per group).
    assert _budget(client, ds)["epsilon_spent"] == 2.0
    entries = admin.get(f"/v1/datasets/{ds}/audit").json()["entries"]
    uploaded = next(e for e in entries if e["action"] == "priors.uploaded")
    assert uploaded["actor"] == client_id and uploaded["payload"]["prior_id"] == prior_set["id"]
    assert uploaded["payload"]["kind"] == "groups" and uploaded["payload"]["num_groups"] == 3
    released = next(e for e in entries if e["action"] == "release.created")
    assert released["payload"]["prior_source"] == "groups"
    assert released["payload"]["prior_id"] == prior_set["id"]
    assert admin.get("/v1/audit/verify").json()["ok"] is True


def test_example_priors_release(server: Server) -> None:
    admin = server.client()
    ds = _classification(admin, budget=2.0)
    n = 2000
    rng = np.random.default_rng(1)
    ids = [f"ex{i}" for i in range(n)]
    labels = rng.integers(0, K, size=n)
    assert upload_labels(admin, ds, ids, labels.tolist()).status_code == 200

    # Near-perfect model outputs as a list column, plus 50 ids without labels.
    probs = np.full((n + 50, K), 0.01)
    probs[np.arange(n), labels] = 0.97
    probs[n:] = 0.25
    body = parquet_bytes(
        {"example_id": ids + [f"extra{i}" for i in range(50)], "prior": probs.tolist()}
    )
    r = _upload_priors(admin, ds, "probabilities", body)
    assert r.status_code == 201, r.text
    prior_set = r.json()
    assert prior_set["num_classes"] == K and prior_set["num_rows"] == n + 50
    assert prior_set["num_unmatched"] == 50

    mechanism = {"name": "rr-with-prior", "prior_source": "example", "prior_id": prior_set["id"]}
    r = _release(admin, ds, mechanism)
    assert r.status_code == 201, r.text
    manifest = r.json()
    # Post-processing of the features party's model: the whole ε goes to RRTop-k.
    assert manifest["prior_epsilon"] == 0 and manifest["mechanism"]["epsilon"] == 1.0
    assert manifest["mechanism"]["params"]["k_star_counts"] == {"1": n}
    assert "group_priors" not in manifest["mechanism"]["params"]
    assert _accuracy(_noisy(admin, manifest["id"]), ids, labels) == 1.0

    plain = _accuracy(_noisy(admin, _release(admin, ds, {"name": "rr"}).json()["id"]), ids, labels)
    assert plain < 0.6
    assert _budget(admin, ds)["epsilon_spent"] == 2.0


def test_prior_uploads_are_validated(server: Server) -> None:
    admin = server.client()
    ds = _classification(admin)
    ids = [f"ex{i}" for i in range(6)]
    good = [0.25] * K
    rows = [
        good,
        [0.5, 0.5, 0.1, -0.1],  # negative
        [0.5, 0.5, 0.5, 0.5],  # sums to 2
        [0.5, 0.5],  # wrong length
        [float("nan"), 0.5, 0.5, 0.0],  # NaN
        good,
    ]
    body = parquet_bytes({"example_id": [*ids[:5], "ex0"], "prior": rows})
    r = _upload_priors(admin, ds, "probabilities", body)
    assert r.status_code == 422 and r.json()["error"] == "invalid_priors"
    assert r.json()["detail"]["rows"] == [
        {"row": 1, "reason": "duplicate example_id"},
        {"row": 2, "reason": "probability is negative"},
        {"row": 3, "reason": "probabilities do not sum to 1"},
        {"row": 4, "reason": "wrong number of probabilities"},
        {"row": 5, "reason": "probability is missing, NaN or infinite"},
        {"row": 6, "reason": "duplicate example_id"},
    ]
    # K columns p_0 … p_{K−1} as JSON lines; a missing column is refused.
    lines = [json.dumps({"example_id": i, **{f"p_{j}": 0.25 for j in range(K)}}) for i in ids]
    r = _upload_priors(admin, ds, "probabilities", "\n".join(lines).encode(), "p.jsonl")
    assert r.status_code == 201, r.text
    assert r.json()["num_unmatched"] is None  # no labels yet
    lines = [json.dumps({"example_id": i, "p_0": 1.0}) for i in ids]
    r = _upload_priors(admin, ds, "probabilities", "\n".join(lines).encode(), "p.jsonl")
    assert r.status_code == 422 and "p_1" in r.json()["message"]
    # A list that starts with null: Arrow built an invalid column from it, a 500.
    line = json.dumps({"example_id": "ex0", "prior": [None, 0.5, 0.25, 0.25]}).encode()
    r = _upload_priors(admin, ds, "probabilities", line + b"\n", "p.jsonl")
    assert r.status_code == 422 and r.json()["error"] in {"invalid_priors", "invalid_request"}, (
        r.text
    )
    # CSV is for groups only; groups need a group.
    r = _upload_priors(admin, ds, "probabilities", b"example_id,p_0\nex0,1\n", "p.csv")
    assert r.status_code == 422
    r = _upload_priors(admin, ds, "groups", b"example_id,group\nex0,a\nex1,\n", "g.csv")
    assert r.status_code == 422
    assert r.json()["detail"]["rows"] == [{"row": 2, "reason": "missing group"}]
    assert (
        _upload_priors(admin, ds, "nope", b"example_id,group\nex0,a\n", "g.csv").status_code == 422
    )
    # Regression datasets take no example priors.
    reg = create_dataset(admin)
    assert (
        _upload_priors(admin, reg, "groups", b"example_id,group\nex0,a\n", "g.csv").status_code
        == 422
    )


def test_release_refuses_uncovered_scope_and_bad_requests(server: Server) -> None:
    admin = server.client()
    ds = _classification(admin, budget=1.0)
    ids, labels, groups = _concentrated(300, seed=2)
    assert upload_labels(admin, ds, ids, labels.tolist()).status_code == 200
    # Groups for all but the last 7 examples.
    body = parquet_bytes({"example_id": ids[:-7], "group": groups[:-7].tolist()})
    partial = _upload_priors(admin, ds, "groups", body).json()["id"]
    r = _release(
        admin, ds, {"name": "rr-with-prior", "prior_source": "groups", "prior_id": partial}
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["missing"] == 7
    assert r.json()["detail"]["example_ids"] == ids[-7:]
    assert _budget(admin, ds)["epsilon_spent"] == 0  # nothing spent

    groups_all = _upload_priors(
        admin, ds, "groups", parquet_bytes({"example_id": ids, "group": groups.tolist()})
    ).json()["id"]
    for mechanism, extra, status in [
        ({"name": "rr-with-prior", "prior_source": "example", "prior_id": groups_all}, {}, 422),
        ({"name": "rr-with-prior", "prior_source": "groups", "prior_id": "nope"}, {}, 404),
        ({"name": "rr-with-prior", "prior_source": "groups"}, {}, 422),
        ({"name": "rr-with-prior", "prior_source": "model", "prior_id": groups_all}, {}, 422),
        ({"name": "rr", "prior_source": "groups", "prior_id": groups_all}, {}, 422),
        (
            {"name": "rr-with-prior", "prior_source": "groups", "prior_id": groups_all, "k": 1},
            {},
            422,
        ),
        (
            {"name": "rr-with-prior", "prior_source": "example", "prior_id": groups_all},
            {"prior_epsilon": 0.1},
            422,
        ),
    ]:
        r = _release(admin, ds, mechanism, **extra)
        assert r.status_code == status, (mechanism, r.text)
    assert _budget(admin, ds)["epsilon_spent"] == 0


def test_lp_mst_ledger_per_part(server: Server) -> None:
    """The issue's ledger test: a plan of 3 parts, ε = 1 each, budget 1."""
    admin = server.client()
    client_id, token = create_client(admin, name="lp-mst")
    client = server.client(token)
    ds = _classification(admin, budget=1.0)
    assert admin.post(f"/v1/datasets/{ds}/grants", json={"client_id": client_id}).status_code == 201
    n = 900
    rng = np.random.default_rng(3)
    ids = [f"ex{i}" for i in range(n)]
    labels = rng.integers(0, K, size=n)
    assert upload_labels(admin, ds, ids, labels.tolist()).status_code == 200
    parts = [f"stage{1 + i % 3}" for i in range(n)]
    plan = parquet_bytes({"example_id": ids, "part": parts})
    r = client.post(f"/v1/datasets/{ds}/partitions", files={"file": ("plan.parquet", plan)})
    assert r.status_code == 201, r.text

    # Stage 1: plain RR on its part.
    r = _release(client, ds, {"name": "rr"}, parts=["stage1"])
    assert r.status_code == 201, r.text
    assert r.json()["num_labels"] == 300
    # Stages 2 and 3: per-example priors from "the model of the previous stage".
    for stage in ("stage2", "stage3"):
        members = [i for i, p in zip(ids, parts, strict=True) if p == stage]
        probs = rng.dirichlet(np.ones(K), size=len(members))
        body = parquet_bytes({"example_id": members, "prior": probs.tolist()})
        prior = _upload_priors(client, ds, "probabilities", body)
        assert prior.status_code == 201, prior.text
        mechanism = {
            "name": "rr-with-prior",
            "prior_source": "example",
            "prior_id": prior.json()["id"],
        }
        r = _release(client, ds, mechanism, parts=[stage])
        assert r.status_code == 201, r.text
        assert r.json()["num_labels"] == 300 and r.json()["parts"] == [stage]
        assert r.json()["prior_epsilon"] == 0

    budget = _budget(client, ds)
    assert {p["name"]: p["epsilon_spent"] for p in budget["parts"]} == {
        "stage1": 1.0,
        "stage2": 1.0,
        "stage3": 1.0,
    }
    assert budget["epsilon_spent"] == 1.0
    r = _release(client, ds, {"name": "rr"}, parts=["stage2"])
    assert r.status_code == 409 and r.json()["error"] == "budget_exceeded"
    assert _budget(client, ds) == budget
    assert admin.get("/v1/audit/verify").json()["ok"] is True


def test_group_prior_on_a_part_counts_and_charges_that_part_only(server: Server) -> None:
    """The per-group histograms count only the examples in the release's scope (the
    ones it charges); a prior set covering that part only is enough."""
    admin = server.client()
    ds = _classification(admin, budget=1.0)
    ids, labels, groups = _concentrated(600, seed=4)
    assert upload_labels(admin, ds, ids, labels.tolist()).status_code == 200
    parts = ["a" if i < 400 else "b" for i in range(600)]
    plan = parquet_bytes({"example_id": ids, "part": parts})
    assert (
        admin.post(f"/v1/datasets/{ds}/partitions", files={"file": ("p.parquet", plan)}).status_code
        == 201
    )
    body = parquet_bytes({"example_id": ids[:400], "group": groups[:400].tolist()})
    prior_id = _upload_priors(admin, ds, "groups", body).json()["id"]
    mechanism = {"name": "rr-with-prior", "prior_source": "groups", "prior_id": prior_id}
    assert _release(admin, ds, mechanism, parts=["b"]).status_code == 422  # b not covered
    r = _release(admin, ds, mechanism, parts=["a"])
    assert r.status_code == 201, r.text
    manifest = r.json()
    assert manifest["num_labels"] == 400 and 0 < manifest["prior_epsilon"] < 1
    assert sum(manifest["mechanism"]["params"]["k_star_counts"].values()) == 400
    spent = {p["name"]: p["epsilon_spent"] for p in _budget(admin, ds)["parts"]}
    assert spent == {"a": 1.0, "b": 0.0}


def test_group_histograms_are_epsilon_p_dp_over_all_groups() -> None:
    """Under substitution the G×K counts move by 2 in L1, inside one group, so the
    log-likelihood ratio of DLap(2/ε_p) noise on every cell is at most
    ‖a − b‖₁ / (2/ε_p) = ε_p, whatever G (parallel composition; the per-group
    release charges ε_p once)."""
    rng = np.random.default_rng(7)
    for num_groups in (1, 3, 50):
        for _ in range(50):
            n = int(rng.integers(1, 200))
            labels = rng.integers(0, K, size=n)
            groups = rng.integers(0, num_groups, size=n)
            neighbour = labels.copy()
            neighbour[int(rng.integers(0, n))] = int(rng.integers(0, K))
            _, a = group_counts(labels, groups, K, num_groups=num_groups)
            _, b = group_counts(neighbour, groups, K, num_groups=num_groups)
            eps_p = Fraction(1, 10)
            # Worst-case privacy loss over all outputs of the noisy matrix.
            loss = Fraction(int(np.abs(a - b).sum())) / noise_scale(eps_p)
            assert loss <= eps_p
    # One draw of noise for all G·K cells (not G draws at ε_p/G).
    ids, p = group_histograms(
        np.array([0, 1, 2]), np.array([0, 1, 2]), K, epsilon=0.1, num_groups=3, rng=random.Random(0)
    )
    assert p.shape == (3, K) and list(ids) == [0, 1, 2]


def test_prior_files_are_parquet_named_by_hash(server: Server) -> None:
    admin = server.client()
    ds = _classification(admin)
    body = parquet_bytes({"example_id": ["a", "b"], "group": [1, 2]})
    first = _upload_priors(admin, ds, "groups", body).json()
    second = _upload_priors(admin, ds, "groups", body).json()
    assert first["id"] != second["id"] and first["sha256"] == second["sha256"]
    path = Path(server.env["LABELDP_DATA_DIR"]) / "priors" / ds / f"{first['sha256']}.parquet"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == first["sha256"]
    stored = pq.read_table(path)
    assert stored.to_pydict() == {"example_id": ["a", "b"], "group": ["1", "2"]}


def test_a_groups_prior_set_past_a_million_noisy_counts_is_refused(server: Server) -> None:
    """A release draws one noisy count per group and class, one at a time under the
    dataset's lock: 10,000 groups of 20 classes took 4.8 s, and K = 100,000 would
    have taken hours (helper-80). Refused at upload, where both are public."""
    admin = server.client()
    ds = create_dataset(admin, task="classification", domain={"num_classes": 1000})
    n = 1001
    body = parquet_bytes({"example_id": [f"e{i}" for i in range(n)],
                          "group": [f"g{i}" for i in range(n)]})  # fmt: skip
    r = _upload_priors(admin, ds, "groups", body)
    assert r.status_code == 422, r.text
    assert r.json()["message"] == (
        "1001 groups × 1000 classes is more than the 1,000,000 noisy counts a groups "
        "release draws: use fewer groups"
    )
    assert admin.get(f"/v1/datasets/{ds}/priors").json() == []
    fewer = parquet_bytes({"example_id": [f"e{i}" for i in range(n)],
                           "group": [f"g{i % 1000}" for i in range(n)]})  # fmt: skip
    assert _upload_priors(admin, ds, "groups", fewer).status_code == 201
