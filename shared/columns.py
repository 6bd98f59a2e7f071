"""Columns of uploaded tables, converted for use: keys as text, values as numbers.

A Parquet file (or a JSON-lines value) may give a column any Arrow type: lists,
structs, binary, unsigned 64-bit integers. pyarrow's casts raise on what they
cannot convert, and those exceptions reached users as 500s. These conversions
accept the types that mean something here and raise :class:`ColumnTypeError`,
naming the column and its type (never a value: DESIGN.md §3.1), for the rest;
each service turns it into its own 422.
"""

from __future__ import annotations

from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

Column: TypeAlias = pa.ChunkedArray | pa.Array


class ColumnTypeError(ValueError):
    """A column whose type cannot serve; the message says which and why."""


#: What either service answers for a file whose column names are not UTF-8 (a
#: Latin-1 or UTF-16 CSV): pyarrow raises ``UnicodeDecodeError`` as a name is
#: read, which was a 500 at both parties (helper-71).
NAMES_NOT_UTF8 = "the file's column names are not UTF-8 text: save it as UTF-8"


def _cast(column: Column, dtype: pa.DataType, *, safe: bool = True) -> Column:
    cast: Column = pc.cast(column, dtype, safe=safe)
    return cast


def _decoded(column: Column) -> Column:
    """A dictionary column as its values, a half float as a float32 (Arrow's
    compute functions have no half-float kernels: a float16 category was a 500;
    helper-71)."""
    if pa.types.is_dictionary(column.type):
        column = _cast(column, column.type.value_type)
    if pa.types.is_float16(column.type):
        return _cast(column, pa.float32())
    return column


def _is_text(dtype: pa.DataType) -> bool:
    return bool(pa.types.is_string(dtype) or pa.types.is_large_string(dtype))


def _is_number(dtype: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype)
    )


def as_keys(column: Column, name: str) -> Column:
    """An id (or part, or group) column as strings: text, or integers written in
    decimal; all nulls is a column of nulls."""
    column = _decoded(column)
    if pa.types.is_null(column.type):
        return _cast(column, pa.string())
    if _is_text(column.type) or pa.types.is_integer(column.type):
        return _cast(column, pa.string())
    raise ColumnTypeError(f"{name} must be text or integers; the file's column is {column.type}")


#: The words a CSV reader takes for booleans (pyarrow's defaults without "1"/"0",
#: which the features party's reader is given): each spelling is the category its
#: boolean casts to ("true"/"false").
TRUE_WORDS = ("true", "True", "TRUE")
FALSE_WORDS = ("false", "False", "FALSE")
_TRUE_SPELLINGS = pa.array(TRUE_WORDS[1:], type=pa.string())
_FALSE_SPELLINGS = pa.array(FALSE_WORDS[1:], type=pa.string())


def as_categories(column: Column, name: str) -> Column:
    """A categorical column as strings: text, integers, booleans or floats (as
    written; a whole number as an integer, :func:`_whole_numbers`).

    A boolean is ``"true"``/``"false"``, and so is its text spelling (``True``,
    ``TRUE``, …): a CSV column of ``True``/``False`` is read as booleans when its
    type is inferred (a feature set's undeclared column) and as text when it is
    not (a declared categorical column, or any categorical column of a prediction
    file), and JSON rows give booleans; all must name the same category.
    """
    column = _decoded(column)
    dtype = column.type
    if not (
        _is_text(dtype)
        or _is_number(dtype)
        or pa.types.is_boolean(dtype)
        or pa.types.is_null(dtype)
    ):
        raise ColumnTypeError(f"column {name!r} cannot be a category: its type is {dtype}")
    floats = pa.types.is_floating(dtype)
    text = _whole_numbers(_floats_as_text(column) if floats else _cast(column, pa.string()))
    if not _is_text(dtype):
        return text
    text = pc.if_else(pc.is_in(text, value_set=_TRUE_SPELLINGS), "true", text)
    spelled: Column = pc.if_else(pc.is_in(text, value_set=_FALSE_SPELLINGS), "false", text)
    return spelled


#: Floats of at most this magnitude hold whole numbers exactly (2⁵³).
_EXACT_INTEGERS = float(2**53)


def _floats_as_text(column: Column) -> Column:
    """A float column as text, a whole number within 2⁵³ as the integer it is:
    Arrow writes a float of 10¹⁰ or more in exponent form (``1.2345678901e+10``),
    which no CSV or JSON integer spells."""
    finite = pc.is_finite(column)
    exact = pc.and_(pc.and_(finite, pc.equal(column, pc.floor(column))),
                    pc.less_equal(pc.abs(column), _EXACT_INTEGERS))  # fmt: skip
    whole = _cast(_cast(pc.if_else(exact, column, None), pa.int64()), pa.string())
    text: Column = pc.if_else(pc.is_null(whole), _cast(column, pa.string()), whole)
    return text


def _whole_numbers(text: Column) -> Column:
    """A whole number written as a float (``2.0``, ``-3.00``: pandas' CSV of a float
    column) as the integer it is (``2``, ``-3``, as Arrow writes a float 2.0), and
    a negative zero as ``0``: a category from a Parquet float, a CSV's text or a
    JSON row must be the same category, or a model put every row of the other
    form in its unknown bucket and answered 200. Other text is kept as written
    (``02139`` and ``1.10`` are categories of their own)."""
    whole = pc.replace_substring_regex(text, pattern=r"^(-?[0-9]+)\.0+$", replacement=r"\1")
    unsigned: Column = pc.replace_substring_regex(whole, pattern=r"^-(0+)$", replacement=r"\1")
    return unsigned


def as_numbers(column: Column, name: str, dtype: pa.DataType | None = None) -> Column:
    """A numeric column as floats (``dtype``, float64 by default). Integers beyond
    the float's exact range round (a 64-bit count of 2⁶⁴ − 1 is 1.8e19, not an
    error); the caller checks the range it needs."""
    column = _decoded(column)
    if _is_number(column.type) or pa.types.is_null(column.type):
        return _cast(column, dtype or pa.float64(), safe=False)
    raise ColumnTypeError(f"column {name!r} must be numeric; its type is {column.type}")
