"""SQL for trained models."""

from __future__ import annotations

from sqlalchemy.orm import Session

from feature_party.errors import not_found
from feature_party.orm import Model


class ModelRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, id_: str) -> Model:
        row = self.session.get(Model, id_)
        if row is None:
            raise not_found("model", id_)
        return row
