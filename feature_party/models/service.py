"""Trained models: metadata, the artifact, predictions with the training
preprocessing (``training.artifact``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy.orm import Session

from feature_party.config import Settings
from feature_party.errors import InvalidInputError
from feature_party.feature_sets.ingest import read_table
from feature_party.models.repository import ModelRepository
from feature_party.models.schemas import ModelRead, Predictions
from feature_party.training.artifact import Predictor, load_artifact


def get(session: Session, model_id: str) -> ModelRead:
    row = ModelRepository(session).get(model_id)
    return ModelRead(
        id=row.id,
        job_id=row.job_id,
        task=row.task,
        loss=row.loss,
        metrics=row.metrics,
        created_at=row.created_at,
    )


def artifact_path(session: Session, settings: Settings, model_id: str) -> Path:
    return settings.data_dir / ModelRepository(session).get(model_id).path


@lru_cache(maxsize=8)
def _predictor(path: str) -> Predictor:
    return load_artifact(Path(path))


def predict_table(
    session: Session, settings: Settings, model_id: str, table: pa.Table
) -> Predictions:
    predictor = _predictor(str(artifact_path(session, settings, model_id).resolve()))
    missing = predictor.preprocessing.missing_columns(table)
    if missing:
        raise InvalidInputError(
            "the rows lack columns the model was trained on", detail={"missing_columns": missing}
        )
    try:
        predictions = predictor.predict(table)
    except (ValueError, pa.ArrowInvalid) as exc:
        raise InvalidInputError(f"cannot preprocess the rows: {exc}") from None
    if "example_id" in table.column_names:
        ids = pc.cast(table.column("example_id"), pa.string()).to_pylist()
    else:
        ids = [str(i) for i in range(table.num_rows)]
    return Predictions(example_id=ids, prediction=predictions.tolist())


def predict_file(
    session: Session, settings: Settings, model_id: str, path: Path, filename: str | None
) -> Predictions:
    ModelRepository(session).get(model_id)  # 404 before reading the file
    return predict_table(session, settings, model_id, read_table(path, filename=filename))


def predict_rows(
    session: Session, settings: Settings, model_id: str, rows: list[dict[str, object]]
) -> Predictions:
    try:
        table = pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InvalidInputError(f"rows do not form a table: {exc}") from None
    return predict_table(session, settings, model_id, table)
