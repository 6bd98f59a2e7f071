"""Room on the disk for a release's file, checked before its ε is reserved.

Once the labels are read, a failed write is charged (``releases.service``): the
file's size depends on its noisy labels, so whether it fits must not be a free,
repeatable query. To keep a full disk from burning budget, a release first needs
room for a label-independent bound on its file: the labels file's ``example_id``
column (uncompressed, from its Parquet metadata, which holds the ids' sizes and
nothing of the labels) scaled to the scope, plus ``LABELDP_RELEASE_BYTES_PER_LABEL``
a label for its value and Parquet's framing, plus ``COMMIT_BYTES`` for the
database's commit (SQLite's file is in the data directory, and a commit the disk
refuses after the file was written would be a free 500 again). The space is
promised to the release until its file is published, so two releases in flight
cannot both take the last of it (one server per data directory:
``shared.startup.sole_server``). Other writers (uploads, the training worker) can
still take it: the check makes a charged full disk rare, not impossible.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq

from label_party.config import Settings
from label_party.exceptions import StorageUnavailableError
from shared.parquet import temp_path

logger = logging.getLogger("label_party.releases")

#: Room kept for the release's commit: its row (the mechanism's description, a
#: matrix of up to grid × outputs entries), its audit entry and the journal.
COMMIT_BYTES = 64 << 20

_lock = threading.Lock()
_promised = 0  # bytes promised to releases in flight in this server


def needed_bytes(settings: Settings, labels_file: Path, in_scope: int) -> int:
    """The bound on the file of a release of ``in_scope`` labels of ``labels_file``."""
    meta = pq.ParquetFile(labels_file).metadata
    column = meta.schema.names.index("example_id")
    id_bytes = sum(
        meta.row_group(g).column(column).total_uncompressed_size for g in range(meta.num_row_groups)
    )
    per_label = id_bytes / max(meta.num_rows, 1) + settings.release_bytes_per_label
    return int(in_scope * per_label) + COMMIT_BYTES


@contextmanager
def promised(settings: Settings, labels_file: Path, in_scope: int) -> Iterator[None]:
    """Hold room for the release's file, or refuse it (507, nothing spent) when the
    data directory is plainly full or cannot be written."""
    global _promised
    need = needed_bytes(settings, labels_file, in_scope)
    probe = temp_path(settings.tmp_dir)  # an unwritable directory fails here, for free
    probe.touch()
    probe.unlink()
    settings.releases_dir.mkdir(parents=True, exist_ok=True)
    # Where the file is written, where it is published, where the database commits:
    # three filesystems when an operator mounted them apart.
    places = (settings.tmp_dir, settings.releases_dir, settings.data_dir)
    with _lock:
        free = min(shutil.disk_usage(place).free for place in places) - _promised
        if free < need:
            # The free space is the operator's to see: it counts the labels file.
            logger.warning(
                "release refused: no room for its file",
                extra={"fields": {"free_bytes": free, "needed_bytes": need}},
            )
            raise StorageUnavailableError(
                f"the data directory has no room for this release's file (about {need} "
                "bytes); its operator must free space. Nothing was spent",
                detail={"needed_bytes": need},
            )
        _promised += need
    try:
        yield
    finally:
        with _lock:
            _promised -= need
