"""The data directory: label arrays, partition plans and releases as Parquet files.

Layout (under ``LABELDP_DATA_DIR``)::

    labels/<dataset id>/<sha256>.parquet      example_id: string, label: float64
    partitions/<dataset id>/<sha256>.parquet  example_id: string, part: string
    priors/<dataset id>/<sha256>.parquet      example_id plus a group or K probabilities
    releases/<sha256>.parquet                 example_id: string, label: float64
    tmp/                                      files being written

A file is written under ``tmp/`` and moved to its content-addressed name before
the transaction that references it commits; a crash in between leaves an
unreferenced file, never a row pointing at a missing one. Raw labels are read
only by the release pipeline; nothing serves them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.orm import Session

from label_party.config import Settings
from label_party.models import Dataset, PartitionPlan, PriorSet, Release
from shared.parquet import publish_by_hash, temp_path

logger = logging.getLogger("label_party.storage")

ROW_GROUP = 1 << 20


def write_table(settings: Settings, table: pa.Table, directory: Path) -> str:
    """Write ``table`` to ``directory/<sha256>.parquet``; returns the hash."""
    tmp = temp_path(settings.tmp_dir)
    try:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP, compression="snappy")
        _final, sha = publish_by_hash(tmp, directory)
    finally:
        tmp.unlink(missing_ok=True)
    return sha


def labels_path(settings: Settings, dataset: Dataset) -> Path:
    assert dataset.labels_sha256 is not None
    return settings.labels_dir / dataset.id / f"{dataset.labels_sha256}.parquet"


def partition_path(settings: Settings, plan: PartitionPlan) -> Path:
    return settings.partitions_dir / plan.dataset_id / f"{plan.sha256}.parquet"


def release_path(settings: Settings, sha256: str) -> Path:
    return settings.releases_dir / f"{sha256}.parquet"


def _quarantine(settings: Settings, path: Path) -> None:
    """Move an unreferenced file under ``orphans/`` instead of deleting it: a server
    started against the wrong (or an empty) database must not destroy data."""
    target = settings.data_dir / "orphans" / path.relative_to(settings.data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    path.replace(target)


def sweep_orphans(settings: Settings, session: Session) -> int:
    """Set aside files no committed row references (left by a crash before commit).

    Partial writes under ``tmp/`` are deleted; complete files that no row
    references are moved to ``orphans/`` for the operator to inspect or delete.
    Run at start-up, before the server accepts requests; assumes one server per
    data directory.
    """
    removed = 0
    if settings.tmp_dir.exists():
        for path in settings.tmp_dir.iterdir():
            path.unlink(missing_ok=True)
            removed += 1
    referenced = set(session.scalars(select(Release.sha256)))
    if settings.releases_dir.exists():
        for path in settings.releases_dir.glob("*.parquet"):
            if path.stem not in referenced:
                _quarantine(settings, path)
                removed += 1
    keep = {
        (d, s)
        for d, s in session.execute(select(Dataset.id, Dataset.labels_sha256))
        if s is not None
    }
    keep |= {
        (d, s) for d, s in session.execute(select(PartitionPlan.dataset_id, PartitionPlan.sha256))
    }
    keep |= {(d, s) for d, s in session.execute(select(PriorSet.dataset_id, PriorSet.sha256))}
    for root in (settings.labels_dir, settings.partitions_dir, settings.priors_dir):
        if root.exists():
            for path in root.glob("*/*.parquet"):
                if (path.parent.name, path.stem) not in keep:
                    _quarantine(settings, path)
                    removed += 1
    if removed:
        logger.warning(
            "set aside unreferenced files under orphans/",
            extra={"fields": {"files": removed}},
        )
    return removed
