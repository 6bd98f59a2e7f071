"""Parquet files on disk: atomic writes and content hashes.

Label arrays and releases are stored as Parquet files (DESIGN.md §7); a release
file is named by the SHA-256 of its bytes, so the name is also its checksum.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

TableOrBatch = TypeVar("TableOrBatch", pa.Table, pa.RecordBatch)

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
    """Move a finished temporary file to ``directory/<sha256><extension>``
    (:func:`publish`); the final path and the hash."""
    sha = sha256_file(tmp)
    final = directory / f"{sha}{extension}"
    publish(tmp, final)
    return final, sha


def publish(tmp: Path, final: Path) -> None:
    """Move a finished temporary file to ``final``, durably.

    The file is fsynced before the rename and the directory after it, so that a
    row committed next never points at a file that a power loss can take back:
    without the second, the rename may reach the disk after the commit, and the
    start-up sweep deletes ``tmp/``. A ``final`` on another filesystem than
    ``tmp`` (an operator's mount) gets a copy, written beside it and renamed there.
    """
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, final)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        _copy_across(tmp, final)
    fsync_directory(final.parent)


def _copy_across(tmp: Path, final: Path) -> None:
    """``tmp`` to ``final`` across filesystems: a durable copy beside ``final``, then
    a rename within its filesystem (never half a file under the final name)."""
    partial = final.with_name(f".{uuid.uuid4().hex}.partial")
    try:
        shutil.copyfile(tmp, partial)
        with partial.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    tmp.unlink(missing_ok=True)


def fsync_directory(directory: Path) -> None:
    """Flush a directory's entries (a rename into it) to disk (POSIX)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some network and FUSE filesystems cannot sync a directory; they give no
        # stronger promise to keep, so the write stands (as SQLite does there).
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


#: An uploaded Parquet file may decode to at most this many times its own size …
#: (legitimate files go up to ~100×: ids with long shared prefixes, labels from a
#: small domain, all-zero one-hot feature columns that run-length encode to nothing)
MAX_EXPANSION = 1000
#: … or to this many bytes, whichever is more.
MIN_DECODED_BYTES = 256 << 20
_BATCH_ROWS = 1 << 16


class ParquetTooLargeError(ValueError):
    """An uploaded Parquet file decodes to far more than it weighs (a compression
    bomb: a few hundred kB of repeated long strings can decode to gigabytes)."""

    def __init__(self, limit: int, absolute: bool = False) -> None:
        super().__init__(
            f"the Parquet file decodes to more than {limit} bytes"
            + ("" if absolute else f" ({MAX_EXPANSION}× its size, and at least 256 MiB)")
            + "; split it or send CSV"
        )
        self.limit = limit


def _declared_bytes(file: pq.ParquetFile, columns: list[str] | None) -> int:
    """What the file's metadata says its (chosen) columns decode to at least: rows ×
    width for a fixed-width column (a run of zeros encodes to nothing but decodes
    to 8 bytes a row), the pages' uncompressed size otherwise. A file over the
    bound by this count is refused before a byte is decoded."""
    metadata = file.metadata
    paged: dict[str, int] = {}  # each top-level column's uncompressed page bytes
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        for j in range(group.num_columns):
            chunk = group.column(j)
            name = chunk.path_in_schema.split(".")[0]
            paged[name] = paged.get(name, 0) + chunk.total_uncompressed_size
    total = 0
    for field in file.schema_arrow:
        if columns is not None and field.name not in columns:
            continue
        try:
            total += metadata.num_rows * field.type.bit_width // 8
        except ValueError:  # variable width: what the pages hold
            total += paged.get(field.name, 0)
    return total


def read_parquet_bounded(
    source: IO[bytes] | Path,
    columns: list[str] | None = None,
    *,
    memory_map: bool = False,
    min_decoded_bytes: int = MIN_DECODED_BYTES,
    max_decoded_bytes: int | None = None,
) -> pa.Table:
    """``pq.read_table`` for uploads: read batch by batch, and stop with
    :class:`ParquetTooLargeError` once the decoded data passes the bound, before
    the service has spent the memory. ``max_decoded_bytes`` caps the bound
    absolutely (a file whose metadata already declares more is refused unread)."""
    file, batches = _bounded(source, columns, memory_map, min_decoded_bytes, max_decoded_bytes)
    read = list(batches)
    if read:
        return pa.Table.from_batches(read)
    return plain_types(file.read(columns=columns))  # no rows: the file's own (empty) table


def iter_parquet_bounded(
    source: Path, columns: list[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """:func:`read_parquet_bounded`'s batches, for a reader that keeps none of them
    (the bound still stops a compression bomb's decoding early)."""
    return _bounded(source, columns, True, MIN_DECODED_BYTES, None)[1]


def _bounded(
    source: IO[bytes] | Path,
    columns: list[str] | None,
    memory_map: bool,
    min_decoded_bytes: int,
    max_decoded_bytes: int | None,
) -> tuple[pq.ParquetFile, Iterator[pa.RecordBatch]]:
    """The file, checked against its declared size, and its batches, checked as
    they are decoded."""
    if isinstance(source, Path):
        size = source.stat().st_size
        file = pq.ParquetFile(source, memory_map=memory_map)
    else:
        size = source.seek(0, os.SEEK_END)
        source.seek(0)
        file = pq.ParquetFile(source)
    limit = max(MAX_EXPANSION * size, min_decoded_bytes)
    absolute = max_decoded_bytes is not None and max_decoded_bytes < limit
    if max_decoded_bytes is not None:
        limit = min(limit, max_decoded_bytes)
    names = file.schema_arrow.names
    for name in columns or ():
        if names.count(name) != 1:  # as pq.read_table: a column must name one field
            raise pa.ArrowInvalid(f"column {name!r} occurs {names.count(name)} times")
    if _declared_bytes(file, columns) > limit:
        raise ParquetTooLargeError(limit, absolute)

    def batches() -> Iterator[pa.RecordBatch]:
        decoded = 0
        for batch in file.iter_batches(batch_size=_BATCH_ROWS, columns=columns):
            decoded += batch.nbytes
            if decoded > limit:
                raise ParquetTooLargeError(limit, absolute)
            yield plain_types(batch)

    return file, batches()


#: Arrow's view layouts, and the types with the same values that every reader of
#: an upload knows. pyarrow writes a ``string_view`` column to Parquet and reads it
#: back as one: a feature of that type was stored as "ignored", unused, and an id
#: column of it refused as not text (helper-78).
_VIEWS = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}


def plain_types(data: TableOrBatch) -> TableOrBatch:
    """``data`` with its view columns as plain strings and bytes; as it is otherwise."""
    schema = data.schema
    if not any(field.type in _VIEWS for field in schema):
        return data
    plain = pa.schema([field.with_type(_VIEWS.get(field.type, field.type)) for field in schema])
    return data.cast(plain)
