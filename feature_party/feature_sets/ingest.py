"""Reading an uploaded feature file into a validated Arrow table.

Columnar throughout (pyarrow's multithreaded CSV reader, Parquet reader and
compute kernels): a 10-million-row file never becomes Python objects. Problems
are reported with 1-based data-row numbers (row 1 is the first row after a CSV
header) and column names, at most :data:`MAX_REPORTED` of each.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from feature_party.errors import InvalidInputError, PayloadTooLargeError
from feature_party.feature_sets.schemas import ColumnInfo, SchemaDeclaration
from feature_party.training.data import TARGET, ColumnRoles
from shared.columns import (
    FALSE_WORDS,
    NAMES_NOT_UTF8,
    TRUE_WORDS,
    ColumnTypeError,
    as_categories,
    as_keys,
    as_numbers,
)
from shared.parquet import ParquetTooLargeError, iter_parquet_bounded, read_parquet_bounded

MAX_REPORTED = 20
ID = "example_id"
_NUMBER = (
    r"^\s*[-+]?((\d+\.?\d*)|(\.\d+))([eE][-+]?\d+)?\s*$|^\s*[-+]?(nan|NaN|NAN|inf|Inf|infinity)\s*$"
)


@dataclass
class IngestedTable:
    table: pa.Table
    columns: list[ColumnInfo]
    roles: ColumnRoles


def _bad_file(message: str, detail: Any = None) -> InvalidInputError:
    return InvalidInputError(message, detail=detail, code="bad_file")


def _rows(mask: pa.ChunkedArray | pa.Array) -> list[int]:
    """1-based rows where ``mask`` is true (the first :data:`MAX_REPORTED`)."""
    idx = pc.indices_nonzero(pc.fill_null(mask, False))
    return [int(i) + 1 for i in idx.slice(0, MAX_REPORTED).to_pylist()]


#: Names of formats that are neither CSV nor Parquet, refused by name (anything
#: else that is not Parquet is read as CSV).
NOT_CSV = (".jsonl", ".json", ".ndjson", ".xlsx", ".xls", ".avro", ".orc", ".feather", ".arrow")


def read_table(path: Path, *, filename: str | None, text_columns: Collection[str] = ()) -> pa.Table:
    """Parquet (by magic bytes or suffix) or CSV. A CSV's ``example_id`` and
    ``text_columns`` (declared categorical) are read as text, so ``01234`` stays
    ``01234``; a CSV's other columns have their types inferred."""
    try:
        if _is_parquet(path, filename):
            table = read_parquet_bounded(path, memory_map=True)
        else:
            table = _read_csv(path, text_columns)
        _ = table.column_names  # the names are decoded here, inside the except below
        return table
    except ParquetTooLargeError as exc:
        raise PayloadTooLargeError(str(exc), detail={"limit": exc.limit}) from None
    except UnicodeDecodeError:
        raise _bad_file(NAMES_NOT_UTF8) from None
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise _bad_file(f"cannot read the file: {exc}") from None


def _read_csv(path: Path, text_columns: Collection[str]) -> pa.Table:
    return pacsv.read_csv(
        path,
        convert_options=pacsv.ConvertOptions(
            column_types={name: pa.string() for name in (ID, *text_columns)},
            # Words only: with pyarrow's default "1"/"0" a column of true, false,
            # 1 and 0 was read as booleans, and a prediction's text "1" (read as
            # text, like every categorical column there) was no known category.
            true_values=list(TRUE_WORDS),
            false_values=list(FALSE_WORDS),
        ),
    )


def _is_parquet(path: Path, filename: str | None) -> bool:
    """Parquet by its magic bytes or its name, else CSV; formats that are neither
    are refused by name."""
    with path.open("rb") as fh:
        magic = fh.read(4)
    name = (filename or "").lower()
    if magic != b"PAR1" and name.endswith(NOT_CSV):
        suffix = name.rsplit(".", 1)[-1]
        raise _bad_file(f"feature files are CSV or Parquet; this one is .{suffix}")
    return magic == b"PAR1" or name.endswith((".parquet", ".pq"))


@dataclass(frozen=True)
class FeatureFile:
    """An uploaded CSV or Parquet file, read a batch at a time: a prediction keeps
    its answer, not the file's rows."""

    path: Path
    parquet: bool
    #: The file's columns, in its order.
    names: list[str]

    @classmethod
    def open(cls, path: Path, filename: str | None) -> FeatureFile:
        parquet = _is_parquet(path, filename)
        try:
            if parquet:
                names = pq.ParquetFile(path, memory_map=True).schema_arrow.names
            else:
                names = pacsv.open_csv(path).schema.names
        except UnicodeDecodeError:
            raise _bad_file(NAMES_NOT_UTF8) from None
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
            raise _bad_file(f"cannot read the file: {exc}") from None
        return cls(path, parquet, names)

    def batches(self, columns: list[str], *, numeric: Collection[str]) -> Iterator[pa.Table]:
        """The rows of ``columns`` (each named once in the file). A CSV's
        ``numeric`` columns are read as numbers and its others as text, so no batch
        infers a type of its own (an integer column whose later rows hold 1.5)."""
        try:
            if self.parquet:
                for batch in iter_parquet_bounded(self.path, columns):
                    yield pa.Table.from_batches([batch])
                return
            numbers = set(numeric)  # a tuple's lookups made 12,000 columns quadratic
            types = {c: pa.float64() if c in numbers else pa.string() for c in columns}
            options = pacsv.ConvertOptions(column_types=types, include_columns=columns)
            # Blocks of pyarrow's default 1 MiB: 8 MiB ones held 4× the memory
            # (a reader runs ahead of its consumer) and were no faster.
            for batch in pacsv.open_csv(self.path, convert_options=options):
                yield pa.Table.from_batches([batch])
        except ParquetTooLargeError as exc:
            raise PayloadTooLargeError(str(exc), detail={"limit": exc.limit}) from None
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
            found = None if self.parquet else _first_non_number(self.path, numeric)
            raise _bad_file(found or f"cannot read the file: {exc}") from None


def _first_non_number(path: Path, numeric: Collection[str]) -> str | None:
    """Which CSV cell of the ``numeric`` columns is no number, as a whole-file read
    names it (column and 1-based row); None if none is. Read again as text, only
    once a batch has failed."""
    options = pacsv.ConvertOptions(
        column_types={name: pa.string() for name in numeric},
        include_columns=list(numeric),
        strings_can_be_null=True,  # the cells a numeric read takes for missing
    )
    rows = 0
    try:
        for batch in pacsv.open_csv(path, convert_options=options):
            for name in numeric:
                bad = _rows(pc.invert(pc.match_substring_regex(batch.column(name), _NUMBER)))
                if bad:
                    row = rows + bad[0]
                    return f"numeric column {name!r} holds a value that is not a number (row {row})"
            rows += batch.num_rows
    except (pa.ArrowInvalid, OSError):  # not a cell but the file (a ragged row): the caller's
        return None
    return None


def _refuse_undecodable(raw: pa.Table, path: Path, filename: str | None) -> None:
    """A CSV column whose text is not UTF-8 is read as binary; it was then stored
    as an ignored column, a feature silently lost (helper-71)."""
    if _is_parquet(path, filename):
        return  # a Parquet binary column is binary data: ignored, as its type says
    binary = [
        name
        for name, dtype in zip(raw.column_names, raw.schema.types, strict=True)
        if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype)
    ]
    if binary:
        raise _bad_file(
            "columns hold text that is not UTF-8: save the file as UTF-8",
            [{"column": name, "reason": "not UTF-8 text"} for name in binary],
        )


def _infer_role(dtype: pa.DataType) -> str:
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return "numeric"
    if (
        pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_boolean(dtype)
        or pa.types.is_dictionary(dtype)
    ):
        return "categorical"
    return "ignored"


def _numeric(column: pa.ChunkedArray, name: str, problems: list[dict[str, Any]]) -> pa.Array:
    dtype = column.type
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return as_numbers(column, name)
    if pa.types.is_dictionary(dtype):
        column = pc.cast(column, dtype.value_type)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        problems.append({"column": name, "reason": f"type {dtype} is not numeric"})
        return pa.nulls(len(column), pa.float64())
    blank = pc.equal(pc.utf8_trim_whitespace(column), "")
    ok = pc.or_(pc.match_substring_regex(column, _NUMBER), blank)
    bad = _rows(pc.invert(ok))
    if bad:
        problems.append({"column": name, "rows": bad, "reason": "not a number"})
        return pa.nulls(len(column), pa.float64())
    cleaned = pc.if_else(blank, pa.scalar(None, column.type), pc.utf8_trim_whitespace(column))
    return pc.cast(cleaned, pa.float64())


def ingest(path: Path, *, filename: str | None, schema: SchemaDeclaration | None) -> IngestedTable:
    """Validate the uploaded file and build the stored table: ``example_id``
    (string), numeric columns (float64), categorical columns (string).
    Raises :class:`InvalidInputError` listing every problem found."""
    raw = read_table(path, filename=filename, text_columns=schema.categorical if schema else ())
    names = raw.column_names
    if ID not in names:
        raise _bad_file("the file has no example_id column", {"columns": names})
    if raw.num_rows == 0:
        raise _bad_file("the file has no rows")
    if len(set(names)) != len(names):
        raise _bad_file("duplicate column names", {"columns": names})

    _refuse_undecodable(raw, path, filename)
    problems: list[dict[str, Any]] = []
    if schema is not None:
        unknown = [c for c in (*schema.numeric, *schema.categorical) if c not in names]
        both = sorted(set(schema.numeric) & set(schema.categorical))
        if unknown:
            problems.append({"columns": unknown, "reason": "declared but not in the file"})
        if both:
            problems.append({"columns": both, "reason": "declared both numeric and categorical"})
        if ID in (*schema.numeric, *schema.categorical):
            problems.append({"column": ID, "reason": "example_id is the key, not a feature"})
        if problems:
            raise _bad_file("the schema does not match the file", problems)
        roles = {c: "numeric" for c in schema.numeric} | {
            c: "categorical" for c in schema.categorical
        }
    else:
        roles = {c: _infer_role(raw.schema.field(c).type) for c in names if c != ID}
    if roles.get(TARGET, "ignored") != "ignored":
        # Refused here, not by every job that would join it to labels and fail (a
        # column the declared schema leaves out is not stored, and clashes with none).
        raise _bad_file(
            f"a feature column may not be named {TARGET!r}",
            [{"column": TARGET, "reason": "reserved for the received label"}],
        )

    try:
        ids = as_keys(raw.column(ID), ID)
    except ColumnTypeError as exc:
        raise _bad_file(str(exc), {"column": ID}) from None
    # Kleene: a null id is missing (or_ is null there, and the row went unmarked).
    missing = _rows(pc.or_kleene(pc.is_null(ids), pc.equal(ids, "")))
    if missing:
        problems.append({"column": ID, "rows": missing, "reason": "missing example_id"})
    elif pc.count_distinct(ids).as_py() != raw.num_rows:
        counts = pc.value_counts(ids)
        dup_values = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
        dup_values = dup_values.slice(0, MAX_REPORTED)
        problems.append(
            {
                "column": ID,
                "rows": _rows(pc.is_in(ids, value_set=dup_values)),
                "reason": "duplicate example_id",
            }
        )

    arrays: dict[str, Any] = {ID: ids}
    columns: list[ColumnInfo] = []
    for name in names:
        if name == ID:
            continue
        role = roles.get(name, "ignored")
        columns.append(ColumnInfo(name=name, role=role, type=str(raw.schema.field(name).type)))  # type: ignore[arg-type]
        if role == "numeric":
            arrays[name] = _numeric(raw.column(name), name, problems)
        elif role == "categorical":
            try:
                arrays[name] = as_categories(raw.column(name), name)
            except ColumnTypeError as exc:
                problems.append({"column": name, "reason": str(exc)})
    if problems:
        raise _bad_file("the file has invalid rows or columns", problems)
    numeric = tuple(c.name for c in columns if c.role == "numeric")
    categorical = tuple(c.name for c in columns if c.role == "categorical")
    if not numeric and not categorical:
        raise _bad_file("no usable feature column (numeric or categorical)", {"columns": names})
    return IngestedTable(pa.table(arrays), columns, ColumnRoles(numeric, categorical))
