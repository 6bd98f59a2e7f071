"""Trained models: metadata, the artifact, predictions with the training
preprocessing (``training.artifact``)."""

from __future__ import annotations

import json
import pickle
import re
import struct
import uuid
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import select
from sqlalchemy.orm import Session

from feature_party.client import ReleaseIntegrityError
from feature_party.config import Settings
from feature_party.db import end_reads, lock_name
from feature_party.errors import ConflictError, InvalidInputError, UpstreamError
from feature_party.feature_sets.ingest import ID, FeatureFile
from feature_party.models.repository import ModelRepository
from feature_party.models.schemas import ModelImport, ModelRead
from feature_party.orm import Model
from feature_party.received_labels.service import UPSTREAM_ERRORS, make_client, upstream_error
from feature_party.training.artifact import NonFinitePredictionError, Predictor, load_artifact
from shared.columns import ColumnTypeError, as_keys
from shared.pagination import Pager
from shared.protocol import SHA256_PATTERN


def get(session: Session, model_id: str) -> ModelRead:
    row = ModelRepository(session).get(model_id)
    return to_read(row)


def list_page(session: Session, pager: Pager) -> list[ModelRead]:
    return [to_read(row) for row in pager.rows(session, select(Model), Model)]


def to_read(row: Model) -> ModelRead:
    return ModelRead(
        id=row.id,
        job_id=row.job_id,
        source=row.source,
        training_id=row.training_id,
        task=row.task,
        loss=row.loss,
        metrics=row.metrics,
        created_at=row.created_at,
    )


def import_training(
    session: Session, settings: Settings, body: ModelImport
) -> tuple[ModelRead, bool]:
    """Download a labels-party LabelDP-Pro model, check its SHA-256 and that it
    loads, and register it: it then predicts like a model trained here. The model
    is the labels party's release; everything done with it here is
    post-processing and costs no budget. Importing the same artifact again
    returns the model registered the first time (and ``False``: nothing new)."""
    client = make_client(settings, body.labels_party_url, body.token.get_secret_value())
    with client:
        try:
            training = client.get_training(body.training_id)
            status = training.get("status")
            if status != "succeeded" or not training.get("sha256"):
                ended = status in ("failed", "cancelled")
                raise ConflictError(
                    f"training {body.training_id} has no model: it ended {status}"
                    if ended
                    else f"training {body.training_id} has no model yet (it is {status})",
                    code="training_not_ready",
                    detail={"status": status},
                )
            sha = str(training["sha256"]).lower()
            if not re.fullmatch(SHA256_PATTERN, sha):  # it names a file: checked first
                raise ReleaseIntegrityError(
                    f"training {body.training_id}: its sha256 is not 64 hex digits"
                )
            known = ModelRepository(session).imported(str(training["id"]), training["sha256"])
            if known is not None:
                return to_read(known), False
            end_reads(session)
            relative = Path("models") / "imported" / f"{sha}.pt"
            client.download_model(  # bounded like an upload: it is another party's file
                body.training_id,
                settings.data_dir / relative,
                expected_sha256=sha,
                max_bytes=settings.max_upload_bytes,
            )
        except UPSTREAM_ERRORS as exc:
            error = upstream_error(exc)
            extra = error.detail if isinstance(error.detail, dict) else {}
            error.detail = {"training_id": body.training_id, **extra}
            raise error from None
    predictor = _loaded_import(settings, relative, training)
    # Two imports of one training both found none above: the second to get here
    # returns the first's model (the same bytes at the same path) instead of a twin.
    # Locked only now, after the download and the load: the lock holds SQLite's
    # write lock (every worker's heartbeat) or, on Postgres, a pooled connection.
    lock_name(session, f"import-training-{training['id']}")
    known = ModelRepository(session).imported(str(training["id"]), training["sha256"])
    if known is not None:
        return to_read(known), False
    return _register(session, relative, training, predictor), True


#: What loading bytes that are not a model raises (torch's zip reader, pickle, our
#: artifact's keys); anything else (memory, file handles) is this service's failure.
MODEL_FORMAT_ERRORS = (
    pickle.UnpicklingError,
    struct.error,  # torch's legacy reader on bytes too short to hold its header
    EOFError,
    zipfile.BadZipFile,
    RuntimeError,
    ValueError,
    KeyError,
    TypeError,
    AttributeError,
)


def _loaded_import(settings: Settings, relative: Path, training: dict[str, Any]) -> Predictor:
    """The downloaded model, loaded; 502 ``invalid_model`` if its bytes are no model."""
    path = settings.data_dir / relative
    try:
        return _predictor(str(path.resolve()))
    except MODEL_FORMAT_ERRORS as exc:  # the hash-checked bytes are no model: theirs
        path.unlink(missing_ok=True)  # not kept where a later import would find it
        raise UpstreamError(
            f"the labels party's model does not load ({type(exc).__name__}: {exc})",
            code="invalid_model",
            detail={"training_id": training["id"]},
        ) from None


def _register(
    session: Session, relative: Path, training: dict[str, Any], predictor: Predictor
) -> ModelRead:
    metrics = {
        "labels_party_training_id": training["id"],
        "dataset_id": training.get("dataset_id"),
        "epsilon": training.get("epsilon"),
        "delta": training.get("delta"),
        "accounting": training.get("accounting"),
        "sha256": training["sha256"],
    }
    row = Model(
        id=uuid.uuid4().hex,
        job_id=None,
        source="labels-party-training",
        training_id=str(training["id"]),
        path=str(relative),
        task=predictor.task,
        loss="cross-entropy",
        metrics=metrics,
    )
    session.add(row)
    session.flush()
    return to_read(row)


def artifact_path(session: Session, settings: Settings, model_id: str) -> Path:
    return settings.data_dir / ModelRepository(session).get(model_id).path


@lru_cache(maxsize=8)
def _predictor(path: str) -> Predictor:
    return load_artifact(Path(path))


def _loaded(session: Session, settings: Settings, model_id: str) -> Predictor:
    """The model's predictor (404 for an unknown model), cached by artifact path.
    The session's connection goes back first: a prediction held it while it read
    and predicted the whole file, and 75 of them took the pool (helper-72)."""
    path = artifact_path(session, settings, model_id)
    end_reads(session)
    return _predictor(str(path.resolve()))


#: Rows an error names at most.
_ROWS_NAMED = 20


@dataclass(frozen=True)
class PredictionAnswer:
    """A prediction's answer, held as arrays until it is sent.

    Its JSON (:class:`~feature_party.models.schemas.Predictions`) is written in
    batches: built whole as Python lists (with the file read whole), the answer for
    3,000,000 rows of a narrow CSV took 45× the file's size at its peak, 5.7× now
    (``python -m bench.bench_predict_memory``)."""

    #: The rows' ``example_id``; None numbers them from 0.
    example_id: pa.Array | pa.ChunkedArray | None
    prediction: np.ndarray

    def json_chunks(self, batch: int = 65_536) -> Iterator[bytes]:
        """The answer's JSON, byte for byte what ``JSONResponse`` writes of it."""
        n = self.prediction.size
        yield b'{"example_id":['
        for start in range(0, n, batch):
            yield (b"," if start else b"") + _json_items(self._ids(start, batch))
        yield b'],"prediction":['
        for start in range(0, n, batch):
            values = self.prediction[start : start + batch].astype(np.float64).tolist()
            yield (b"," if start else b"") + _json_items(values)
        yield b"]}"

    def _ids(self, start: int, batch: int) -> list[str]:
        if self.example_id is None:
            return [str(i) for i in range(start, min(start + batch, self.prediction.size))]
        ids: list[str] = self.example_id.slice(start, batch).to_pylist()
        return ids


def _json_items(values: list[Any]) -> bytes:
    """A JSON array's items, without its brackets."""
    text = json.dumps(values, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text[1:-1].encode("utf-8")


def _predict(
    predictor: Predictor, names: list[str], batches: Iterable[pa.Table]
) -> PredictionAnswer:
    """Predict for rows whose columns are ``names``, a batch at a time; every row is
    checked before anything is answered."""
    # Counted once: column_names builds a new list on each call (5,000 columns took 13 s).
    repeated = sorted(name for name, n in Counter(names).items() if n > 1)
    if repeated:
        raise InvalidInputError(
            "the rows name a column more than once", detail={"repeated_columns": repeated}
        )
    missing = predictor.preprocessing.missing_columns(names)
    if missing:
        raise InvalidInputError(
            "the rows lack columns the model was trained on", detail={"missing_columns": missing}
        )
    with_ids = ID in names
    if not with_ids:
        _refuse_numbering_beside_an_id(predictor, names)
    predictions: list[np.ndarray] = []
    ids: list[pa.Array | pa.ChunkedArray] = []
    not_finite: list[np.ndarray] = []
    rows = without_id = 0
    for table in batches:
        try:
            predictions.append(predictor.predict(table, first_row=rows + 1))
        except NonFinitePredictionError as exc:  # every such row is counted
            not_finite.append(exc.rows + rows)
        except (ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidInputError(f"cannot preprocess the rows: {exc}") from None
        if with_ids:
            ids.append(_ids(table))
            # An empty id is as missing as a null one (an upload refuses both).
            without_id += ids[-1].null_count + (pc.sum(pc.equal(ids[-1], "")).as_py() or 0)
        rows += table.num_rows
    if not_finite:
        raise _not_finite(np.concatenate(not_finite), rows)
    if without_id:
        raise InvalidInputError(
            "example_id is missing in some rows: give it in every row or in none",
            detail={"rows_without_example_id": without_id},
        )
    prediction = np.concatenate(predictions) if predictions else np.zeros(0)
    return PredictionAnswer(pa.chunked_array(ids, pa.string()) if with_ids else None, prediction)


def _refuse_numbering_beside_an_id(predictor: Predictor, names: list[str]) -> None:
    """Rows without ``example_id`` are numbered from 0; a column the model does not
    read that is named like an id (``id``, ``user_id``, ``example_id `` with a
    space) is refused instead: a file of ``id,f,g`` was answered with ids ``"0"``,
    ``"1"``, … that read as its own (helper-78)."""
    used = {*predictor.preprocessing.numeric, *predictor.preprocessing.categorical}
    like_ids = [name for name in names if name not in used and _named_like_an_id(name)]
    if like_ids:
        raise InvalidInputError(
            f"the rows have no {ID} column, and {like_ids[0]!r} looks like one: name the "
            f"id column {ID}, or leave it out to have the rows numbered from 0",
            detail={"id_like_columns": like_ids[:_ROWS_NAMED]},
        )


def _named_like_an_id(name: str) -> bool:
    words = [w.lower() for w in re.split(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])", name.strip()) if w]
    return bool(words) and words[-1] in ("id", "ids", "key")


def _ids(table: pa.Table) -> pa.Array | pa.ChunkedArray:
    try:
        return as_keys(table.column(ID), ID)
    except ColumnTypeError as exc:
        raise InvalidInputError(str(exc)) from None


def _not_finite(rows: np.ndarray, num_rows: int) -> InvalidInputError:
    return InvalidInputError(
        f"the model's prediction is not a finite number for {rows.size} of "
        f"{num_rows} rows: their features lie far outside the range it was "
        f"trained on (detail.rows names the first {_ROWS_NAMED}, counting from 1)",
        detail={"rows": (rows[:_ROWS_NAMED] + 1).tolist(), "num_rows": int(rows.size)},
    )


def predict_file(
    session: Session, settings: Settings, model_id: str, path: Path, filename: str | None
) -> PredictionAnswer:
    predictor = _loaded(session, settings, model_id)  # 404 before reading the file
    return predict_path(predictor, path, filename)


def predict_path(predictor: Predictor, path: Path, filename: str | None) -> PredictionAnswer:
    """Predict for a CSV or Parquet file, reading only its id and feature columns,
    a batch at a time."""
    file = FeatureFile.open(path, filename)
    prep = predictor.preprocessing
    columns = [*prep.numeric, *prep.categorical, *([ID] if ID in file.names else [])]
    # A CSV's categorical columns are text, as at upload: 01234 stays 01234.
    return _predict(predictor, file.names, file.batches(columns, numeric=prep.numeric))


def predict_rows(
    session: Session, settings: Settings, model_id: str, rows: list[dict[str, object]]
) -> PredictionAnswer:
    table = _rows_table(rows)
    return _predict(_loaded(session, settings, model_id), table.column_names, [table])


def _rows_table(rows: list[dict[str, object]]) -> pa.Table:
    """JSON rows as a table. A column whose values mix JSON types (``1`` and ``"a"``)
    is kept as text, so the preprocessing names it and its row instead of Arrow
    refusing the whole body with a message that quotes the value."""
    names = list(dict.fromkeys(name for row in rows for name in row))
    _refuse_ragged(rows, names)
    columns: dict[str, pa.Array] = {}
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # 10**400 overflows int64
            text = [_as_text(v, name, i) for i, v in enumerate(values, start=1)]
            columns[name] = pa.array(text, pa.string())
    return pa.table(columns)


def _refuse_ragged(rows: list[dict[str, object]], names: list[str]) -> None:
    """Every row names every column, as every row of a file has each: a key left
    out of a row, or misspelt in it (``"G"`` for ``"g"``), was read as null, the
    training mean, and answered without a word (helper-78). ``null`` is that."""
    for number, row in enumerate(rows, start=1):
        if len(row) != len(names):
            # example_id given in some rows only is refused below, counting them.
            lacking = [name for name in names if name not in row and name != ID]
            if not lacking:
                continue
            raise InvalidInputError(
                f"row {number} lacks {', '.join(map(repr, lacking[:5]))}, which other rows "
                "give: give every column in every row (null for a missing value)",
                detail={"row": number, "missing_columns": lacking[:_ROWS_NAMED]},
            )


def _as_text(value: object, name: str, row: int) -> str | None:
    """A JSON scalar as the text a column of its own type casts it to (``1.0`` is
    ``"1"``, ``true`` is ``"true"``): the category a value names must not depend on
    the other rows' types (``json.dumps`` made ``1.0`` ``"1.0"`` beside a string)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list | dict):  # as a column of them alone is refused
        raise InvalidInputError(f"column {name!r} holds a list or an object (row {row})")
    try:
        text: str = pa.array([value]).cast(pa.string())[0].as_py()
    except (pa.ArrowInvalid, OverflowError):  # an integer past int64: its digits
        return str(value)
    return text
