"""Predictions read a file a batch at a time and send their answer in batches:
the rows an error names, the types a CSV's later rows hold, the answer's bytes,
and the memory a prediction takes against the file's size."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from feature_party.errors import InvalidInputError
from feature_party.models.service import PredictionAnswer, _predict, _rows_table, predict_path
from feature_party.training.artifact import Predictor
from feature_party.training.data import Preprocessing
from feature_party.training.losses import make_loss
from shared.torch_models import TabularMLP, TabularMLPConfig

#: Rows in a file that spans several of the CSV reader's 1 MiB blocks.
ROWS = 300_000


def _predictor(weight: float) -> Predictor:
    """Regression ``weight · x0`` (x0 scaled by mean 0, std 1), with a categorical
    column ``city`` the model reads but ignores."""
    config = TabularMLPConfig(num_numeric=1, vocab_sizes=(3,), hidden=(), outputs=1)
    model = TabularMLP(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.out.weight[0, 0] = weight
    pre = Preprocessing(numeric=["x0"], means=[0.0], stds=[1.0],
                        categorical=["city"], vocabularies=[["a", "b"]])  # fmt: skip
    return Predictor(model.eval(), pre, make_loss("squared"), "regression")


def _csv(path: Path, x0: list[str], ids: list[str] | None = None) -> Path:
    lines = ["example_id,x0,city,extra" if ids else "x0,city,extra"]
    for i, value in enumerate(x0):
        lines.append(f"{ids[i]},{value},a,zz" if ids else f"{value},a,zz")
    path.write_text("\n".join(lines) + "\n")
    return path


def _rows_answer(predictor: Predictor, rows: list[dict[str, object]]) -> PredictionAnswer:
    """What ``POST /v1/models/{id}/predict`` answers for JSON rows."""
    table = _rows_table(rows)
    return _predict(predictor, table.column_names, [table])


def _answer(answer: PredictionAnswer, batch: int = 65_536) -> dict[str, list[object]]:
    decoded: dict[str, list[object]] = json.loads(b"".join(answer.json_chunks(batch)))
    return decoded


def test_rows_an_error_names_are_counted_over_the_whole_file(tmp_path: Path) -> None:
    x0 = ["1.0"] * ROWS
    for row in (5, 250_000, 299_999):  # 0-based; past the first block for two of them
        x0[row] = "1e38"  # × 10 overflows float32: no finite prediction
    with pytest.raises(InvalidInputError) as refused:
        predict_path(_predictor(10.0), _csv(tmp_path / "rows.csv", x0), "rows.csv")
    assert refused.value.detail == {"rows": [6, 250_001, 300_000], "num_rows": 3}
    assert f"3 of {ROWS} rows" in refused.value.message


def test_ids_missing_in_later_rows_are_counted(tmp_path: Path) -> None:
    n = 200_000  # four of the Parquet reader's batches
    ids: list[str | None] = [f"u{i}" for i in range(n)]
    ids[100_000] = ids[199_000] = None
    table = pa.table({"x0": np.ones(n), "city": ["a"] * n, "example_id": ids})
    pq.write_table(table, tmp_path / "rows.parquet")
    with pytest.raises(InvalidInputError) as refused:
        predict_path(_predictor(1.0), tmp_path / "rows.parquet", "rows.parquet")
    assert refused.value.detail == {"rows_without_example_id": 2}


def test_a_later_block_may_hold_what_the_first_did_not(tmp_path: Path) -> None:
    """A reader that typed each column by its first block took x0 for integers and
    refused 2.5 two hundred thousand rows on; a value that is no number is refused."""
    x0 = ["1"] * ROWS
    x0[200_000], x0[200_001] = "2.5", ""  # a float, and a missing value (the mean: 0)
    ids = [f"{i:07d}" for i in range(ROWS)]  # text: leading zeros kept
    answer = _answer(predict_path(_predictor(2.0), _csv(tmp_path / "rows.csv", x0, ids), "r.csv"))
    assert answer["prediction"][200_000:200_002] == [5.0, 0.0]
    assert answer["prediction"][0] == 2.0 and len(answer["prediction"]) == ROWS
    assert answer["example_id"][:2] == ["0000000", "0000001"]
    x0[250_000] = "n/a?"
    with pytest.raises(InvalidInputError) as refused:
        predict_path(_predictor(1.0), _csv(tmp_path / "bad.csv", x0), "bad.csv")
    assert "column 'x0' holds a value that is not a number (row 250001)" in refused.value.message


def test_a_ragged_row_past_the_first_block_is_a_refusal_not_a_500(tmp_path: Path) -> None:
    """The rescan that names a non-number read the file again inside the handler of
    the first read's error, hit the same ragged row, and the error escaped (500)."""
    path = _csv(tmp_path / "ragged.csv", ["1.0"] * ROWS)
    lines = path.read_text().splitlines()
    lines[ROWS - 2] = "1.0,a"  # a field short, ~4 MiB in
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidInputError, match="cannot read the file"):
        predict_path(_predictor(1.0), path, "ragged.csv")


def test_a_parquet_file_predicts_by_batches(tmp_path: Path) -> None:
    n = 200_000  # four of the Parquet reader's batches
    x0 = np.arange(n, dtype=np.float64)
    table = pa.table({"x0": x0, "city": ["a"] * n, "example_id": [f"e{i}" for i in range(n)]})
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=50_000)
    answer = _answer(predict_path(_predictor(1.0), tmp_path / "rows.parquet", "rows.parquet"))
    assert answer["prediction"] == pytest.approx(x0.tolist())
    assert answer["example_id"][-1] == f"e{n - 1}"
    text = [str(v) for v in x0]
    text[150_000] = "many"  # a text column: the preprocessing names the cell's row
    pq.write_table(table.set_column(0, "x0", pa.array(text)), tmp_path / "text.parquet")
    with pytest.raises(InvalidInputError, match=r"not a number \(row 150001\)"):
        predict_path(_predictor(1.0), tmp_path / "text.parquet", "text.parquet")


def test_the_answer_is_what_a_json_response_wrote_of_it() -> None:
    """Streamed in batches of 2 (a boundary inside each list), the bytes are the
    whole answer's, as FastAPI's JSONResponse serialized it before."""
    ids = pa.chunked_array([["a", "é"], ['q"uote', "z", "y"]])
    values = np.array([0.1, -2.0, 1e-300, 3.0, 7], dtype=np.float64)
    whole = {"example_id": ids.to_pylist(), "prediction": values.tolist()}
    expected = json.dumps(whole, ensure_ascii=False, separators=(",", ":")).encode()
    assert b"".join(PredictionAnswer(ids, values).json_chunks(batch=2)) == expected
    numbered = PredictionAnswer(None, np.array([4, 5, 6], dtype=np.int64))  # classes
    assert _answer(numbered, batch=2) == {"example_id": ["0", "1", "2"],
                                          "prediction": [4.0, 5.0, 6.0]}  # fmt: skip
    empty = PredictionAnswer(None, np.zeros(0))
    assert _answer(empty) == {"example_id": [], "prediction": []}


#: Run in a fresh process: its peak resident memory is the prediction's.
_MEASURE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from tests.feature_party.test_prediction_stream import _predictor
    from feature_party.models.service import predict_path

    def kib(field):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith(field)).split()[1])

    predictor = _predictor(1.0)
    before = kib("VmRSS")
    answer = predict_path(predictor, Path(sys.argv[1]), "rows.csv")
    sent = sum(len(chunk) for chunk in answer.json_chunks())
    print((kib("VmHWM") - before) * 1024, sent)
    """
)


def test_a_prediction_holds_a_few_times_its_file_not_its_rows_as_objects(
    tmp_path: Path,
) -> None:
    """1,000,000 narrow rows (16 MB of CSV): read whole and answered as Python lists,
    the prediction's peak was 33× the file (``bench.bench_predict_memory``);
    read and answered by batches it is 7.2–7.8× here and was 8.2× once on CI (the
    Arrow reader's threads and glibc's arenas vary), so the bound is 10×."""
    n = 1_000_000
    path = tmp_path / "rows.csv"
    with path.open("w") as f:
        f.write("example_id,x0,city\n")
        f.writelines(f"u{i},{i % 97 / 10},a\n" for i in range(n))
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path), root],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    peak, sent = map(int, out.stdout.split())
    size = path.stat().st_size
    assert sent > size  # the answer is bigger than the file: ids and numbers again
    assert peak < 10 * size, f"peak {peak / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB file"


def test_a_prediction_gives_its_database_connection_back_before_it_reads_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It held the request's transaction, and its pooled connection, through
    reading and predicting the whole file: 75 predictions of a 100k-row file took
    the pool (5 + 10) and other requests got 503 (helper-72)."""
    from feature_party.db import Database, migrate
    from feature_party.models import service
    from feature_party.orm import Model
    from tests.feature_party.conftest import make_settings

    settings = make_settings(tmp_path)
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    with database.session() as session:
        session.add(Model(id="m1", job_id=None, path="models/m1.pt", task="regression",
                          loss="squared", metrics={}))  # fmt: skip
    with database.session() as session:
        held: list[bool] = []
        monkeypatch.setattr(
            service, "_predictor", lambda path: held.append(session.in_transaction())
        )
        service._loaded(session, settings, "m1")
        assert held == [False]
    database.dispose()


@pytest.mark.parametrize("header", ["id", "example_id ", "userId", "Example ID"])
def test_rows_numbered_beside_a_column_named_like_an_id_are_refused(
    tmp_path: Path, header: str
) -> None:
    """Without ``example_id`` rows are numbered from 0: a file of ``id,x0,city`` was
    answered with ids "0", "1", … that read as its own (helper-78)."""
    path = tmp_path / "rows.csv"
    path.write_text(f"{header},x0,city\n7,1.0,a\n5,2.0,b\n")
    with pytest.raises(InvalidInputError, match=f"{header!r} looks like one") as refused:
        predict_path(_predictor(1.0), path, "rows.csv")
    assert refused.value.detail == {"id_like_columns": [header]}
    path.write_text("x0,city,grid\n1.0,a,3\n2.0,b,4\n")  # no id-like name: numbered
    assert _answer(predict_path(_predictor(1.0), path, "rows.csv"))["example_id"] == ["0", "1"]


def test_json_rows_must_each_give_every_column() -> None:
    """A key left out of a row, or misspelt in it ("G"), was read as null, the
    training mean, and answered 200 (helper-78); ``null`` says that."""
    predictor = _predictor(1.0)
    rows: list[dict[str, object]] = [{"example_id": "a", "x0": 3.0, "city": "a"},
                                     {"example_id": "b", "x0": 1.0, "City": "b"}]  # fmt: skip
    with pytest.raises(InvalidInputError, match=r"row 1 lacks 'City'"):
        _rows_answer(predictor, rows)
    rows[1] = {"example_id": "b", "x0": None, "city": None}
    assert _answer(_rows_answer(predictor, rows))["prediction"] == [3.0, 0.0]


def test_true_and_false_are_not_numbers_at_prediction_as_at_upload(tmp_path: Path) -> None:
    """Arrow cast them to 1 and 0: a boolean ``x0`` was predicted for, while its
    upload is refused ("type bool is not numeric"; helper-78)."""
    rows: list[dict[str, object]] = [{"x0": True, "city": "a"}]
    with pytest.raises(InvalidInputError, match="'x0' holds true/false"):
        _rows_answer(_predictor(1.0), rows)
    pq.write_table(pa.table({"x0": [True, False], "city": ["a", "b"]}), tmp_path / "b.parquet")
    with pytest.raises(InvalidInputError, match="'x0' holds true/false"):
        predict_path(_predictor(1.0), tmp_path / "b.parquet", "b.parquet")


def test_string_view_columns_are_read_as_text(tmp_path: Path) -> None:
    """pyarrow writes ``string_view`` to Parquet and reads it back as such; an id
    column of it was refused as not text (helper-78)."""
    view = pa.string_view()
    table = pa.table({"example_id": pa.array(["e1", "e2"], view), "x0": [1.0, 2.0],
                      "city": pa.array(["a", "b"], view)})  # fmt: skip
    pq.write_table(table, tmp_path / "v.parquet")
    answer = _answer(predict_path(_predictor(2.0), tmp_path / "v.parquet", "v.parquet"))
    assert answer == {"example_id": ["e1", "e2"], "prediction": [2.0, 4.0]}
