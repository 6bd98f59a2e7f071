"""SQL for feature sets."""

from __future__ import annotations

from sqlalchemy.orm import Session

from feature_party.errors import not_found
from feature_party.orm import FeatureSet


class FeatureSetRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, feature_set: FeatureSet) -> FeatureSet:
        self.session.add(feature_set)
        self.session.flush()
        return feature_set

    def get(self, id_: str) -> FeatureSet:
        row = self.session.get(FeatureSet, id_)
        if row is None:
            raise not_found("feature set", id_)
        return row
