"""The data directory: label arrays, partition plans and releases as Parquet files.

Layout (under ``LABELDP_DATA_DIR``)::

    labels/<dataset id>/<sha256>.parquet      example_id: string, label: float64, by example_id
    partitions/<dataset id>/<sha256>.parquet  example_id: string, part: string
    priors/<dataset id>/<sha256>.parquet      example_id plus a group or K probabilities
    releases/<sha256>.parquet                 example_id: string, label: float64
    tmp/                                      files being written
    trainings/features/<sha256>.parquet       a training's public features
    trainings/models/<sha256>.pt              a trained model artifact
    trainings/tmp/                            training files being written
    trainings/checkpoints/<training id>.pt    a running training's last saved state

A file is written under ``tmp/`` (``trainings/tmp/``) and moved to its
content-addressed name before the transaction that references it commits; a
crash in between leaves an unreferenced file, never a row pointing at a missing
one. Raw labels are read only by the release pipeline and the training worker;
nothing serves them.

Labels are stored in ``example_id`` order (:func:`in_public_order`), and every
release lists them in the order they are stored: the order of an uploaded file may
be a function of its labels (an export ``ORDER BY value``, or grouped by class),
which no mechanism's noise covers (DESIGN.md §3.1).

Training files have their own ``tmp/`` because the training worker
(``labeldp label-party worker``) is a separate process that may be writing a
model while a server starts: the start-up sweep only touches training files
older than :data:`TRAININGS_GRACE_SECONDS`.
"""

from __future__ import annotations

import errno
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from label_party.config import Settings
from label_party.exceptions import FileMissingError
from label_party.models import (
    Dataset,
    PartitionPlan,
    PriorSet,
    Release,
    ReplacedLabels,
    Training,
)
from shared.lease_queue import Status
from shared.parquet import publish_by_hash, temp_path

logger = logging.getLogger("label_party.storage")

ROW_GROUP = 1 << 20

#: Training files younger than this are never swept: a request or the worker may
#: have published one whose row is not committed yet (both take seconds; an hour
#: leaves a wide margin for a slow disk or a large upload).
TRAININGS_GRACE_SECONDS = 3600.0


def write_table(settings: Settings, table: pa.Table, directory: Path) -> str:
    """Write ``table`` to ``directory/<sha256>.parquet``; returns the hash."""
    tmp = temp_path(settings.tmp_dir)
    try:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP, compression="snappy")
        _final, sha = publish_by_hash(tmp, directory)
    finally:
        tmp.unlink(missing_ok=True)
    return sha


#: Schema metadata of a labels file stored in ``example_id`` order: every file
#: written since 2026-11-24. An older file, in its upload's order, is sorted as read.
PUBLIC_ORDER = {b"labeldp.order": b"example_id"}


def in_public_order(table: pa.Table) -> pa.Table:
    """``table`` (unique ``example_id`` s) sorted by ``example_id`` and marked so: an
    order that is a function of the public ids alone. A file already in that order
    (an export ``ORDER BY id``) is not sorted again."""
    ids = table.column("example_id")
    ordered = len(ids) < 2 or pc.all(pc.less(ids.slice(0, len(ids) - 1), ids.slice(1))).as_py()
    return (table if ordered else table.sort_by("example_id")).replace_schema_metadata(PUBLIC_ORDER)


def label_batches(path: Path, batch_size: int) -> Iterator[pa.RecordBatch]:
    """The labels file's rows in ``example_id`` order, ``batch_size`` at a time:
    streamed from a file stored in that order, sorted in memory from an older one."""
    file = pq.ParquetFile(path)
    metadata = file.schema_arrow.metadata or {}
    if all(metadata.get(k) == v for k, v in PUBLIC_ORDER.items()):
        yield from file.iter_batches(batch_size=batch_size)
    else:
        yield from in_public_order(file.read()).to_batches(max_chunksize=batch_size)


def labels_path(settings: Settings, dataset: Dataset) -> Path:
    assert dataset.labels_sha256 is not None
    return settings.labels_dir / dataset.id / f"{dataset.labels_sha256}.parquet"


def partition_path(settings: Settings, plan: PartitionPlan) -> Path:
    return settings.partitions_dir / plan.dataset_id / f"{plan.sha256}.parquet"


def release_path(settings: Settings, sha256: str) -> Path:
    return settings.releases_dir / f"{sha256}.parquet"


def delete_after_commit(
    session: Session,
    path: Path,
    what: str,
    *,
    named_again: Callable[[Session], bool] | None = None,
) -> None:
    """Delete ``path`` once ``session``'s transaction commits (before it, a row may
    still name the file). A crash in between leaves it to the start-up sweep
    (``orphans/``); a failed deletion is logged, never the request's failure.

    ``named_again``, for a file a later request may publish anew (content-named
    labels: B replaced A, then A came back), runs first in a transaction of its
    own that takes the lock such a request publishes under, and the file is kept
    if it says a row names it again: deleted after that request's commit, the live
    file was gone (helper-72)."""

    def delete(committed: Session) -> None:
        try:
            if named_again is not None:
                with Session(committed.get_bind()) as check, check.begin():
                    if named_again(check):
                        return
                    path.unlink(missing_ok=True)  # under the lock
                return
            path.unlink(missing_ok=True)
        except Exception as exc:  # the request has committed: log only
            logger.error("%s not deleted", what, exc_info=exc)

    event.listen(session, "after_commit", delete, once=True)


def persisted(settings: Settings, path: Path, what: str) -> Path:
    """``path``, a file a committed row names, for a download; ``file_missing``
    (logged, with its place in the data directory) when it is gone, where the
    download failed with an anonymous 500 midway through its answer."""
    if path.is_file():
        return path
    where = path.relative_to(settings.data_dir) if path.is_relative_to(settings.data_dir) else path
    fields = {"what": what, "file": str(where)}
    logger.error("a persisted file is missing", extra={"fields": fields})
    raise FileMissingError(
        f"the stored file of {what} is missing from the labels party's data directory "
        f"({where}): its operator must restore it from a backup"
    )


def training_features_dir(settings: Settings) -> Path:
    return settings.trainings_dir / "features"


def training_features_path(settings: Settings, sha256: str) -> Path:
    return training_features_dir(settings) / f"{sha256}.parquet"


def training_models_dir(settings: Settings) -> Path:
    return settings.trainings_dir / "models"


def training_model_path(settings: Settings, sha256: str) -> Path:
    return training_models_dir(settings) / f"{sha256}.pt"


def training_tmp_dir(settings: Settings) -> Path:
    return settings.trainings_dir / "tmp"


def training_checkpoint_path(settings: Settings, training_id: str) -> Path:
    return settings.trainings_dir / "checkpoints" / f"{training_id}.pt"


def set_aside(settings: Settings, path: Path) -> int:
    """Move an unreferenced file under ``orphans/`` instead of deleting it: a server
    started against the wrong (or an empty) database must not destroy data. Across
    filesystems (``releases/`` may be a mount of its own) it is copied, then
    removed. A file that cannot be moved (permissions) stays, named in a warning:
    an unreferenced file is harmless, and a server that refused to start over one
    would restart into the same refusal. Returns how many files were moved (0 or 1)."""
    relative = path.relative_to(settings.data_dir)
    target = settings.data_dir / "orphans" / relative
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, target)
    except OSError as exc:
        _warn_left("could not set an unreferenced file aside; it stays where it is", relative, exc)
        return 0
    return 1


def _delete_partial(path: Path) -> int:
    """Delete a partial write; one that cannot be deleted is named in a warning."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        _warn_left("could not delete a partial write", Path(path.name), exc)
        return 0
    return 1


def _warn_left(message: str, file: Path, exc: OSError) -> None:
    """A sweep's warning about a file it had to leave (named, never its contents)."""
    error = exc.strerror or type(exc).__name__
    logger.warning(
        message, extra={"fields": {"file": str(file), "errno": exc.errno, "error": error}}
    )


def sweep_orphans(
    settings: Settings,
    session: Session,
    *,
    trainings_grace_seconds: float = TRAININGS_GRACE_SECONDS,
) -> int:
    """Set aside files no committed row references (left by a crash before commit).

    Partial writes under ``tmp/`` are deleted; complete files that no row
    references are moved to ``orphans/`` for the operator to inspect or delete.
    Run at start-up, before the server accepts requests; ``labeldp label-party
    serve`` holds the data directory's lock (``shared.startup.sole_server``), so no
    other server is writing there. Training files are swept only once older than
    ``trainings_grace_seconds`` (see the module docstring).
    """
    removed = _sweep_trainings(settings, session, grace_seconds=trainings_grace_seconds)
    if settings.tmp_dir.exists():
        for path in settings.tmp_dir.iterdir():
            removed += _delete_partial(path)
    referenced = set(session.scalars(select(Release.sha256)))
    if settings.releases_dir.exists():
        for path in settings.releases_dir.glob("*.parquet"):
            if path.stem not in referenced:
                removed += set_aside(settings, path)
    keep = {
        (d, s)
        for d, s in session.execute(select(Dataset.id, Dataset.labels_sha256))
        if s is not None
    }
    removed += _delete_replaced_labels(settings, session, current=keep)
    keep |= {
        (d, s) for d, s in session.execute(select(PartitionPlan.dataset_id, PartitionPlan.sha256))
    }
    keep |= {(d, s) for d, s in session.execute(select(PriorSet.dataset_id, PriorSet.sha256))}
    for root in (settings.labels_dir, settings.partitions_dir, settings.priors_dir):
        if root.exists():
            for path in root.glob("*/*.parquet"):
                if (path.parent.name, path.stem) not in keep:
                    removed += set_aside(settings, path)
    if removed:
        logger.warning(
            "set aside unreferenced files under orphans/",
            extra={"fields": {"files": removed}},
        )
    return removed


def _delete_replaced_labels(
    settings: Settings, session: Session, *, current: set[tuple[str, str]]
) -> int:
    """Delete the labels files that uploads replaced, where a crash came between
    the upload's commit and the deletion (a row of ``replaced_labels`` names each),
    unless a later upload named the same file again; their rows go with them. Raw
    labels a correction or a deletion request replaced were set aside whole in
    ``orphans/`` (helper-83). Files no row names are still only set aside: a
    database restored from an older backup knows nothing of them."""
    deleted = 0
    for row in session.scalars(select(ReplacedLabels)).all():
        path = settings.labels_dir / row.dataset_id / f"{row.sha256}.parquet"
        if (row.dataset_id, row.sha256) not in current and path.exists():
            try:
                path.unlink()
            except OSError as exc:  # kept, and its row, for the next start
                # The errno and the dataset, not the text: the file's name is a hash
                # of the labels (DESIGN.md §3.1).
                fields = {
                    "dataset_id": row.dataset_id,
                    "errno": errno.errorcode.get(exc.errno or 0),
                }
                logger.error("replaced labels not deleted", extra={"fields": fields})
                continue
            deleted += 1
        session.delete(row)
    if deleted:
        logger.warning(
            "deleted replaced labels a crash had left", extra={"fields": {"files": deleted}}
        )
    return deleted


def _sweep_trainings(settings: Settings, session: Session, *, grace_seconds: float) -> int:
    """The training files of :func:`sweep_orphans`: features and models that no
    training row references (whatever its status: a failed or cancelled
    training's row still names its features), checkpoints of trainings that can
    no longer resume, and stale partial writes."""
    cutoff = time.time() - grace_seconds
    removed = 0
    checkpoints = settings.trainings_dir / "checkpoints"
    partials = checkpoints.glob(".*.partial") if checkpoints.exists() else iter(())
    tmp = training_tmp_dir(settings)
    for path in [*(tmp.iterdir() if tmp.exists() else ()), *partials]:
        if _older_than(path, cutoff):
            removed += _delete_partial(path)
    # Read the rows before listing the files: a file published after this query
    # is younger than the cutoff, so it is never taken for an orphan.
    features = set(session.scalars(select(Training.features_sha256)))
    models = {s for s in session.scalars(select(Training.model_sha256)) if s is not None}
    # A checkpoint is only worth keeping while its training may still resume.
    unfinished = set(
        session.scalars(
            select(Training.id).where(Training.status.in_((Status.QUEUED, Status.RUNNING)))
        )
    )
    for root, pattern, keep in (
        (training_features_dir(settings), "*.parquet", features),
        (training_models_dir(settings), "*.pt", models),
        (checkpoints, "*.pt", unfinished),
    ):
        if root.exists():
            for path in root.glob(pattern):
                if path.stem not in keep and _older_than(path, cutoff):
                    removed += set_aside(settings, path)
    return removed


def _older_than(path: Path, cutoff: float) -> bool:
    """Last modified before ``cutoff``; False if it vanished meanwhile."""
    try:
        return path.stat().st_mtime < cutoff
    except FileNotFoundError:
        return False
