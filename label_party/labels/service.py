"""Label upload: validate the whole file, store it as Parquet, all or nothing.

Labels are frozen once a release or a LabelDP-Pro training exists (409): a
release's or a training's ledger entry is only meaningful for the labels it
randomized or trained on. (A training is charged when it is accepted, before it
runs, so a training in any status freezes them, cancelled and failed ones too.)
"""

from __future__ import annotations

import os
from signal import SIGKILL
from typing import IO

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from label_party.audit import service as audit
from label_party.auth import Principal, visible_dataset
from label_party.config import Settings
from label_party.datasets.domain import parse_domain
from label_party.db import transaction
from label_party.exceptions import InvalidLabelsError, LabelsFrozenError, RejectedUploadError
from label_party.labels.validation import FileFormat, read_table, validate
from label_party.ledger.service import lock_dataset
from label_party.models import ReplacedLabels
from label_party.releases import repository as releases_repository
from label_party.storage import delete_after_commit, in_public_order, labels_path, write_table
from label_party.trainings import repository as trainings_repository


def upload(
    session: Session,
    settings: Settings,
    principal: Principal,
    dataset_id: str,
    source: IO[bytes],
    fmt: FileFormat,
    *,
    unlocked: sessionmaker[Session],
) -> int:
    """Store the labels of ``dataset_id`` from ``source``; returns their count.

    The file is read and validated (seconds for millions of rows) after a short
    read transaction of ``unlocked`` and before ``session`` locks the dataset row —
    on SQLite the whole database's write lock, which every other write would wait
    on. Under the lock the labels must still be replaceable (409 otherwise).
    """
    with transaction(unlocked) as reader:
        dataset = visible_dataset(reader, principal, dataset_id)
        domain = parse_domain(dataset.task, dataset.label_domain)
        frozen = _frozen(reader, dataset.id)
    if frozen:  # refused (and logged) without reading the file
        _refuse_if_frozen(session, principal, lock_dataset(session, dataset_id).id)
    try:
        table, count = validate(read_table(source, fmt), domain)
        table = in_public_order(table)  # the file's order may follow its labels
    except InvalidLabelsError as exc:
        lock_dataset(session, dataset_id)
        # The log says that an upload was refused, not how many rows were bad
        # (that would be a statistic of the labels, DESIGN.md §3.1).
        audit.append(
            session,
            actor=principal.id,
            action="labels.rejected",
            dataset_id=dataset_id,
            payload={"reason": "invalid_labels", "format": fmt},
        )
        raise RejectedUploadError(exc.message, exc.detail) from None
    locked = lock_dataset(session, dataset_id)
    _refuse_if_frozen(session, principal, locked.id)
    replaced = labels_path(settings, locked) if locked.labels_sha256 is not None else None
    sha = write_table(settings, table, settings.labels_dir / locked.id)
    if replaced is not None and replaced.name != f"{sha}.parquet":
        # Replacing raw labels (a correction, a deletion request) must not leave
        # them on disk; nothing can reference them again, since labels are
        # replaced only while no release or training exists.
        dataset_id = locked.id

        def named_again(check: Session) -> bool:
            current = lock_dataset(check, dataset_id)
            return labels_path(settings, current) == replaced

        # Named in this transaction: a crash between the commit and the deletion
        # leaves the start-up sweep a record to delete it by (helper-83).
        if session.get(ReplacedLabels, (locked.id, replaced.stem)) is None:
            session.add(ReplacedLabels(dataset_id=locked.id, sha256=replaced.stem))
        if settings.test_crash_point == "labels_after_commit":
            event.listen(session, "after_commit", lambda _: os.kill(os.getpid(), SIGKILL))
        delete_after_commit(session, replaced, "replaced labels", named_again=named_again)
    locked.labels_sha256 = sha
    locked.num_labels = count
    audit.append(
        session,
        actor=principal.id,
        action="labels.uploaded",
        dataset_id=locked.id,
        # No hash of the labels: with all labels but one known, a hash would
        # confirm the last one (DESIGN.md §3.1). The count is public (§6).
        payload={"num_labels": count, "format": fmt},
    )
    return count


def _frozen(session: Session, dataset_id: str) -> bool:
    return releases_repository.exists(session, dataset_id) or trainings_repository.exists(
        session, dataset_id
    )


def _refuse_if_frozen(session: Session, principal: Principal, dataset_id: str) -> None:
    """409, logged, once a release or a training exists (call under the lock)."""
    if not _frozen(session, dataset_id):
        return
    audit.append(
        session,
        actor=principal.id,
        action="labels.refused",
        dataset_id=dataset_id,
        payload={"reason": "labels_frozen"},
    )
    raise LabelsFrozenError("labels are frozen once a release or a training exists")
