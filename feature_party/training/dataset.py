"""From a stored feature set and a received release to training tensors.

The join is a pyarrow hash join on ``example_id``; the validation split is a
seeded permutation of the joined rows. Validation uses noisy labels only — the
features party never sees true labels (DESIGN.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from feature_party.training.config import TrainingConfig
from feature_party.training.data import (
    TARGET,
    ColumnRoles,
    Preprocessing,
    Tensors,
    fit_preprocessing,
)
from feature_party.training.losses import Loss, debiasing_problem, make_loss

__all__ = ["TrainingData", "join_features_labels", "load_training_data"]


@dataclass
class TrainingData:
    train: Tensors
    train_targets: torch.Tensor
    validation: Tensors
    validation_targets: torch.Tensor
    preprocessing: Preprocessing
    loss: Loss
    num_classes: int | None


def join_features_labels(features: pa.Table, labels: pa.Table) -> pa.Table:
    """Inner join on ``example_id`` (both sides string); the label as :data:`TARGET`."""
    if TARGET in features.column_names:
        raise ValueError(f"a feature column may not be named {TARGET!r}")
    labels = labels.select(["example_id", "label"]).cast(
        pa.schema([("example_id", pa.string()), ("label", pa.float64())])
    )
    labels = labels.rename_columns(["example_id", TARGET])
    joined = features.join(labels, keys="example_id", join_type="inner", use_threads=True)
    # Hash joins do not keep order; sort so a seed gives the same split everywhere.
    return joined.sort_by("example_id")


def release_classes(manifest: dict[str, Any]) -> list[Any]:
    """The classes a release's labels take: its mechanism's outputs, else its inputs
    (empty when the release does not say)."""
    mechanism = manifest.get("mechanism", {})
    return list(mechanism.get("outputs") or mechanism.get("inputs") or [])


def load_training_data(
    *,
    features_path: Path,
    labels_path: Path,
    roles: ColumnRoles,
    config: TrainingConfig,
    manifest: dict[str, Any],
    preprocessing: Preprocessing | None = None,
) -> TrainingData:
    """Join, split, fit preprocessing on the training rows (or reuse
    ``preprocessing``, an earlier model's, so its weights still fit) and build the
    loss. Raises ``ValueError`` with a user-facing message on unusable data."""
    columns = ["example_id", *roles.numeric, *roles.categorical]
    features = pq.read_table(features_path, columns=columns)
    joined = join_features_labels(
        features, pq.read_table(labels_path, columns=["example_id", "label"])
    )
    n = joined.num_rows
    if n == 0:
        raise ValueError("no example of the feature set has a received label")
    targets = np.asarray(joined.column(TARGET).to_numpy(), dtype=np.float64)
    if not np.isfinite(targets).all():
        raise ValueError("the release holds non-finite labels")

    mechanism = manifest.get("mechanism", {})
    num_classes: int | None = None
    if config.task == "classification":
        num_classes = config.num_classes or len(release_classes(manifest))
        if num_classes < 2:
            raise ValueError("classification needs num_classes (the release does not say)")
        if not (np.all(targets == np.round(targets)) and targets.min() >= 0) or (
            targets.max() >= num_classes
        ):
            raise ValueError(f"classification labels must be class indices 0..{num_classes - 1}")
    elif config.loss == "poisson" and targets.min() < 0:
        raise ValueError("Poisson regression needs non-negative labels")
    if config.loss == "rr-debiased-cross-entropy" and (problem := debiasing_problem(mechanism)):
        raise ValueError(problem)
    loss = make_loss(
        config.loss,
        num_classes=num_classes,
        matrix=mechanism.get("matrix"),
        epsilon=float(mechanism.get("epsilon") or manifest.get("epsilon") or 0) or None,
    )

    order = np.random.default_rng(config.seed).permutation(n)
    n_val = round(n * config.validation_fraction)
    if n - n_val < 1:
        raise ValueError("too few joined examples to train")
    val_idx, train_idx = np.sort(order[:n_val]), np.sort(order[n_val:])
    train_table = joined.take(pa.array(train_idx))
    val_table = joined.take(pa.array(val_idx))
    if preprocessing is None:
        preprocessing = fit_preprocessing(
            train_table, roles, max_vocab=config.max_vocab, min_count=config.min_count
        )
    elif preprocessing.roles != roles:
        raise ValueError("init_model_id: the model was trained on other feature columns")
    return TrainingData(
        train=preprocessing.transform(train_table),
        train_targets=torch.from_numpy(targets[train_idx].astype(np.float32)),
        validation=preprocessing.transform(val_table),
        validation_targets=torch.from_numpy(targets[val_idx].astype(np.float32)),
        preprocessing=preprocessing,
        loss=loss,
        num_classes=num_classes,
    )


def count_join(features_path: Path, labels: pa.Table) -> tuple[int, int]:
    """``(matched, unmatched)``: received labels with / without a feature row."""
    ids = pq.read_table(features_path, columns=["example_id"]).column("example_id")
    label_ids = pc.cast(labels.column("example_id"), pa.string())
    matched = int(pc.sum(pc.is_in(label_ids, value_set=ids.combine_chunks())).as_py() or 0)
    return matched, labels.num_rows - matched
