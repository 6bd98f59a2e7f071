"""Files whose columns have types no upload means (lists, structs, binary, unsigned
64-bit integers past 2⁶³) are 422s naming the column and its type: pyarrow's casts
raised on them, and every upload endpoint answered 500 (a reviewer's list)."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from shared.pagination import every_row
from tests.label_party.conftest import Server
from tests.label_party.helpers import create_dataset, upload_labels
from tests.label_party.test_trainings import CHEAP, make_dataset, tabular

BIG = 2**64 - 1


def _parquet(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def _refused(r: httpx.Response, *words: str) -> None:
    assert r.status_code == 422, r.text
    assert all(word in r.json()["message"] for word in words), r.text


def _labels(admin: httpx.Client, ds: str, name: str, body: bytes) -> httpx.Response:
    return admin.post(f"/v1/datasets/{ds}/labels", files={"file": (name, body)})


def test_labels_with_unusable_id_or_label_types(server: Server) -> None:
    admin = server.client()
    ds = create_dataset(admin)
    labels = pa.array([1.0, 2.0])
    for ids in (pa.array([[1], [2]]), pa.array([{"a": 1}, {"a": 2}]), pa.array([b"a", b"b"])):
        body = _parquet(pa.table({"example_id": ids, "label": labels}))
        _refused(_labels(admin, ds, "l.parquet", body), "example_id", "text or integers")
    jsonl = b'{"example_id": {"a": 1}, "label": 5}\n'
    assert _labels(admin, ds, "l.jsonl", jsonl).status_code == 422
    array = b'[{"example_id": "u1", "label": 5}, {"example_id": "u2", "label": 6}]'
    _refused(_labels(admin, ds, "l.jsonl", array), "one object per line")
    huge = _parquet(pa.table({"example_id": ["a"], "label": pa.array([BIG], pa.uint64())}))
    r = _labels(admin, ds, "l.parquet", huge)
    assert r.status_code == 422 and r.json()["detail"]["rows"][0]["row"] == 1, r.text
    assert str(BIG) not in r.text  # the row and the reason, never the value
    assert admin.get(f"/v1/datasets/{ds}").json()["num_labels"] in (None, 0)


def test_files_whose_column_names_are_not_utf8_are_refused(server: Server) -> None:
    """pyarrow raised UnicodeDecodeError decoding a Latin-1 header: a 500 for labels
    and for a training's features (helper-71)."""
    admin = server.client()
    ds = create_dataset(admin)
    _refused(_labels(admin, ds, "l.csv", b"example_id,label\xe9\nu1,1\n"), "UTF-8")
    ds, _ids, _labels_of = make_dataset(admin)
    spec = {"epsilon": 1, "delta": 1e-5, "architecture": "mlp", **CHEAP}
    r = admin.post(f"/v1/datasets/{ds}/trainings",
                   files={"file": ("f.csv", b"example_id,\xe9ge\nu1,1\n")},
                   data={"spec": json.dumps(spec)})  # fmt: skip
    _refused(r, "UTF-8")
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0


def test_plans_and_prior_sets_with_unusable_key_types(server: Server) -> None:
    admin = server.client()
    ds = create_dataset(admin, task="classification", domain={"num_classes": 3})
    assert upload_labels(admin, ds, ["a", "b"], [0, 1]).status_code == 200
    struct_parts = _parquet(pa.table({"example_id": ["a", "b"], "part": [{"x": 1}, {"x": 2}]}))
    r = admin.post(f"/v1/datasets/{ds}/partitions", files={"file": ("p.parquet", struct_parts)})
    _refused(r, "part", "text or integers")
    list_ids = _parquet(pa.table({"example_id": [["a"], ["b"]], "group": ["g", "h"]}))
    r = admin.post(f"/v1/datasets/{ds}/priors", files={"file": ("g.parquet", list_ids)},
                   data={"kind": "groups"})  # fmt: skip
    _refused(r, "example_id")
    huge = pa.array([[BIG, 0, 0], [0, 1, 0]], pa.list_(pa.uint64()))
    rows = _parquet(pa.table({"example_id": ["a", "b"], "prior": huge}))
    r = admin.post(f"/v1/datasets/{ds}/priors", files={"file": ("p.parquet", rows)},
                   data={"kind": "probabilities"})  # fmt: skip
    assert r.status_code in (201, 422), r.text  # a valid (if lopsided) prior, or refused


def test_training_features_with_unusable_types(server: Server) -> None:
    admin = server.client()
    ds, ids, labels = make_dataset(admin)
    spec: dict[str, Any] = {"epsilon": 1, "delta": 1e-5, "architecture": "mlp", **CHEAP}

    def submit(features: bytes) -> httpx.Response:
        return admin.post(f"/v1/datasets/{ds}/trainings",
                          files={"file": ("f.parquet", features)},
                          data={"spec": json.dumps(spec)})  # fmt: skip

    table = pq.read_table(io.BytesIO(tabular(ids, labels)))
    listed = table.set_column(0, "example_id", pa.array([[i] for i in ids]))
    _refused(submit(_parquet(listed)), "example_id", "text or integers")
    wide = table.append_column("x9", pa.array([BIG] * len(ids), pa.uint64()))
    assert submit(_parquet(wide)).status_code in (201, 422)  # never a 500
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] <= 1


def test_json_lines_nested_thousands_deep_are_refused_not_a_crash(make_server: Any) -> None:
    """pyarrow's JSON reader segfaulted on 20–200 KB of ``[``: any client with an upload
    killed the server and every request in flight. The server runs as a process of
    its own here, so that a crash fails this test rather than the test run."""
    server = make_server(subprocess=True).start()
    admin = server.client()
    ds = create_dataset(admin, task="classification", domain={"num_classes": 3})
    assert upload_labels(admin, ds, ["a", "b"], [0, 1]).status_code == 200
    deep = b'{"example_id": "a", "part": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    uploads = [
        (f"/v1/datasets/{ds}/labels", {}, deep.replace(b'"part"', b'"label"')),
        (f"/v1/datasets/{ds}/partitions", {}, deep),
        (f"/v1/datasets/{ds}/priors", {"kind": "groups"}, deep.replace(b'"part"', b'"group"')),
        # json.loads reads a probabilities file's first row for its columns: it recursed.
        (f"/v1/datasets/{ds}/priors", {"kind": "probabilities"},
         deep.replace(b'"part"', b'"prior"')),
        (f"/v1/datasets/{ds}/trainings", {"spec": json.dumps({"epsilon": 1})},
         deep.replace(b'"part"', b'"x"')),
    ]  # fmt: skip
    for path, data, body in uploads:
        r = admin.post(path, files={"file": ("f.jsonl", body)}, data=data)
        _refused(r, "deeper than 64")
        assert admin.get("/healthz").status_code == 200, path
    # Brackets inside strings are text: an id like "[[[…" is an id.
    texty = b'{"example_id": "' + b"[" * 200 + b'", "label": 1}\n{"example_id": "b", "label": 2}\n'
    assert _labels(admin, ds, "l.jsonl", texty).status_code == 200
    assert admin.get(f"/v1/datasets/{ds}/budget").json()["epsilon_spent"] == 0


def test_json_lines_ids_without_text_are_typed_like_arrow_types_them() -> None:
    """Ids ``true``/``false`` were stored as "true"/"false" when another column sent
    the file down the text path (a label ``"2"``); booleans are no ids."""
    from label_party.exceptions import InvalidLabelsError
    from label_party.labels.validation import read_table

    data = b'{"example_id": true, "label": 1}\n{"example_id": false, "label": "2"}\n'
    try:
        read_table(io.BytesIO(data), "jsonl")
    except InvalidLabelsError as exc:
        assert exc.message == "example_id must be text or integers; the file's column is bool"
    else:
        raise AssertionError("boolean ids were accepted")
    mixed = b'{"example_id": 1, "label": 1}\n{"example_id": "c", "label": "2"}\n'
    assert read_table(io.BytesIO(mixed), "jsonl").column("example_id").to_pylist() == ["1", "c"]


def test_json_lines_ids_that_look_like_dates_are_text_as_written() -> None:
    """Arrow's JSON reader typed them timestamp[s], and the file was refused as ids
    of that type unless another id in it was not a date (helper-78)."""
    from label_party.labels.validation import read_table

    dates = (b'{"example_id": "2024-01-01", "label": 1}\n'
             b'{"example_id": "2024-01-02 00:00:00", "label": 2}\n')  # fmt: skip
    ids = read_table(io.BytesIO(dates), "jsonl").column("example_id").to_pylist()
    assert ids == ["2024-01-01", "2024-01-02 00:00:00"]


def test_a_file_naming_a_column_it_reads_twice_is_refused(server: Server) -> None:
    """Arrow's CSV reader kept the first of two ``label`` (or ``example_id``)
    columns and dropped the other without a word; the features party refuses it."""
    admin = server.client()
    ds = create_dataset(admin)
    for body in (b"example_id,label,label\nu1,1,2\n", b"example_id,example_id,label\nu1,u2,1\n"):
        _refused(_labels(admin, ds, "l.csv", body), "more than once")
    twice = pa.table([pa.array(["u1"]), pa.array([1.0]), pa.array([2.0])],
                     names=["example_id", "label", "label"])  # fmt: skip
    _refused(_labels(admin, ds, "l.parquet", _parquet(twice)), "label more than once")
    parts = b"example_id,part,part\nu1,a,b\n"
    r = admin.post(f"/v1/datasets/{ds}/partitions", files={"file": ("p.csv", parts)})
    _refused(r, "part more than once")
    # An unread column may repeat.
    assert _labels(admin, ds, "l.csv", b"example_id,x,x,label\nu1,a,b,1\n").status_code == 200
    # A name past Arrow's 1 MiB block, or the csv module's 128 KiB field limit (a
    # 500 on the error path that names missing columns), is a file-level 422.
    for size in (1 << 20, 1 << 18):
        long = b"example_id,label," + b"y" * size + b"\nu2,1,z\n"
        assert _labels(admin, ds, "l.csv", long).status_code in (200, 422)
        assert _labels(admin, ds, "l.csv", long.replace(b"label,", b"")).status_code == 422


def test_json_naming_a_key_twice_is_refused_not_read_last_wins(server: Server) -> None:
    """``{"epsilon_budget": 1, "epsilon_budget": 5}`` made a dataset with a budget of 5
    (the last), and a JSON-lines label naming ``label`` twice was stored with its
    last value, while whoever read the request saw the first (helper-70)."""
    admin = server.client()
    body = (b'{"name": "twice", "task": "regression", "label_domain": {"min": 0, "max": 10},'
            b' "epsilon_budget": 1, "epsilon_budget": 5}')  # fmt: skip
    r = admin.post("/v1/datasets", content=body, headers={"Content-Type": "application/json"})
    _refused(r, "'epsilon_budget' twice")
    assert r.json()["detail"][0]["type"] == "duplicate_key"
    nested = body.replace(b'"max": 10}', b'"max": 10, "min": 3}').replace(
        b', "epsilon_budget": 5', b""
    )
    _refused(admin.post("/v1/datasets", content=nested), "'min' twice")  # no content type
    # JSON after a UTF-8 byte-order mark, and in UTF-16 or UTF-32, which FastAPI reads
    # as json.loads does: a gate on a leading "{" let them through (helper-81).
    text = body.decode()
    for encoded in (b"\xef\xbb\xbf" + body, *(text.encode(c) for c in ("utf-16", "utf-32-be"))):
        r = admin.post(
            "/v1/datasets", content=encoded, headers={"Content-Type": "application/json"}
        )
        _refused(r, "'epsilon_budget' twice")
    names = [d["name"] for d in every_row(admin.get("/v1/datasets"), admin.get)]
    assert "twice" not in names
    ds = create_dataset(admin)
    twice = b'{"example_id": "u1", "label": 1}\n{"example_id": "u2", "label": 2, "label": 9}\n'
    r = _labels(admin, ds, "l.jsonl", twice)
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["rows"] == [
        {"row": 2, "reason": "the key 'label' appears twice in one object"}
    ]
    assert admin.get(f"/v1/datasets/{ds}").json()["num_labels"] in (None, 0)
