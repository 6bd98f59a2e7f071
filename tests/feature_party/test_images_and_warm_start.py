"""The image CNN (labeldp-pro.txt Table 10a), class probabilities for priors, and
warm starts from an earlier model (LP-MST stages)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from feature_party.training.artifact import load_artifact
from feature_party.training.config import TrainingConfig
from feature_party.training.runner import RunSpec, execute
from shared.torch_models import ImageCNN, ImageCNNConfig, build_model, model_config_from_dict

SIDE = 16  # small images keep the tests fast; two 3×3 conv + pool blocks still fit


def _images(tmp_path: Path, n: int = 1200) -> tuple[Path, Path, np.ndarray, list[str]]:
    """Three classes: the left half brighter, the right half brighter, or neither."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=n)
    images = rng.uniform(0, 0.3, size=(n, SIDE, SIDE))
    images[labels == 0, :, : SIDE // 2] += 0.5
    images[labels == 1, :, SIDE // 2 :] += 0.5
    flat = images.reshape(n, -1)
    columns = [f"px{j:03d}" for j in range(flat.shape[1])]
    ids = [f"im-{i}" for i in range(n)]
    features = pa.table({"example_id": ids, **{c: flat[:, j] for j, c in enumerate(columns)}})
    fp, lp = tmp_path / "images.parquet", tmp_path / "labels.parquet"
    pq.write_table(features, fp)
    pq.write_table(pa.table({"example_id": ids, "label": labels.astype(np.float64)}), lp)
    return fp, lp, labels, columns


def _spec(tmp_path: Path, fp: Path, lp: Path, columns: list[str], name: str, **config: object):  # type: ignore[no-untyped-def]
    training = {"task": "classification", "loss": "cross-entropy", "architecture": "cnn",
                "image_shape": [1, SIDE, SIDE], "num_classes": 3, "epochs": 6,
                "batch_size": 64, "optimizer": "adam", "learning_rate": 1e-2,
                "validation_fraction": 0.0, **config}  # fmt: skip
    return RunSpec(
        features_path=str(fp),
        labels_path=str(lp),
        roles={"numeric": columns, "categorical": []},
        config=TrainingConfig.model_validate(training).model_dump(mode="json"),
        manifest={"mechanism": {"name": "rr", "epsilon": 2.0, "outputs": [0, 1, 2]}},
        checkpoint_path=str(tmp_path / f"{name}.ckpt"),
        artifact_path=str(tmp_path / f"{name}.pt"),
    )


def test_the_paper_cnn_shape() -> None:
    model = ImageCNN(ImageCNNConfig())  # 28×28 → conv 26 → pool 13 → conv 11 → pool 5
    assert model.fc[0].in_features == 16 * 5 * 5
    assert model(torch.zeros(4, 784), torch.zeros(4, 0)).shape == (4, 10)
    config = model_config_from_dict(model.config.to_dict())
    assert config == model.config and isinstance(build_model(config), ImageCNN)
    with pytest.raises(ValueError, match="too small"):
        ImageCNN(ImageCNNConfig(height=5, width=5))


def test_cnn_learns_and_its_artifact_predicts_probabilities(tmp_path: Path) -> None:
    fp, lp, labels, columns = _images(tmp_path)
    spec = _spec(tmp_path, fp, lp, columns, "cnn")
    execute(spec)
    predictor = load_artifact(Path(spec.artifact_path))
    table = pq.read_table(fp)
    assert (predictor.predict(table) == labels).mean() > 0.9  # chance: 1/3
    probs = predictor.probabilities(table)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)
    assert (probs.argmax(axis=1) == predictor.predict(table)).all()
    hot = predictor.probabilities(table, temperature=5.0)
    assert hot.max(axis=1).mean() < probs.max(axis=1).mean()  # a temperature flattens
    with pytest.raises(ValueError, match="temperature"):
        predictor.probabilities(table, temperature=0.0)


def test_cnn_refuses_features_that_are_not_its_image(tmp_path: Path) -> None:
    fp, lp, _, columns = _images(tmp_path, n=100)
    spec = _spec(tmp_path, fp, lp, columns[:-1], "bad")
    with pytest.raises(ValueError, match="numeric pixel columns"):
        execute(spec)


def test_a_warm_start_begins_from_the_earlier_model(tmp_path: Path) -> None:
    fp, lp, labels, columns = _images(tmp_path)
    first = _spec(tmp_path, fp, lp, columns, "first", epochs=2)
    execute(first)
    # One epoch at a tiny learning rate barely moves the weights: the second model
    # predicts like the first (a fresh model at that rate would stay at chance).
    second = dataclasses.replace(
        _spec(tmp_path, fp, lp, columns, "second", epochs=1, learning_rate=1e-7, seed=9),
        init_artifact_path=first.artifact_path,
    )
    execute(second)
    table = pq.read_table(fp)
    before = load_artifact(Path(first.artifact_path)).predict(table)
    after = load_artifact(Path(second.artifact_path)).predict(table)
    assert (before == labels).mean() > 0.6  # chance: 1/3
    assert (after == before).mean() > 0.99


def test_a_warm_start_from_another_architecture_is_refused(tmp_path: Path) -> None:
    fp, lp, _, columns = _images(tmp_path, n=200)
    first = _spec(tmp_path, fp, lp, columns, "first", epochs=1)
    execute(first)
    mlp = dataclasses.replace(
        _spec(tmp_path, fp, lp, columns, "mlp", epochs=1, architecture="mlp"),
        init_artifact_path=first.artifact_path,
    )
    with pytest.raises(ValueError, match="does not fit"):
        execute(mlp)
