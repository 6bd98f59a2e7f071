"""Parquet files on disk: atomic writes and content hashes.

Label arrays and releases are stored as Parquet files (DESIGN.md §7); a release
file is named by the SHA-256 of its bytes, so the name is also its checksum.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

HASH_BLOCK = 1 << 22


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def temp_path(directory: Path, suffix: str = ".tmp") -> Path:
    """A fresh, unused path inside ``directory`` (created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f".{uuid.uuid4().hex}{suffix}"


def publish_by_hash(tmp: Path, directory: Path, extension: str = ".parquet") -> tuple[Path, str]:
    """Move a finished temporary file to ``directory/<sha256><extension>``.

    Returns the final path and the hash. The file is fsynced before the rename and
    the directory after it, so that a row committed next never points at a file
    that a power loss can take back: without the second, the rename may reach
    the disk after the commit, and the start-up sweep deletes ``tmp/``.
    """
    sha = sha256_file(tmp)
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{sha}{extension}"
    os.replace(tmp, final)
    fsync_directory(directory)
    return final, sha


def fsync_directory(directory: Path) -> None:
    """Flush a directory's entries (a rename into it) to disk (POSIX)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
