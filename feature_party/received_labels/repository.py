"""SQL for received releases."""

from __future__ import annotations

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
