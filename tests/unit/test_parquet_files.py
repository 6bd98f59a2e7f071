"""Parquet files on disk: publishing a file by its hash (the name is the checksum;
the file and the rename are on disk before the caller commits a row that points at
it), and reading an upload with a bound on what it decodes to."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shared.parquet import (
    MAX_EXPANSION,
    ParquetTooLargeError,
    publish_by_hash,
    read_parquet_bounded,
    temp_path,
)


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


def test_a_parquet_bomb_is_refused_before_it_is_decoded_whole(tmp_path: Path) -> None:
    """A few kB of one repeated long string decode to megabytes: the reader stops
    once the decoded size passes 1000× the file's (here with a 1 MiB floor)."""
    bomb = tmp_path / "bomb.parquet"
    ids = pa.array(["x" * 10_000] * 5_000)  # 50 MB decoded, dictionary-encoded on disk
    pq.write_table(pa.table({"example_id": ids, "label": pa.array([1.0] * 5_000)}), bomb,
                   compression="zstd")  # fmt: skip
    assert bomb.stat().st_size < 100_000
    with pytest.raises(ParquetTooLargeError) as refused:
        read_parquet_bounded(bomb, ["example_id"], min_decoded_bytes=1 << 20)
    assert refused.value.limit == max(MAX_EXPANSION * bomb.stat().st_size, 1 << 20)
    with bomb.open("rb") as fh, pytest.raises(ParquetTooLargeError):
        read_parquet_bounded(fh, min_decoded_bytes=1 << 20)


def test_an_absolute_bound_refuses_what_the_metadata_declares_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "zeros.parquet"
    zeros = {f"z{j}": pa.array([0.0] * 10_000) for j in range(50)}  # 4 MB decoded
    pq.write_table(pa.table(zeros), path, compression="zstd")
    assert path.stat().st_size < 100_000
    read_parquet_bounded(path, max_decoded_bytes=8 << 20)  # under the bound: read

    def no_decoding(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the file was decoded")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", no_decoding)
    with pytest.raises(ParquetTooLargeError, match="more than 1048576 bytes; split") as refused:
        read_parquet_bounded(path, max_decoded_bytes=1 << 20)
    assert refused.value.limit == 1 << 20


def test_a_bounded_read_is_the_plain_read(tmp_path: Path) -> None:
    path = tmp_path / "labels.parquet"
    table = pa.table({"example_id": [f"e{i}" for i in range(200_000)],
                      "label": pa.array(range(200_000), pa.float64())})  # fmt: skip
    pq.write_table(table, path, row_group_size=50_000)
    assert read_parquet_bounded(path).equals(pq.read_table(path))
    with path.open("rb") as fh:
        assert read_parquet_bounded(fh, ["label"]).equals(pq.read_table(path, columns=["label"]))
    empty = tmp_path / "empty.parquet"
    pq.write_table(table.slice(0, 0), empty)
    assert read_parquet_bounded(empty, ["example_id"]).column_names == ["example_id"]


def test_a_column_must_name_one_field_as_in_read_table(tmp_path: Path) -> None:
    """A repeated column name is an unreadable file (422 for an upload), not a table
    with two ``label`` columns that fails later with a 500."""
    path = tmp_path / "repeated.parquet"
    table = pa.Table.from_arrays([pa.array(["a"]), pa.array([1.0]), pa.array([2.0])],
                                 names=["example_id", "label", "label"])  # fmt: skip
    pq.write_table(table, path)
    with pytest.raises(pa.ArrowInvalid, match="occurs 2 times"):
        read_parquet_bounded(path, ["example_id", "label"])
    with pytest.raises(pa.ArrowInvalid, match="occurs 0 times"):
        read_parquet_bounded(path, ["nope"])
