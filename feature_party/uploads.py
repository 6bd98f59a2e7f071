"""Spooling multipart uploads to disk with a size limit (413 above it)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from starlette.datastructures import UploadFile

from feature_party.errors import PayloadTooLargeError


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
