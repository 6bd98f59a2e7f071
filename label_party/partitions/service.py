"""Partition plans: a label-independent assignment of examples to named parts.

The features party (or the operator) registers one plan per dataset, from
features only (LP-MST stages); a release may then touch chosen parts, and the
ledger composes per part (DESIGN.md §3.4). A plan is fixed once registered
(409 on another one): replacing it would change which examples past releases
touched. Registering the very same assignment again (a client retrying after a
crash that lost the answer) returns the registered plan: only the same examples in
each part may be adopted, which equal part sizes alone would not show. Examples
outside the plan belong to no part and are touched only by whole-dataset
releases. Nothing here reads labels.
"""

from __future__ import annotations

import uuid
from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sqlalchemy.orm import Session, sessionmaker

from label_party.audit import service as audit
from label_party.auth import Principal, confirm, visible_dataset
from label_party.config import Settings
from label_party.db import transaction
from label_party.exceptions import ConflictError, InvalidRequestError
from label_party.labels.validation import (
    FileFormat,
    as_strings,
    mark_ids,
    mark_names,
    read_table,
    report,
)
from label_party.ledger.service import lock_dataset
from label_party.models import Dataset, PartitionPlan
from label_party.partitions import repository
from label_party.storage import partition_path, persisted, write_table

COLUMNS = ("example_id", "part")
MAX_PARTS = 10_000
MAX_PART_NAME = 200
REASONS = ("", "missing example_id", "duplicate example_id", "missing part", "part name too long")
SCHEMA = pa.schema([("example_id", pa.string()), ("part", pa.string())])


def get_plan(session: Session, dataset_id: str) -> PartitionPlan | None:
    return repository.for_dataset(session, dataset_id)


def register(
    session: Session,
    settings: Settings,
    principal: Principal,
    dataset_id: str,
    source: IO[bytes],
    fmt: FileFormat,
    *,
    unlocked: sessionmaker[Session],
) -> tuple[PartitionPlan, bool]:
    """The plan and whether it was registered now (False: ``source`` assigns the same
    examples to the same parts as the dataset's plan, which is returned).

    As for labels, the file is read (seconds for millions of rows) after a short read
    transaction of ``unlocked`` and before ``session`` locks the dataset: on SQLite
    the whole database's write lock. A plan, once registered, never changes, so a
    retry is compared with it outside the lock.
    """
    with transaction(unlocked) as reader:
        existing = get_plan(reader, visible_dataset(reader, principal, dataset_id).id)
    clean, sizes = _parse(source, fmt)
    if existing is None:
        dataset = lock_dataset(session, dataset_id)
        confirm(session, principal)
        existing = get_plan(session, dataset.id)  # registered while the file was read?
        if existing is None:
            return _create(session, settings, principal, dataset, clean, sizes), True
    stored = persisted(settings, partition_path(settings, existing), "the partition plan")
    if not _same_assignment(clean, pq.read_table(stored)):
        raise ConflictError(
            "the dataset already has another partition plan (one per dataset; registering "
            "the same assignment again returns it)"
        )
    return existing, False


def _create(
    session: Session,
    settings: Settings,
    principal: Principal,
    dataset: Dataset,
    clean: pa.Table,
    sizes: dict[str, int],
) -> PartitionPlan:
    """Store the plan of ``dataset`` (locked, with no plan yet) and log it."""
    sha = write_table(settings, clean, settings.partitions_dir / dataset.id)
    plan = PartitionPlan(
        id=str(uuid.uuid4()),
        dataset_id=dataset.id,
        parts=sizes,
        sha256=sha,
        created_by=principal.id,
    )
    session.add(plan)
    session.flush()
    audit.append(
        session,
        actor=principal.id,
        action="partition.created",
        dataset_id=dataset.id,
        payload={"plan_id": plan.id, "parts": sorted(sizes), "sha256": sha},
    )
    return plan


def _parse(source: IO[bytes], fmt: FileFormat) -> tuple[pa.Table, dict[str, int]]:
    """The upload as ``(example_id, part)`` strings and its part sizes, or a 422
    naming the bad rows."""
    table = read_table(source, fmt, COLUMNS)
    if table.num_rows == 0:
        raise InvalidRequestError("the file has no rows")
    ids, parts = as_strings(table, "example_id"), as_strings(table, "part")
    reasons = np.zeros(table.num_rows, dtype=np.int8)
    mark_ids(reasons, ids)
    mark_names(reasons, parts, MAX_PART_NAME)
    report(reasons, REASONS)
    counts = pc.value_counts(parts).flatten()
    if len(counts[0]) > MAX_PARTS:
        raise InvalidRequestError(f"a plan has at most {MAX_PARTS} parts")
    sizes = dict(zip(counts[0].to_pylist(), counts[1].to_pylist(), strict=True))
    return pa.table({"example_id": ids, "part": parts}).cast(SCHEMA), sizes


def _same_assignment(a: pa.Table, b: pa.Table) -> bool:
    """Whether two plans put the same examples in the same parts, in any row order."""
    if a.num_rows != b.num_rows:
        return False
    order = [("example_id", "ascending")]
    same = a.sort_by(order).equals(b.select(["example_id", "part"]).cast(SCHEMA).sort_by(order))
    return bool(same)
