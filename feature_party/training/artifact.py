"""The model artifact: weights plus everything prediction needs to preprocess
rows exactly as training did (column roles, vocabularies, scalers, loss).

The format (``labeldp-model/1``, ``torch.load(..., weights_only=True)``, no
pickled code) is ``shared.artifact``'s, so models the labels party trains
(LabelDP-Pro) load here the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from feature_party.training.config import TrainingConfig
from feature_party.training.data import ColumnRoles, Preprocessing
from feature_party.training.loop import model_config
from feature_party.training.losses import Loss, LossName, make_loss
from shared.artifact import ARTIFACT_FORMAT, model_artifact, save_artifact_file
from shared.torch_models import (
    ImageCNN,
    ModelConfig,
    TabularMLP,
    build_model,
    model_config_from_dict,
)

__all__ = [
    "ARTIFACT_FORMAT",
    "NonFinitePredictionError",
    "Predictor",
    "load_artifact",
    "save_artifact",
]

#: Formats this version still reads (the first one held only tabular MLPs).
_READABLE = frozenset({ARTIFACT_FORMAT, "labeldp-tabular-mlp/1"})


def save_artifact(
    path: Path,
    *,
    model: TabularMLP | ImageCNN,
    preprocessing: Preprocessing,
    config: TrainingConfig,
    num_classes: int | None,
    metrics: dict[str, Any],
) -> None:
    """Write the artifact (``shared.artifact``, the format both parties write)."""
    artifact = model_artifact(
        model=model,
        model_config=model.config.to_dict(),
        preprocessing=preprocessing.to_dict(),
        task=config.task,
        loss=config.loss,
        num_classes=num_classes,
        training=config.model_dump(mode="json"),
        metrics=metrics,
    )
    save_artifact_file(path, artifact)


class NonFinitePredictionError(ValueError):
    """The model's output is not a finite number for some rows (0-based ``rows``):
    their features lie far outside what it was trained on, and a prediction there
    would be null or, for a class, arbitrary."""

    def __init__(self, rows: np.ndarray) -> None:
        super().__init__(f"the model's output is not a finite number for {rows.size} rows")
        self.rows = rows


#: Rows a model runs on at once. Tabular rows at 65,536 ran 4.4× slower (the
#: layers' activations fell out of cache) and left glibc's heap 3× larger.
PREDICT_BATCH = 8192


@dataclass
class Predictor:
    model: TabularMLP | ImageCNN
    preprocessing: Preprocessing
    loss: Loss
    task: str

    def predict(
        self, table: pa.Table, batch_size: int = PREDICT_BATCH, first_row: int = 1
    ) -> np.ndarray:
        """Predictions for the rows of ``table`` (``ValueError`` on missing columns,
        :class:`NonFinitePredictionError` where the model's output is not finite;
        ``first_row`` numbers the rows an error names)."""
        tensors = self.preprocessing.transform(table, first_row)
        out, finite = [], []
        with torch.no_grad():
            for start in range(0, len(tensors), batch_size):
                sl = slice(start, start + batch_size)
                raw = self.model(tensors.numeric[sl], tensors.categorical[sl])
                predicted = self.loss.predict(raw)
                # A class index from NaN logits is arbitrary, not merely null: check raw too.
                ok = torch.isfinite(raw).all(dim=1) & torch.isfinite(predicted.double())
                out.append(predicted.cpu().numpy())
                finite.append(ok.cpu().numpy())
        bad = np.flatnonzero(~np.concatenate(finite)) if finite else np.zeros(0, np.int64)
        if bad.size:
            raise NonFinitePredictionError(bad)
        dtype = np.int64 if self.loss.classification else np.float64
        return np.concatenate(out).astype(dtype) if out else np.zeros(0, dtype=dtype)

    def probabilities(
        self, table: pa.Table, *, temperature: float = 1.0, batch_size: int = PREDICT_BATCH
    ) -> np.ndarray:
        """Class probabilities ``softmax(logits / temperature)``, float64 ``[n, K]``
        (classification models only). A temperature above 1 flattens the model's
        over-confident outputs before they serve as priors (``rr-with-prior-lp-mst.txt``
        supplement B)."""
        if not self.loss.classification:
            raise ValueError("class probabilities need a classification model")
        if not temperature > 0:
            raise ValueError("temperature must be positive")
        tensors = self.preprocessing.transform(table)
        out = [np.zeros((0, self.loss.outputs))]
        with torch.no_grad():
            for start in range(0, len(tensors), batch_size):
                sl = slice(start, start + batch_size)
                raw = self.model(tensors.numeric[sl], tensors.categorical[sl]).double()
                out.append(torch.softmax(raw / temperature, dim=1).numpy())
        return np.concatenate(out)


def load_artifact(path: Path) -> Predictor:
    """The artifact at ``path`` as a :class:`Predictor`; ``ValueError`` (or torch's
    own errors) for one that is not a model this service can run.

    An imported artifact is another party's file: its architecture is built on the
    meta device first and must match its weights' shapes (a 1.5 kB artifact
    declaring ``hidden: [20000, 20000]`` allocated 1.8 GB before being refused),
    and one zero row must go through it to one output per class or value (a model
    wider than its preprocessing answered every prediction with a 500)."""
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if blob.get("format") not in _READABLE:
        raise ValueError(f"unknown model artifact format {blob.get('format')!r}")
    config = model_config_from_dict(blob["model"])
    _check_shapes(config, blob["state_dict"])
    model = build_model(config)
    model.load_state_dict(blob["state_dict"])
    model.eval()
    num_classes = blob["num_classes"]
    # The debiased loss predicts like plain cross-entropy; no matrix needed here.
    loss_name: LossName = "cross-entropy" if num_classes else blob["loss"]
    predictor = Predictor(
        model=model,
        preprocessing=Preprocessing.from_dict(blob["preprocessing"]),
        loss=make_loss(loss_name, num_classes=num_classes),
        task=blob["task"],
    )
    _probe(predictor)
    return predictor


def _check_shapes(config: ModelConfig, state_dict: dict[str, torch.Tensor]) -> None:
    with torch.device("meta"):
        declared = {k: tuple(v.shape) for k, v in build_model(config).state_dict().items()}
    held = {k: tuple(v.shape) for k, v in state_dict.items()}
    if declared != held:
        raise ValueError("the model's architecture does not match its weights")


def _probe(predictor: Predictor) -> None:
    """One zero row through the model: its inputs and outputs must fit."""
    prep = predictor.preprocessing
    numeric = torch.zeros(1, len(prep.numeric))
    categorical = torch.zeros(1, len(prep.categorical), dtype=torch.int64)
    with torch.no_grad():
        out = predictor.model(numeric, categorical)
    if tuple(out.shape) != (1, predictor.loss.outputs):
        raise ValueError(
            f"the model gives {tuple(out.shape)[1:]} outputs a row, "
            f"its loss needs {predictor.loss.outputs}"
        )


def init_model_problem(
    path: Path, config: TrainingConfig, roles: ColumnRoles, outputs: int
) -> tuple[str, dict[str, Any]] | None:
    """Why the model at ``path`` cannot start a job of ``config`` on feature columns
    ``roles`` with ``outputs`` outputs, and what differs; None if it can. The
    worker's ``load_state_dict`` finds the same, but only once the job is queued."""
    try:
        # mmap: the check reads the header, not a possibly large set of weights.
        blob = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        trained = Preprocessing.from_dict(blob["preprocessing"])
        have = model_config_from_dict(blob["model"]).to_dict()
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        return f"its artifact cannot be read: {type(exc).__name__}", {}
    if trained.roles != roles:
        detail = {"model_columns": trained.roles.to_dict(), "feature_set_columns": roles.to_dict()}
        return "it was trained on other feature columns than this feature set's", detail
    want = model_config(trained, config, outputs).to_dict()
    differ = {
        key: {"model": have.get(key), "job": want.get(key)}
        for key in sorted((set(have) | set(want)) - {"dropout"})
        if have.get(key) != want.get(key)
    }
    if differ:
        return f"its shape differs from this job's in {', '.join(differ)}", differ
    return None
