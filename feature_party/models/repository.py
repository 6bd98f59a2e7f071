"""SQL for trained models."""

from __future__ import annotations

from sqlalchemy import select
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

    def imported(self, training_id: str, sha256: str) -> Model | None:
        """The model already imported from this labels-party training's artifact."""
        rows = self.session.scalars(
            select(Model)
            .where(Model.source == "labels-party-training", Model.training_id == training_id)
            .order_by(Model.created_at)
        )
        return next((r for r in rows if (r.metrics or {}).get("sha256") == sha256), None)
