"""Temporary files under ``data_dir/tmp``: multipart uploads spooled to disk with
a size limit (413 above it), and the sweep of those a killed process left."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from starlette.datastructures import UploadFile

from feature_party.errors import PayloadTooLargeError

#: A temporary file untouched this long belongs to no live request: downloads and
#: uploads write continuously, and the services' timeouts are minutes.
STALE_SECONDS = 3600.0


def sweep_stale(directory: Path, *, older_than: float = STALE_SECONDS) -> int:
    """Delete the files in ``directory`` not modified for ``older_than`` seconds
    (the parts of downloads and uploads whose process was killed); their number.
    Younger ones may be a worker's or another server's, writing now."""
    if not directory.is_dir():
        return 0
    cutoff = time.time() - older_than
    removed = 0
    for path in directory.iterdir():
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:  # another process's sweep, or its owner, was first
            continue
    return removed


@contextmanager
def spooled(upload: UploadFile, *, directory: Path, max_bytes: int) -> Iterator[Path]:
    """The upload as a temporary file in ``directory`` (removed afterwards)."""
    if upload.size is not None and upload.size > max_bytes:
        raise PayloadTooLargeError(
            f"the upload is larger than {max_bytes} bytes", detail={"max_bytes": max_bytes}
        )
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".upload", delete=False) as tmp:
        path = Path(tmp.name)
    try:
        # Inside the try: a copy that fails (a full disk) must not leave its part behind.
        with path.open("wb") as out:
            shutil.copyfileobj(upload.file, out, length=1 << 20)
        if path.stat().st_size > max_bytes:
            raise PayloadTooLargeError(
                f"the upload is larger than {max_bytes} bytes", detail={"max_bytes": max_bytes}
            )
        yield path
    finally:
        path.unlink(missing_ok=True)
