"""Publishing a file by its hash: the name is the checksum, and the file and the
rename are on disk before the caller commits a row that points at it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from shared.parquet import publish_by_hash, temp_path


def test_publish_names_the_file_by_its_hash_and_leaves_no_temporary(tmp_path: Path) -> None:
    tmp = temp_path(tmp_path / "tmp")
    tmp.write_bytes(b"noisy labels")
    final, sha = publish_by_hash(tmp, tmp_path / "releases")
    assert sha == hashlib.sha256(b"noisy labels").hexdigest()
    assert final == tmp_path / "releases" / f"{sha}.parquet"
    assert final.read_bytes() == b"noisy labels"
    assert list((tmp_path / "tmp").iterdir()) == []


def test_publish_fsyncs_the_file_then_the_directory_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row committed after a rename that had not reached the disk could point at
    nothing after a power loss; the directory's fsync is what makes it durable."""
    releases = tmp_path / "releases"
    synced: list[tuple[str, bool]] = []  # (path, whether the rename had happened)
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        renamed = releases.exists() and any(releases.iterdir())
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), renamed))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    tmp = temp_path(tmp_path / "tmp")
    tmp.write_bytes(b"x")
    publish_by_hash(tmp, releases)
    assert [(Path(path), renamed) for path, renamed in synced] == [(tmp, False), (releases, True)]
