"""Validate, store and load prior sets. Nothing here reads labels.

Upload rules (all or nothing; 422 lists up to 100 bad rows by row number and
reason, as the label upload does):

* ``groups`` — CSV, Parquet or JSON lines with ``example_id`` and ``group``
  (integers or strings; stored as strings). Bad rows: missing or repeated
  ``example_id``, missing group, group name over 200 characters. At most
  10,000 distinct groups.
* ``probabilities`` — Parquet or JSON lines with ``example_id`` and either a list
  column ``prior`` of K numbers or K columns ``p_0`` … ``p_{K−1}``, K the
  dataset's ``num_classes``. Bad rows: missing or repeated ``example_id``, wrong
  number of probabilities, a probability missing, NaN, infinite or negative, a
  row not summing to 1 within ``SUM_TOLERANCE``. Rows are stored renormalized.

Example ids the dataset's labels do not hold are *kept* (labels may be
re-uploaded until the first release, and a features party may send priors for
its whole feature set); the response counts them (``num_unmatched``). The check
that matters is made by the release: every example in its scope must have a
prior in the set, or the release is refused (422) before anything is spent.
"""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from label_party.audit import service as audit
from label_party.auth import Principal, confirm, visible_dataset
from label_party.config import Settings
from label_party.datasets.domain import ClassificationDomain, parse_domain
from label_party.db import transaction
from label_party.exceptions import InvalidLabelsError, InvalidRequestError, NotFoundError
from label_party.labels.validation import (
    FileFormat,
    as_strings,
    mark,
    mark_ids,
    mark_names,
    read_table,
    report,
)
from label_party.ledger.service import lock_dataset
from label_party.models import Dataset, PriorSet
from label_party.storage import labels_path, persisted, write_table
from shared.jsonl import MAX_DEPTH, deepest


class InvalidPriorsError(InvalidRequestError):
    """422 ``invalid_priors``: detail ``{"bad_rows", "rows": [{"row", "reason"}]}``."""

    code = "invalid_priors"


Kind = Literal["groups", "probabilities"]
KINDS: tuple[Kind, ...] = ("groups", "probabilities")
MAX_GROUPS = 10_000
#: Most noisy counts (groups × classes) a ``groups`` release draws, one at a time
#: with the exact sampler while it holds the dataset's lock: 200,000 took 4.8 s on
#: one core, so this is about 25 s (helper-80 drew 10,000 groups of 20 classes,
#: and K = 100,000 would have taken hours and 8 GB an array).
MAX_GROUP_CELLS = 1_000_000
MAX_GROUP_NAME = 200
#: A probability row must sum to 1 within this (float32 model outputs do).
SUM_TOLERANCE = 1e-3

GROUP_REASONS = (
    "",
    "missing example_id",
    "duplicate example_id",
    "missing group",
    "group too long",
)
PROB_REASONS = (
    "",
    "missing example_id",
    "duplicate example_id",
    "wrong number of probabilities",
    "probability is missing, NaN or infinite",
    "probability is negative",
    "probabilities do not sum to 1",
)
WRONG_LENGTH, NOT_FINITE, NEGATIVE, NOT_NORMALIZED = 3, 4, 5, 6


def priors_dir(settings: Settings, dataset_id: str) -> Path:
    return settings.priors_dir / dataset_id


def prior_path(settings: Settings, prior: PriorSet) -> Path:
    return priors_dir(settings, prior.dataset_id) / f"{prior.sha256}.parquet"


def list_for_dataset(session: Session, principal: Principal, dataset_id: str) -> list[PriorSet]:
    """The dataset's prior sets: all of them for the admin, a client's own for it."""
    query = select(PriorSet).where(PriorSet.dataset_id == dataset_id)
    if principal.role == "client":
        query = query.where(PriorSet.created_by == principal.id)
    return list(session.scalars(query.order_by(PriorSet.created_at, PriorSet.id)))


def get(session: Session, principal: Principal, dataset_id: str, prior_id: str) -> PriorSet:
    """A prior set of the dataset the principal may read and release with: a client
    its own, as its releases and trainings (one features party's groups were listed
    to, and used by, another granted the same dataset; helper-79); the admin any."""
    prior = session.get(PriorSet, prior_id)
    if (
        prior is None
        or prior.dataset_id != dataset_id
        or (principal.role == "client" and prior.created_by != principal.id)
    ):
        raise NotFoundError(f"prior set {prior_id} not found for this dataset")
    return prior


def check_group_cells(num_groups: int, num_classes: int) -> None:
    """Refuse (free: groups and classes are public) a ``groups`` prior set whose
    noisy histograms would take more than :data:`MAX_GROUP_CELLS` draws."""
    if num_groups * num_classes > MAX_GROUP_CELLS:
        raise InvalidRequestError(
            f"{num_groups} groups × {num_classes} classes is more than the "
            f"{MAX_GROUP_CELLS:,} noisy counts a groups release draws: use fewer groups"
        )


# -- validation -------------------------------------------------------------------


def _groups_table(source: IO[bytes], fmt: FileFormat) -> tuple[pa.Table, int]:
    table = read_table(source, fmt, ("example_id", "group"))
    if table.num_rows == 0:
        raise InvalidLabelsError("the file has no rows", [])
    ids, groups = as_strings(table, "example_id"), as_strings(table, "group")
    reasons = np.zeros(table.num_rows, dtype=np.int8)
    mark_ids(reasons, ids)
    mark_names(reasons, groups, MAX_GROUP_NAME)
    report(reasons, GROUP_REASONS)
    num_groups = len(pc.unique(groups))
    if num_groups > MAX_GROUPS:
        raise InvalidLabelsError(f"a prior set has at most {MAX_GROUPS} groups", [])
    clean = pa.table({"example_id": ids, "group": groups})
    return clean.cast(pa.schema([("example_id", pa.string()), ("group", pa.string())])), num_groups


def _wide_columns(k: int) -> tuple[str, ...]:
    return tuple(f"p_{j}" for j in range(k))


def _columns_of(source: IO[bytes], fmt: FileFormat) -> list[str]:
    if fmt == "parquet":
        try:
            names = [str(name) for name in pq.ParquetFile(source).schema_arrow.names]
        except (pa.ArrowException, OSError):
            raise InvalidLabelsError("the file could not be read as parquet", []) from None
    else:
        first = b""
        for line in source:
            if line.strip():
                first = line
                break
        if deepest(io.BytesIO(first)) > MAX_DEPTH:  # json.loads would recurse that deep
            raise InvalidLabelsError(f"the file nests deeper than {MAX_DEPTH} levels", [])
        try:
            obj = json.loads(first) if first else {}
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            raise InvalidLabelsError("row 1 is not a JSON object", [{"row": 1}])
        names = [str(key) for key in obj]
    source.seek(0)
    return names


def _as_floats(column: pa.ChunkedArray) -> np.ndarray:
    """A numeric column as float64 with NaN for nulls; a non-numeric one is refused."""
    if not (
        pa.types.is_integer(column.type)
        or pa.types.is_floating(column.type)
        or pa.types.is_null(column.type)
    ):
        raise InvalidLabelsError("probabilities must be numbers", [])
    values: np.ndarray = (
        pc.cast(column, pa.float64(), safe=False)  # a uint64 beyond 2⁵³ rounds; range checked
        .to_numpy(zero_copy_only=False)
        .astype(np.float64)
    )
    return values


def _probability_matrix(table: pa.Table, k: int, reasons: np.ndarray) -> np.ndarray:
    n = table.num_rows
    if "prior" not in table.column_names:
        return np.column_stack([_as_floats(table.column(c)) for c in _wide_columns(k)])
    column = table.column("prior").combine_chunks()
    if pa.types.is_null(column.type):
        mark(reasons, np.ones(n, dtype=bool), WRONG_LENGTH)
        return np.zeros((n, k))
    if not (pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type)):
        raise InvalidLabelsError("the prior column must be a list of K numbers per row", [])
    lengths = pc.fill_null(pc.list_value_length(column), -1).to_numpy(zero_copy_only=False)
    right = lengths == k
    mark(reasons, ~right, WRONG_LENGTH)
    out = np.zeros((n, k))
    if right.any():
        flat = pc.list_flatten(column.filter(pa.array(right)))
        out[right] = _as_floats(pa.chunked_array([flat])).reshape(-1, k)
    return out


def _probabilities_table(source: IO[bytes], fmt: FileFormat, k: int) -> pa.Table:
    if fmt not in ("parquet", "jsonl"):
        raise InvalidLabelsError("probabilities must be sent as Parquet or JSON lines", [])
    names = _columns_of(source, fmt)
    columns = ("example_id", "prior") if "prior" in names else ("example_id", *_wide_columns(k))
    table = read_table(source, fmt, columns)
    n = table.num_rows
    if n == 0:
        raise InvalidLabelsError("the file has no rows", [])
    ids = as_strings(table, "example_id")
    reasons = np.zeros(n, dtype=np.int8)
    mark_ids(reasons, ids)
    p = _probability_matrix(table, k, reasons)
    mark(reasons, ~np.isfinite(p).all(axis=1), NOT_FINITE)
    with np.errstate(invalid="ignore"):
        mark(reasons, (p < 0).any(axis=1), NEGATIVE)
        totals = p.sum(axis=1)
        mark(reasons, ~(np.abs(totals - 1.0) <= SUM_TOLERANCE), NOT_NORMALIZED)
    report(reasons, PROB_REASONS)
    p /= totals[:, None]
    prior = pa.FixedSizeListArray.from_arrays(pa.array(p.ravel(), pa.float64()), k)
    return pa.table({"example_id": ids.combine_chunks().cast(pa.string()), "prior": prior})


def _unmatched(settings: Settings, dataset: Dataset, ids: pa.ChunkedArray) -> int | None:
    if dataset.labels_sha256 is None:
        return None
    path = persisted(settings, labels_path(settings, dataset), "the dataset's labels")
    labelled = pq.read_table(path, columns=["example_id"])
    known = pc.is_in(ids, value_set=labelled.column("example_id").combine_chunks())
    return int(len(ids) - pc.sum(known).as_py())


def upload(
    session: Session,
    settings: Settings,
    principal: Principal,
    dataset_id: str,
    source: IO[bytes],
    fmt: FileFormat,
    kind: str,
    *,
    unlocked: sessionmaker[Session],
) -> tuple[PriorSet, int | None]:
    """Store a prior set; returns it and the number of ids the labels lack (None: no labels).

    As for labels, the file is read after a short read transaction of ``unlocked``
    and before ``session`` locks the dataset (on SQLite, the database's write lock).
    """
    if kind not in KINDS:
        raise InvalidRequestError(f"kind must be one of {', '.join(KINDS)}")
    with transaction(unlocked) as reader:
        seen = visible_dataset(reader, principal, dataset_id)
        domain = parse_domain(seen.task, seen.label_domain)  # fixed once created
    if not isinstance(domain, ClassificationDomain):
        raise InvalidRequestError("example priors are for classification datasets")
    num_groups: int | None = None
    num_classes: int | None = None
    try:
        if kind == "groups":
            table, num_groups = _groups_table(source, fmt)
            check_group_cells(num_groups, domain.size)
        else:
            num_classes = domain.size
            table = _probabilities_table(source, fmt, num_classes)
    except InvalidLabelsError as exc:
        # The shared readers speak of labels; these are priors (no label involved).
        raise InvalidPriorsError(exc.message, exc.detail) from None
    dataset = lock_dataset(session, dataset_id)
    confirm(session, principal)
    sha = write_table(settings, table, priors_dir(settings, dataset.id))
    unmatched = _unmatched(settings, dataset, table.column("example_id"))
    prior = PriorSet(
        id=str(uuid.uuid4()),
        dataset_id=dataset.id,
        kind=kind,
        num_rows=table.num_rows,
        num_groups=num_groups,
        num_classes=num_classes,
        sha256=sha,
        created_by=principal.id,
    )
    session.add(prior)
    session.flush()
    audit.append(
        session,
        actor=principal.id,
        action="priors.uploaded",
        dataset_id=dataset.id,
        payload={
            "prior_id": prior.id,
            "kind": kind,
            "num_rows": prior.num_rows,
            "num_groups": num_groups,
            "sha256": sha,
            "format": fmt,
        },
    )
    return prior, unmatched


# -- loading for a release ----------------------------------------------------------


@dataclass(frozen=True)
class LoadedPriors:
    """A prior set in memory for one release.

    ``groups``: ``group_of_row[i]`` indexes ``group_names`` (sorted). ``probabilities``:
    ``probabilities`` is rows × K, rows normalized.
    """

    prior_id: str
    sha256: str
    kind: Kind
    ids: pa.Array
    group_of_row: np.ndarray | None = None
    group_names: list[str] | None = None
    probabilities: np.ndarray | None = None


def load(settings: Settings, prior: PriorSet) -> LoadedPriors:
    table = pq.read_table(prior_path(settings, prior))
    ids = table.column("example_id").combine_chunks()
    if prior.kind == "groups":
        groups = table.column("group").combine_chunks()
        names = pc.array_sort_indices(pc.unique(groups))
        sorted_names = pc.take(pc.unique(groups), names)
        index = pc.index_in(groups, value_set=sorted_names).to_numpy(zero_copy_only=False)
        return LoadedPriors(
            prior.id,
            prior.sha256,
            "groups",
            ids,
            group_of_row=np.asarray(index, np.int64),
            group_names=[str(s) for s in sorted_names.to_pylist()],
        )
    column = table.column("prior").combine_chunks()
    k = column.type.list_size
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
    return LoadedPriors(
        prior.id, prior.sha256, "probabilities", ids, probabilities=values.reshape(-1, k)
    )
