"""SQL for received releases."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from feature_party.errors import not_found
from feature_party.orm import ReceivedLabels


class ReceivedLabelsRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, row: ReceivedLabels) -> ReceivedLabels:
        self.session.add(row)
        self.session.flush()
        return row

    def get(self, id_: str) -> ReceivedLabels:
        row = self.session.get(ReceivedLabels, id_)
        if row is None:
            raise not_found("received labels", id_)
        return row

    def find(
        self, feature_set_id: str, labels_party_url: str, dataset_id: str, release_id: str
    ) -> ReceivedLabels | None:
        """The row recording that release for that feature set, if one does."""
        query = select(ReceivedLabels).where(
            ReceivedLabels.feature_set_id == feature_set_id,
            ReceivedLabels.labels_party_url == labels_party_url,
            ReceivedLabels.dataset_id == dataset_id,
            ReceivedLabels.release_id == release_id,
        )
        return self.session.scalars(query.order_by(ReceivedLabels.created_at).limit(1)).first()
