"""Writing ``torch.save`` files (model artifacts, training checkpoints) so that a
crash never leaves half a file and a full disk says so.

torch's own writer reports a failed write as a bare ``RuntimeError`` ("unexpected
pos …"), which a worker cannot tell from a bug; both parties' workers leave work
to retry when storage refuses a write (``shared.worker_loop.left_to_retry``) and
fail it otherwise. :func:`save_torch_file` streams through a Python file object
and raises the ``OSError`` (ENOSPC, EDQUOT, EFBIG…) that stopped the write.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, BinaryIO

import torch

from shared.parquet import fsync_directory

__all__ = ["save_torch_file"]


class _Sink:
    """The file torch writes to, keeping the ``OSError`` torch's writer swallows."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.fh.flush()


def save_torch_file(path: Path, obj: Any, *, fsync: bool = False) -> None:
    """``torch.save(obj)`` to ``path`` atomically: a temporary file of its own name
    (``.<name>.<random>.partial``: two writers never share one), then a rename;
    with ``fsync``, the file before the rename and its directory after it, for files
    that must survive a power cut (released models).
    Storage refusing a write raises its ``OSError``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        with partial.open("wb") as fh:
            sink = _Sink(fh)
            try:
                torch.save(obj, sink)  # type: ignore[arg-type]  # any object with write()
            except RuntimeError:
                if sink.error is not None:
                    raise sink.error from None
                raise
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        partial.replace(path)
        if fsync:
            fsync_directory(path.parent)
    finally:
        partial.unlink(missing_ok=True)
