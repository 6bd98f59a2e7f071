"""Preprocessing: column roles, vocabularies, scalers, and tensors.

Fitting and transforming are columnar (pyarrow compute + numpy): the loops run
over *columns*, never over examples. The fitted :class:`Preprocessing` is part of
the model artifact, so prediction applies exactly the training transformation.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from shared.columns import as_categories

#: The received label's column in a join: a name no feature column may take (a
#: feature named ``label`` made two columns of that name, and the job failed); a
#: feature set's upload refuses it.
TARGET = "__labeldp_target"

__all__ = ["ColumnRoles", "Preprocessing", "Tensors", "fit_preprocessing"]


@dataclass(frozen=True)
class ColumnRoles:
    """Which feature columns are numeric and which categorical; the rest are ignored."""

    numeric: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, list[str]]:
        return {"numeric": list(self.numeric), "categorical": list(self.categorical)}


@dataclass(frozen=True)
class Tensors:
    """A preprocessed batch or data set: ``numeric`` float32[n, k], ``categorical``
    int64[n, c] (0 = out of vocabulary)."""

    numeric: torch.Tensor
    categorical: torch.Tensor

    def __len__(self) -> int:
        return int(self.numeric.shape[0])


@dataclass
class Preprocessing:
    """Fitted transformation: per numeric column mean and standard deviation (missing
    values become the mean, i.e. 0 after scaling), per categorical column a
    vocabulary (most frequent first; index ``i + 1`` for ``vocab[i]``, 0 for
    anything else, missing values included)."""

    numeric: list[str]
    means: list[float]
    stds: list[float]
    categorical: list[str]
    vocabularies: list[list[str]] = field(default_factory=list)

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        """Rows per embedding, the OOV bucket included."""
        return tuple(len(v) + 1 for v in self.vocabularies)

    @property
    def roles(self) -> ColumnRoles:
        return ColumnRoles(tuple(self.numeric), tuple(self.categorical))

    def missing_columns(self, names: Collection[str]) -> list[str]:
        """The feature columns that are not among ``names``."""
        present = set(names)
        return [c for c in (*self.numeric, *self.categorical) if c not in present]

    def transform(self, table: pa.Table, first_row: int = 1) -> Tensors:
        """Tensors for ``table``; raises ``ValueError`` if a column is missing or a
        numeric column does not parse as numbers (naming the row, counted from
        ``first_row`` when ``table`` is a batch of a longer file)."""
        missing = self.missing_columns(table.column_names)
        if missing:
            raise ValueError(f"missing feature columns: {', '.join(missing)}")
        n = table.num_rows
        numeric = np.zeros((n, len(self.numeric)), dtype=np.float32)
        for j, name in enumerate(self.numeric):
            values = _as_float(table.column(name), name, first_row)
            scaled = _standardized(values, self.means[j], self.stds[j])
            scaled = np.nan_to_num(scaled, nan=0.0, posinf=0.0, neginf=0.0)
            # Past float32's range the cast would make ±inf, and the model NaN.
            numeric[:, j] = np.clip(scaled, -_FLOAT32_MAX, _FLOAT32_MAX)
        categorical = np.zeros((n, len(self.categorical)), dtype=np.int64)
        for j, name in enumerate(self.categorical):
            # Spelled as the values are (a model from before booleans' text
            # spelling was one category learned "True").
            vocab = as_categories(pa.array(self.vocabularies[j], type=pa.string()), name)
            idx = pc.index_in(as_categories(table.column(name), name), value_set=vocab)
            categorical[:, j] = pc.fill_null(idx, -1).to_numpy() + 1
        return Tensors(torch.from_numpy(numeric), torch.from_numpy(categorical))

    def to_dict(self) -> dict[str, Any]:
        return {
            "numeric": list(self.numeric),
            "means": list(self.means),
            "stds": list(self.stds),
            "categorical": list(self.categorical),
            "vocabularies": [list(v) for v in self.vocabularies],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Preprocessing:
        return cls(
            numeric=list(d["numeric"]),
            means=[float(x) for x in d["means"]],
            stds=[float(x) for x in d["stds"]],
            categorical=list(d["categorical"]),
            vocabularies=[list(v) for v in d["vocabularies"]],
        )


_FLOAT32_MAX = float(np.finfo(np.float32).max)

#: What a text cell must look like to cast to a float (Arrow's cast accepts these).
_NUMBER_TEXT = r"^[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|nan|inf|infinity)$"


def _as_float(column: pa.ChunkedArray | pa.Array, name: str, first_row: int = 1) -> np.ndarray:
    """A numeric column as float64 (NaN for nulls); a ``ValueError`` naming the column
    and its first bad row, never Arrow's message (which quotes the cell). True and
    false are not numbers here as at upload (Arrow casts them to 1 and 0; helper-78)."""
    if pa.types.is_boolean(column.type):
        raise ValueError(f"numeric column {name!r} holds true/false, not numbers")
    try:
        arr = pc.cast(column, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ValueError(f"numeric column {name!r} holds a value that is not a number"
                         f"{_first_non_number(column, first_row)}") from None  # fmt: skip
    return np.asarray(pc.fill_null(arr, float("nan")).to_numpy(), dtype=np.float64)


def _first_non_number(column: pa.ChunkedArray | pa.Array, first_row: int) -> str:
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return f" (its type is {column.type})"
    numbers = pc.match_substring_regex(column, _NUMBER_TEXT, ignore_case=True)
    bad = np.flatnonzero(~pc.fill_null(numbers, True).to_numpy(zero_copy_only=False))
    return f" (row {int(bad[0]) + first_row})" if bad.size else ""


def _mean_and_std(finite: np.ndarray) -> tuple[float, float]:
    """Of finite values; over their largest magnitude where the sums overflow: a
    column of ±1.7e308 summed to inf, and its model scaled every value to 0 and
    answered one constant (helper-71)."""
    if not finite.size:
        return 0.0, 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        mean, std = float(finite.mean()), float(finite.std())
    if math.isfinite(mean) and math.isfinite(std):
        return mean, std
    scale = float(np.abs(finite).max())
    unit = finite / scale
    return float(unit.mean()) * scale, float(unit.std()) * scale


def _standardized(values: np.ndarray, mean: float, std: float) -> np.ndarray:
    """``(x − mean) / std``; where the difference overflows (values near the float
    range), ``x / std − mean / std``, which does not."""
    with np.errstate(over="ignore", invalid="ignore"):
        scaled: np.ndarray = (values - mean) / std
        far = ~np.isfinite(scaled) & np.isfinite(values)
        if far.any():
            scaled[far] = values[far] / std - mean / std
    return scaled


def fit_preprocessing(
    table: pa.Table, roles: ColumnRoles, *, max_vocab: int = 100_000, min_count: int = 1
) -> Preprocessing:
    """Fit scalers and vocabularies on ``table`` (features only — no labels)."""
    means: list[float] = []
    stds: list[float] = []
    for name in roles.numeric:
        values = _as_float(table.column(name), name)
        mean, std = _mean_and_std(values[np.isfinite(values)])
        means.append(mean)
        stds.append(std if std > 1e-12 else 1.0)
    vocabularies: list[list[str]] = []
    for name in roles.categorical:
        counts = pc.value_counts(as_categories(table.column(name), name))
        values = counts.field("values")
        freq = counts.field("counts")
        keep = pc.and_(pc.is_valid(values), pc.greater_equal(freq, min_count))
        kept = pa.table({"v": values, "n": freq}).filter(keep)
        kept = kept.sort_by([("n", "descending"), ("v", "ascending")]).slice(0, max_vocab)
        vocabularies.append([str(v) for v in kept.column("v").to_pylist()])
    return Preprocessing(
        numeric=list(roles.numeric),
        means=means,
        stds=stds,
        categorical=list(roles.categorical),
        vocabularies=vocabularies,
    )
