"""Read an uploaded label file and validate every row with vectorized Arrow kernels.

Formats: CSV (header with ``example_id``, ``label``), Parquet, JSON lines. The
result is an Arrow table ``example_id: string, label: float64`` (class index for
classification), or :class:`InvalidLabelsError` whose detail lists up to
``MAX_REPORTED`` bad rows as ``{"row": n, "reason": ...}`` (rows numbered from 1
in file order, header excluded). Reasons never quote the value (DESIGN.md §3.1).

No Python runs per row: every check is an Arrow or numpy kernel over the column.
(The one exception is a JSON-lines file that Arrow's typed reader refuses: it is
read again line by line, on that error path only, :func:`_jsonl_as_text`.)
"""

from __future__ import annotations

import csv
import json
from typing import IO, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from label_party.datasets.domain import ClassificationDomain, RegressionDomain
from label_party.exceptions import InvalidLabelsError, InvalidRequestError, PayloadTooLargeError
from shared import strict_json
from shared.columns import NAMES_NOT_UTF8, ColumnTypeError, as_keys
from shared.jsonl import TooDeepError, read_json_lines
from shared.parquet import ParquetTooLargeError, read_parquet_bounded
from shared.strict_json import DuplicateKeyError

FileFormat = Literal["csv", "parquet", "jsonl"]
MAX_REPORTED = 100
COLUMNS = ("example_id", "label")
LABELS_SCHEMA = pa.schema([("example_id", pa.string()), ("label", pa.float64())])

#: Row problems, by code (0 is "fine"); a row reports its first problem in this order.
REASONS = (
    "",
    "missing example_id",
    "duplicate example_id",
    "missing label",
    "label is not a number",
    "label is NaN or infinite",
    "label is outside the declared domain",
    "unknown class",
)
MISSING_ID, DUPLICATE_ID, MISSING_LABEL, NOT_NUMBER, NOT_FINITE, OUT_OF_DOMAIN, UNKNOWN_CLASS = (
    range(1, 8)
)
_NUMBER = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_NONFINITE = r"^[+-]?(nan|inf|infinity)$"


def file_format(filename: str | None, content_type: str | None) -> FileFormat:
    name = (filename or "").lower()
    if name.endswith(".parquet") or (content_type or "").endswith("parquet"):
        return "parquet"
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith((".csv", ".txt")) or (content_type or "").startswith("text/csv"):
        return "csv"
    # A format, not a label, is at fault: the generic code, for every upload.
    raise InvalidRequestError(
        "the file must be Parquet (.parquet, or the type application/vnd.apache.parquet), "
        "CSV (.csv, .txt, or the type text/csv) or JSON Lines (.jsonl, .ndjson, .json)"
    )


#: Bytes of a CSV's first line read for its column names.
HEADER_BYTES = 1 << 20


def read_table(source: IO[bytes], fmt: FileFormat, columns: tuple[str, ...] = COLUMNS) -> pa.Table:
    """Read ``columns``; an unreadable file is one file-level error (no parser text)."""
    try:
        if fmt == "parquet":
            names = pq.ParquetFile(source).schema_arrow.names
            _refuse_repeated(names, columns)
            _require_columns(names, columns)
            table = read_parquet_bounded(source, list(columns))
        elif fmt == "csv":
            # Arrow's include_columns keeps the first of two same-named columns silently.
            _refuse_repeated(pcsv.open_csv(source).schema.names, columns)  # its first block
            source.seek(0)
            table = pcsv.read_csv(
                source,
                convert_options=pcsv.ConvertOptions(
                    column_types={c: pa.string() for c in columns},
                    include_columns=list(columns),
                    strings_can_be_null=True,
                    null_values=[""],
                ),
            )
            _require_columns(table.column_names, columns)
        else:
            table = read_json_lines(source)
            if table.num_rows == 0:  # an empty file, not one that lacks columns
                raise InvalidLabelsError("the file has no rows", [])
            _require_columns(table.column_names, columns)
            table = table.select(list(columns))
    except InvalidLabelsError:
        raise
    except TooDeepError as exc:
        raise InvalidLabelsError(str(exc), []) from None
    except UnicodeDecodeError:
        raise InvalidLabelsError(NAMES_NOT_UTF8, []) from None
    except ParquetTooLargeError as exc:
        raise PayloadTooLargeError(str(exc), {"limit": exc.limit}) from None
    except (pa.ArrowException, OSError):
        # Parser messages can quote file content, so they are not passed on.
        if fmt == "jsonl":
            return _jsonl_as_text(source, columns)
        header = _csv_header(source) if fmt == "csv" else []
        if header:  # an empty file has no header to name
            _require_columns(header, columns)
        raise InvalidLabelsError(
            f"the file could not be read as {fmt} with columns {', '.join(columns)}", []
        ) from None
    return table


def _csv_header(source: IO[bytes]) -> list[str]:
    """The CSV's column names, read on the error path to name a missing column:
    from at most its first :data:`HEADER_BYTES` (a name cut off there is dropped)."""
    source.seek(0)
    raw = source.readline(HEADER_BYTES)
    try:
        names = next(csv.reader([raw.decode("utf-8-sig", errors="replace")]), [])
    except csv.Error:  # a name beyond the csv module's 128 KiB field limit
        return []
    return names if raw.endswith(b"\n") or len(raw) < HEADER_BYTES else names[:-1]


def _refuse_repeated(names: list[str], columns: tuple[str, ...]) -> None:
    repeated = [c for c in columns if names.count(c) > 1]
    if repeated:
        raise InvalidLabelsError(f"the file has column(s) {', '.join(repeated)} more than once", [])


def _text(value: object) -> str | None:
    """A JSON scalar as CSV would read it: strings as they are, the rest as JSON text."""
    return value if value is None or isinstance(value, str) else json.dumps(value)


def _jsonl_as_text(source: IO[bytes], columns: tuple[str, ...]) -> pa.Table:
    """Re-read JSON lines that Arrow's typed reader refused (runs only on that path).

    Arrow types a column from its first rows, so ids ``1`` and ``"a"`` in one file,
    or a label ``"x"`` among numbers, fail the whole file. Here scalars are kept as
    text, as CSV reads them, so that :func:`validate` gives each row its own reason.
    A line that is not an object, or a list/object value where the column's first
    value was a scalar (or the reverse), is reported here by row.
    """
    source.seek(0)
    values: dict[str, list[object]] = {c: [] for c in columns}
    nested: dict[str, bool] = {}
    seen: set[str] = set()
    rows: list[dict[str, object]] = []
    record = 0
    for line in source:
        if not line.strip():
            continue  # Arrow skips blank lines too, so rows stay numbered alike.
        record += 1
        try:
            obj = strict_json.loads(line)
        except DuplicateKeyError as exc:  # Arrow refuses it too, for the whole file
            rows.append({"row": record, "reason": str(exc)})
            continue
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            if record == 1 and line.lstrip().startswith(b"["):
                raise InvalidLabelsError(
                    "JSON lines expected: one object per line, not a JSON array", []
                )
            rows.append({"row": record, "reason": "not a JSON object"})
            continue
        seen.update(obj)
        for column in columns:
            value = obj.get(column)
            is_nested = isinstance(value, list | dict)
            if value is not None and nested.setdefault(column, is_nested) != is_nested:
                expected = "a list" if nested[column] else "a string or number"
                rows.append({"row": record, "reason": f"{column} is not {expected}"})
                break
            values[column].append(value)
    if rows:
        raise InvalidLabelsError(
            f"{len(rows)} row(s) are invalid; nothing was stored",
            {"bad_rows": len(rows), "rows": rows[:MAX_REPORTED]},
        ) from None
    if record == 0:
        raise InvalidLabelsError("the file has no rows", []) from None
    _require_columns(list(seen), columns)
    _check_untexted_ids(values[columns[0]], columns[0])
    try:
        arrays = {
            c: pa.array(v) if nested.get(c) else pa.array([_text(x) for x in v], pa.string())
            for c, v in values.items()
        }
    except (pa.ArrowException, TypeError, ValueError):
        raise InvalidLabelsError(
            f"the file could not be read as jsonl with columns {', '.join(columns)}", []
        ) from None
    return pa.table(arrays)


def _check_untexted_ids(ids: list[object], name: str) -> None:
    """An id column without text is typed as Arrow would type it, so booleans or
    floats are refused here too (kept as JSON text only beside text ids)."""
    if any(isinstance(i, str) for i in ids):
        return
    try:
        as_keys(pa.array(ids), name)
    except ColumnTypeError as exc:
        raise InvalidLabelsError(str(exc), []) from None
    except (pa.ArrowException, TypeError, ValueError):  # integers beside booleans, say
        raise InvalidLabelsError(f"{name} must be text or integers", []) from None


def _require_columns(names: list[str], columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in names]
    if missing:
        raise InvalidLabelsError(f"the file lacks column(s) {', '.join(missing)}", [])


def as_strings(table: pa.Table, name: str) -> pa.ChunkedArray:
    """A key column (ids, parts, groups) as strings: text or integers (422 otherwise)."""
    try:
        strings: pa.ChunkedArray = as_keys(table.column(name), name)
    except ColumnTypeError as exc:
        raise InvalidLabelsError(str(exc), []) from None
    return strings


def report(reasons: np.ndarray, names: tuple[str, ...]) -> None:
    """Raise 422 listing up to ``MAX_REPORTED`` rows whose reason code is non-zero."""
    bad = np.flatnonzero(reasons)
    if bad.size:
        rows = [{"row": int(i) + 1, "reason": names[int(reasons[i])]} for i in bad[:MAX_REPORTED]]
        raise InvalidLabelsError(
            f"{bad.size} row(s) are invalid; nothing was stored",
            {"bad_rows": int(bad.size), "rows": rows},
        )


def mark_ids(reasons: np.ndarray, ids: pa.ChunkedArray) -> None:
    """Mark rows with a missing (``MISSING_ID``) or repeated (``DUPLICATE_ID``) example id."""
    mark(reasons, pc.fill_null(pc.equal(ids, ""), True), MISSING_ID)
    counts = pc.value_counts(ids).flatten()
    repeated = pc.filter(counts[0], pc.greater(counts[1], 1))
    if len(repeated):
        mark(reasons, pc.fill_null(pc.is_in(ids, value_set=repeated), False), DUPLICATE_ID)


def _numbers(column: pa.ChunkedArray, reasons: np.ndarray) -> np.ndarray:
    """Float values of a label column; marks non-numeric and missing rows in ``reasons``."""
    if pa.types.is_null(column.type):
        reasons[reasons == 0] = MISSING_LABEL
        return np.zeros(len(column))
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        text = pc.utf8_trim_whitespace(column)
        numeric = pc.match_substring_regex(text, _NUMBER)
        nonfinite = pc.match_substring_regex(text, _NONFINITE, ignore_case=True)
        mark(reasons, pc.is_null(text), MISSING_LABEL)
        mark(reasons, pc.fill_null(nonfinite, False), NOT_FINITE)
        mark(reasons, pc.invert(pc.fill_null(numeric, True)), NOT_NUMBER)
        column = pc.cast(pc.if_else(numeric, text, pa.scalar(None, pa.string())), pa.float64())
    elif pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        mark(reasons, pc.is_null(column), MISSING_LABEL)
        column = pc.cast(column, pa.float64(), safe=False)  # beyond the domain: refused below
    elif pa.types.is_boolean(column.type):
        mark(reasons, pc.is_valid(column), NOT_NUMBER)
        mark(reasons, pc.is_null(column), MISSING_LABEL)
        return np.zeros(len(column))
    else:
        reasons[reasons == 0] = NOT_NUMBER
        return np.zeros(len(column))
    values = column.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    values = np.where(np.isnan(values) & (reasons != 0), 0.0, values)
    mark(reasons, ~np.isfinite(values), NOT_FINITE)
    return values


def mark(reasons: np.ndarray, mask: pa.ChunkedArray | pa.Array | np.ndarray, code: int) -> None:
    if not isinstance(mask, np.ndarray):
        mask = mask.to_numpy(zero_copy_only=False)
    reasons[mask & (reasons == 0)] = code


def mark_names(reasons: np.ndarray, names: pa.ChunkedArray | pa.Array, max_length: int) -> None:
    """Reasons 3 (a missing or empty name) and 4 (one over ``max_length``) for a
    column of names (a plan's parts, a prior set's groups)."""
    mark(reasons, pc.fill_null(pc.equal(names, ""), True), 3)
    mark(reasons, pc.fill_null(pc.greater(pc.utf8_length(names), max_length), False), 4)


def validate(
    table: pa.Table, domain: RegressionDomain | ClassificationDomain
) -> tuple[pa.Table, int]:
    """Check every row against the declared domain; the clean table, or 422 listing bad rows."""
    n = table.num_rows
    if n == 0:
        raise InvalidLabelsError("the file has no rows", [])
    reasons = np.zeros(n, dtype=np.int8)
    ids = as_strings(table, "example_id")
    mark_ids(reasons, ids)

    raw = table.column("label")
    if isinstance(domain, ClassificationDomain):
        values = _classes(raw, domain, reasons)
    else:
        values = _numbers(raw, reasons)
        outside = (values < domain.min) | (values > domain.max)
        if domain.clip:
            np.clip(values, domain.min, domain.max, out=values)
        else:
            mark(reasons, outside, OUT_OF_DOMAIN)

    report(reasons, REASONS)
    clean = pa.table({"example_id": ids, "label": pa.array(values, pa.float64())})
    return clean.cast(LABELS_SCHEMA), n


def _classes(raw: pa.ChunkedArray, domain: ClassificationDomain, reasons: np.ndarray) -> np.ndarray:
    k = domain.size
    if domain.classes is not None and (
        pa.types.is_string(raw.type) or pa.types.is_large_string(raw.type)
    ):
        mark(reasons, pc.is_null(raw), MISSING_LABEL)
        index = pc.index_in(raw, value_set=pa.array(domain.classes, pa.string()))
        mark(reasons, pc.is_null(index), UNKNOWN_CLASS)
        return np.asarray(pc.fill_null(index, 0).to_numpy(zero_copy_only=False), np.float64)
    values = _numbers(raw, reasons)
    unknown = (values != np.floor(values)) | (values < 0) | (values >= k)
    mark(reasons, unknown, UNKNOWN_CLASS)
    return values
