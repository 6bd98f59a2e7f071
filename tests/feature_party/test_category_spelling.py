"""A categorical column names the same category whichever way its rows arrive:
the feature set's upload (types inferred, or declared categorical), a prediction
file (categorical columns read as text) or JSON rows (booleans)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feature_party.feature_sets.ingest import ingest, read_table
from feature_party.feature_sets.schemas import SchemaDeclaration
from feature_party.models.service import _rows_table
from feature_party.training.data import Preprocessing, fit_preprocessing
from shared.columns import as_categories, as_numbers

FLAGS = ["True", "False", "TRUE", "false", "True"]


def _csv(tmp_path: Path) -> Path:
    path = tmp_path / "features.csv"
    lines = ["example_id,flag,x"] + [f"e{i},{f},{i}" for i, f in enumerate(FLAGS)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("declared", [False, True])
def test_a_boolean_column_is_one_category_by_csv_json_and_parquet(
    tmp_path: Path, declared: bool
) -> None:
    """Undeclared, a CSV column of True/False was read as booleans ("true") at upload
    and as text ("True") in a prediction file: every row fell into the
    unknown-category bucket and the model predicted other numbers, with no error."""
    schema = SchemaDeclaration(categorical=["flag"]) if declared else None
    stored = ingest(_csv(tmp_path), filename="features.csv", schema=schema)
    assert stored.roles.categorical == ("flag",)
    preprocessing = fit_preprocessing(stored.table, stored.roles)
    assert preprocessing.vocabularies[0] == ["true", "false"]  # most frequent first
    expected = [1, 2, 1, 2, 1]

    by_file = read_table(_csv(tmp_path), filename="rows.csv", text_columns=["flag"])
    booleans = [{"true": True, "false": False}.get(f.lower()) for f in FLAGS]
    by_json = _rows_table([{"flag": b, "x": float(i)} for i, b in enumerate(booleans)])
    parquet = tmp_path / "rows.parquet"
    pq.write_table(
        pa.table({"flag": booleans, "x": [float(i) for i in range(len(FLAGS))]}), parquet
    )
    by_parquet = read_table(parquet, filename="rows.parquet", text_columns=["flag"])
    for rows in (by_file, by_json, by_parquet):
        codes = preprocessing.transform(rows).categorical[:, 0].tolist()
        assert codes == expected, rows.schema


def test_an_older_model_s_text_spelling_still_matches() -> None:
    """A vocabulary learned before the spellings were one category ("True")."""
    stored = pa.table({"example_id": ["a", "b"], "flag": ["True", "False"], "x": [0.0, 1.0]})
    old = Preprocessing(numeric=["x"], means=[0.0], stds=[1.0], categorical=["flag"],
                        vocabularies=[["True", "False"]])  # fmt: skip
    assert old.transform(stored).categorical[:, 0].tolist() == [1, 2]


def test_ones_and_zeros_beside_true_and_false_are_categories_as_written(tmp_path: Path) -> None:
    """pyarrow's default true values include "1": a column of true, false, 1 and 0
    was read as booleans at upload, while a prediction reads the column as text, so
    its "1" rows (199 of the 200 true ones here) fell into the unknown bucket."""
    path = tmp_path / "features.csv"
    flags = ["true", "false"] + ["1", "0"] * 100
    path.write_text("example_id,flag,x\n" + "".join(
        f"e{i},{f},{i}\n" for i, f in enumerate(flags)))  # fmt: skip
    stored = ingest(path, filename="features.csv", schema=None)
    assert stored.roles.categorical == ("flag",)
    preprocessing = fit_preprocessing(stored.table, stored.roles)
    assert sorted(preprocessing.vocabularies[0]) == ["0", "1", "false", "true"]
    rows = _rows_table([{"flag": "1", "x": 0.0}, {"flag": "zzz", "x": 0.0}])
    one, unknown = preprocessing.transform(rows).categorical[:, 0].tolist()
    assert one != unknown and preprocessing.vocabularies[0][one - 1] == "1"


def test_a_json_value_names_one_category_whatever_the_other_rows_hold() -> None:
    """Alone, a column of 1.0 was read as numbers (category "1"); beside a string it
    was written by json.dumps ("1.0"): one value, two categories, by its neighbours."""
    from feature_party.errors import InvalidInputError

    def first(rows: list[dict[str, object]]) -> object:
        return as_categories(_rows_table(rows).column("code"), "code")[0].as_py()

    for value in (1.0, 2.5, True, 3, 10**30):
        assert first([{"code": value}]) == first([{"code": value}, {"code": "x"}]), value
    with pytest.raises(InvalidInputError, match=r"'code' holds a list or an object \(row 2\)"):
        _rows_table([{"code": "x"}, {"code": [1]}])


def test_a_whole_number_float_is_one_category_by_parquet_csv_and_json(tmp_path: Path) -> None:
    """Categories from a Parquet float column were stored as Arrow writes them ("2",
    "-0"), a pandas CSV of the same column says "2.0": a model trained from one put
    every row of the other in its unknown bucket and answered 200, one constant."""
    values = [-2.0, -0.0, 0.0, 2.0, 2.5, 12345678901.0]  # the last: "1.2345678901e+10"
    trained = tmp_path / "features.parquet"
    pq.write_table(pa.table({"example_id": [f"e{i}" for i in range(6)], "g": values}), trained)
    stored = ingest(trained, filename="features.parquet",
                    schema=SchemaDeclaration(categorical=["g"]))  # fmt: skip
    preprocessing = fit_preprocessing(stored.table, stored.roles)
    assert sorted(preprocessing.vocabularies[0]) == ["-2", "0", "12345678901", "2", "2.5"]
    csv = tmp_path / "rows.csv"  # as pandas' to_csv writes them
    csv.write_text("g\n-2.0\n-0.0\n0.0\n2.0\n2.5\n12345678901.0\n")
    by_file = read_table(csv, filename="rows.csv", text_columns=["g"])
    by_json = _rows_table([{"g": v} for v in values])
    by_json_ints = _rows_table([{"g": int(v) if v.is_integer() else v} for v in values])
    expected = preprocessing.transform(stored.table).categorical[:, 0].tolist()
    assert 0 not in expected and expected[1] == expected[2]
    for rows in (by_file, by_json, by_json_ints):
        assert preprocessing.transform(rows).categorical[:, 0].tolist() == expected
    # Text that only looks like a number keeps its spelling: a zip code, a version.
    assert as_categories(pa.array(["02139", "1.10", "1.1"]), "g").to_pylist() == [
        "02139",
        "1.10",
        "1.1",
    ]


def test_a_half_float_column_is_a_category_and_a_number(tmp_path: Path) -> None:
    """Arrow's compute functions have no half-float kernels: a float16 column
    declared categorical was a 500 at upload (and at predict; helper-71)."""
    half = pa.array([1.0, 2.5, -0.0, 2.0], pa.float16())
    assert as_categories(half, "h").to_pylist() == ["1", "2.5", "0", "2"]
    assert as_numbers(half, "h").to_pylist() == [1.0, 2.5, -0.0, 2.0]
    path = tmp_path / "half.parquet"
    pq.write_table(pa.table({"example_id": ["a", "b", "c", "d"], "h": half}), path)
    stored = ingest(path, filename="half.parquet", schema=SchemaDeclaration(categorical=["h"]))
    assert sorted(stored.table.column("h").to_pylist()) == ["0", "1", "2", "2.5"]
