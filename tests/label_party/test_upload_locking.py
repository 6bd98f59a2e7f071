"""Uploads read their file before they lock the dataset.

Reading and checking a file of millions of rows takes seconds; on SQLite the
dataset's lock is the whole database's write lock, so an upload that read its file
under the lock stalled every other write meanwhile (a 108 MB partition plan held
an unrelated write for 3.3 s). Each upload's file here checks, when it is first
read, that another connection could lock the dataset at once.
"""

from __future__ import annotations

import io
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from label_party import example_priors, labels, partitions
from label_party.auth import ADMIN_ID, Principal
from label_party.config import Settings
from label_party.db import Database, connect, transaction
from tests.label_party.conftest import Server
from tests.label_party.helpers import create_dataset, parquet_bytes

ADMIN = Principal(ADMIN_ID, "admin")


def _lock_is_free(url: str, dataset_id: str) -> bool:
    """Whether another connection could lock the dataset now, without waiting."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SET lock_timeout = '100ms'"))
            conn.execute(
                text("SELECT id FROM datasets WHERE id = :id FOR UPDATE"), {"id": dataset_id}
            )
            conn.rollback()
        return True
    except OperationalError:
        return False
    finally:
        engine.dispose()


class _Probing(io.BytesIO):
    """A file that records, when it is first read, whether the dataset was free."""

    def __init__(self, data: bytes, probe: Callable[[], bool]) -> None:
        super().__init__(data)
        self.probe = probe
        self.free: list[bool] = []

    def _check(self) -> None:
        if not self.free:
            self.free.append(self.probe())

    def read(self, size: int | None = -1, /) -> bytes:
        self._check()
        return super().read(size)

    def readinto(self, buffer: Any, /) -> int:
        self._check()
        return super().readinto(buffer)

    def seek(self, offset: int, whence: int = 0, /) -> int:
        self._check()
        return super().seek(offset, whence)


def _labels(db: Database, settings: Settings, dataset_id: str, source: io.BytesIO) -> None:
    with transaction(db.writer) as session:
        labels.service.upload(session, settings, ADMIN, dataset_id, source, "parquet",
                              unlocked=db.reader)  # fmt: skip


def _plan(db: Database, settings: Settings, dataset_id: str, source: io.BytesIO) -> None:
    with transaction(db.writer) as session:
        partitions.service.register(session, settings, ADMIN, dataset_id, source, "parquet",
                                    unlocked=db.reader)  # fmt: skip


def _priors(db: Database, settings: Settings, dataset_id: str, source: io.BytesIO) -> None:
    with transaction(db.writer) as session:
        example_priors.service.upload(session, settings, ADMIN, dataset_id, source, "parquet",
                                      "groups", unlocked=db.reader)  # fmt: skip


UPLOADS = {
    "labels": (_labels, {"label": [0, 1, 2, 1]}),
    "partition plan": (_plan, {"part": ["a", "a", "b", "b"]}),
    "example priors": (_priors, {"group": ["g", "g", "h", "h"]}),
}


@pytest.mark.parametrize("kind", list(UPLOADS))
def test_an_upload_reads_its_file_with_the_dataset_unlocked(server: Server, kind: str) -> None:
    store, columns = UPLOADS[kind]
    dataset_id = create_dataset(server.client(), task="classification", domain={"num_classes": 3})
    settings = server.settings
    url = settings.resolved_database_url
    body = parquet_bytes({"example_id": ["e0", "e1", "e2", "e3"], **columns})
    source = _Probing(body, lambda: _lock_is_free(url, dataset_id))
    db = connect(url)
    try:
        store(db, settings, dataset_id, source)
    finally:
        db.dispose()
    assert source.free == [True]
    admin = server.client()
    dataset = admin.get(f"/v1/datasets/{dataset_id}").json()
    assert dataset["num_labels"] == (4 if kind == "labels" else None)
    assert admin.get(f"/v1/datasets/{dataset_id}/partitions").is_success == (
        kind == "partition plan"
    )
    assert len(admin.get(f"/v1/datasets/{dataset_id}/priors").json()) == (kind == "example priors")
