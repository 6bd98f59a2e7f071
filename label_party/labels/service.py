"""Label upload: validate the whole file, store it as Parquet, all or nothing.

Labels are frozen once a release or a LabelDP-Pro training exists (409): a
release's or a training's ledger entry is only meaningful for the labels it
randomized or trained on. (A training is charged when it is accepted, before it
runs, so a training in any status freezes them, cancelled and failed ones too.)
"""

from __future__ import annotations

from typing import IO

from sqlalchemy.orm import Session

from label_party.audit import service as audit
from label_party.auth import Principal
from label_party.config import Settings
from label_party.datasets.domain import parse_domain
from label_party.exceptions import InvalidLabelsError, LabelsFrozenError, RejectedUploadError
from label_party.labels.validation import FileFormat, read_table, validate
from label_party.ledger.service import lock_dataset
from label_party.models import Dataset
from label_party.releases import repository as releases_repository
from label_party.storage import write_table
from label_party.trainings import repository as trainings_repository


def upload(
    session: Session,
    settings: Settings,
    principal: Principal,
    dataset: Dataset,
    source: IO[bytes],
    fmt: FileFormat,
) -> int:
    dataset = lock_dataset(session, dataset.id)
    charged = releases_repository.exists(session, dataset.id)
    if charged or trainings_repository.exists(session, dataset.id):
        audit.append(
            session,
            actor=principal.id,
            action="labels.refused",
            dataset_id=dataset.id,
            payload={"reason": "labels_frozen"},
        )
        raise LabelsFrozenError("labels are frozen once a release or a training exists")
    domain = parse_domain(dataset.task, dataset.label_domain)
    try:
        table, count = validate(read_table(source, fmt), domain)
    except InvalidLabelsError as exc:
        # The log says that an upload was refused, not how many rows were bad
        # (that would be a statistic of the labels, DESIGN.md §3.1).
        audit.append(
            session,
            actor=principal.id,
            action="labels.rejected",
            dataset_id=dataset.id,
            payload={"reason": "invalid_labels", "format": fmt},
        )
        raise RejectedUploadError(exc.message, exc.detail) from None
    sha = write_table(settings, table, settings.labels_dir / dataset.id)
    dataset.labels_sha256 = sha
    dataset.num_labels = count
    audit.append(
        session,
        actor=principal.id,
        action="labels.uploaded",
        dataset_id=dataset.id,
        # No hash of the labels: with all labels but one known, a hash would
        # confirm the last one (DESIGN.md §3.1). The count is public (§6).
        payload={"num_labels": count, "format": fmt},
    )
    return count
