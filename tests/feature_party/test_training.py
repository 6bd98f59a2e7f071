"""Preprocessing, losses, the loop, checkpoints and the artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from feature_party.training.artifact import load_artifact
from feature_party.training.config import TrainingConfig
from feature_party.training.data import ColumnRoles, fit_preprocessing
from feature_party.training.dataset import load_training_data
from feature_party.training.loop import Interrupted, Progress, auto_embedding_updates, train
from feature_party.training.losses import RRDebiasedCrossEntropyLoss, make_loss, rr_matrix
from feature_party.training.runner import RunSpec, execute
from tests.feature_party.conftest import synthetic

ROLES = ColumnRoles(("x0", "x1", "x2", "x3"), ("city", "device"))


def test_preprocessing_vocabulary_oov_and_scaling() -> None:
    table = pa.table({"n": [1.0, 3.0, None, 5.0], "c": ["a", "b", "a", None]})
    pre = fit_preprocessing(table, ColumnRoles(("n",), ("c",)), max_vocab=1)
    assert pre.vocabularies == [["a"]]  # most frequent only; b and null go to OOV
    t = pre.transform(pa.table({"n": [3.0, None], "c": ["a", "zzz"]}))
    assert t.categorical.tolist() == [[1], [0]]
    assert t.numeric[:, 0].tolist() == [0.0, 0.0]  # the mean, and a missing value
    with pytest.raises(ValueError, match="missing feature columns"):
        pre.transform(pa.table({"n": [1.0]}))


def test_values_near_the_float_range_are_scaled_not_lost() -> None:
    """A column of ±1.7e308 summed to inf: means and stds inf, every value scaled
    to 0, and a model that answered one constant (helper-71)."""
    big = [1.7e308, -1.7e308, 1.7e308, 0.85e308]
    pre = fit_preprocessing(pa.table({"x": big}), ColumnRoles(("x",), ()))
    assert np.isfinite(pre.means + pre.stds).all()
    assert pre.means[0] == pytest.approx(np.mean(np.array(big) / 1e308) * 1e308)
    scaled = pre.transform(pa.table({"x": big})).numeric[:, 0]
    expected = (np.array(big) / 1e308 - pre.means[0] / 1e308) / (pre.stds[0] / 1e308)
    np.testing.assert_allclose(scaled, expected, rtol=1e-6)
    assert len(set(scaled.tolist())) == 3


def _linear_predictor(loss: str, weights: list[list[float]]) -> Any:
    """A Predictor whose model is ``x @ weights.T`` over numeric columns x0, x1
    (means 0, stds 1), so that its outputs on extreme rows are known."""
    from feature_party.training.artifact import Predictor
    from feature_party.training.data import Preprocessing
    from shared.torch_models import TabularMLP, TabularMLPConfig

    w = torch.tensor(weights)
    model = TabularMLP(TabularMLPConfig(num_numeric=2, hidden=(), outputs=w.shape[0]))
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(layers) == 1
    with torch.no_grad():
        layers[0].weight.copy_(w)
        layers[0].bias.zero_()
    pre = Preprocessing(numeric=["x0", "x1"], means=[0.0, 0.0], stds=[1.0, 1.0],
                        categorical=[], vocabularies=[])  # fmt: skip
    k = w.shape[0] if w.shape[0] > 1 else None
    task = "classification" if k else "regression"
    return Predictor(model.eval(), pre, make_loss(loss, num_classes=k), task)  # type: ignore[arg-type]


def test_a_prediction_that_is_not_finite_is_refused_with_its_rows() -> None:
    """Features past float32's range made the model's output NaN: a null prediction
    for regression and an arbitrary class (argmax of NaN) for classification."""
    from feature_party.errors import InvalidInputError
    from feature_party.models.service import _predict
    from feature_party.training.artifact import NonFinitePredictionError

    rows = pa.table({"x0": [1.0, 1e40, -1e40, 2.0], "x1": [1.0, 0.0, 1e40, 1e300]})
    bounded = _linear_predictor("squared", [[1e-30, 0.0]])
    assert np.isfinite(bounded.predict(rows)).all()  # clipped into float32, not ±inf
    overflowing = _linear_predictor("squared", [[10.0, 0.0]])
    with pytest.raises(NonFinitePredictionError) as e:
        overflowing.predict(rows)
    assert e.value.rows.tolist() == [1, 2]
    cancelling = _linear_predictor("cross-entropy", [[10.0, -10.0], [0.0, 0.0], [0.0, 1.0]])
    with pytest.raises(NonFinitePredictionError) as e:  # ∞ − ∞: a NaN logit in row 0
        cancelling.predict(pa.table({"x0": [1e40, 1.0], "x1": [1e40, 1.0]}))
    assert e.value.rows.tolist() == [0]
    with pytest.raises(InvalidInputError) as refused:
        with_ids = rows.append_column("example_id", pa.array(list("abcd")))
        _predict(overflowing, with_ids.column_names, [with_ids])
    assert refused.value.detail == {"rows": [2, 3], "num_rows": 2}
    assert "2 of 4 rows" in refused.value.message


def test_debiased_cross_entropy_is_unbiased() -> None:
    """E over RR noise of the debiased loss equals the clean loss (Appendix D.1)."""
    k, eps = 4, 1.0
    t = rr_matrix(k, eps)
    loss = make_loss("rr-debiased-cross-entropy", num_classes=k, matrix=t.tolist())
    raw = torch.randn(5, k)
    clean = make_loss("cross-entropy", num_classes=k)
    for y in range(k):
        expected = sum(
            float(t[y, o]) * loss.per_example(raw, torch.full((5,), float(o))) for o in range(k)
        )
        torch.testing.assert_close(expected, clean.per_example(raw, torch.full((5,), float(y))))
    # Same as the paper's closed form for RR.
    p = k / (np.exp(eps) + k - 1)
    all_l = torch.stack([clean.per_example(raw, torch.full((5,), float(c))) for c in range(k)], 1)
    closed = (all_l[:, 2] - p / k * all_l.sum(1)) / (1 - p)
    torch.testing.assert_close(loss.per_example(raw, torch.full((5,), 2.0)), closed)
    # Without a square matrix (an rr release's manifest carries none), ε gives RR in
    # closed form: the same losses, and no K×K matrix at 10⁵ classes.
    by_eps = make_loss("rr-debiased-cross-entropy", num_classes=k, epsilon=eps)
    assert isinstance(by_eps, RRDebiasedCrossEntropyLoss)
    for y in range(k):
        target = torch.full((5,), float(y))
        torch.testing.assert_close(by_eps.per_example(raw, target), loss.per_example(raw, target))
    many = make_loss("rr-debiased-cross-entropy", num_classes=100_000, epsilon=eps)
    assert many.per_example(torch.randn(2, 100_000), torch.tensor([0.0, 99_999.0])).isfinite().all()


def test_regression_losses() -> None:
    raw = torch.tensor([[0.0], [1.0]])
    y = torch.tensor([1.0, 1.0])
    assert make_loss("squared").per_example(raw, y).tolist() == [1.0, 0.0]
    assert make_loss("absolute").per_example(raw, y).tolist() == [1.0, 0.0]
    poisson = make_loss("poisson")
    assert poisson.per_example(raw, y).tolist() == pytest.approx([1.0, np.e - 1])
    assert poisson.predict(raw).tolist() == pytest.approx([1.0, np.e])


def write_data(
    tmp_path: Path, n: int, *, classes: int | None = None
) -> tuple[Path, Path, np.ndarray]:
    data = synthetic(n, seed=5, classes=classes)
    fp, lp = tmp_path / "f.parquet", tmp_path / "l.parquet"
    pq.write_table(data.features, fp)
    pq.write_table(
        pa.table({"example_id": data.features.column("example_id"), "label": data.noisy}), lp
    )
    return fp, lp, data.true


def spec(
    tmp_path: Path, fp: Path, lp: Path, manifest: dict[str, Any] | None = None, **config: object
) -> RunSpec:
    return RunSpec(
        features_path=str(fp),
        labels_path=str(lp),
        roles=ROLES.to_dict(),
        config=TrainingConfig(**config).model_dump(mode="json"),  # type: ignore[arg-type]
        manifest=manifest or {"mechanism": {"name": "laplace", "epsilon": 1.0}},
        checkpoint_path=str(tmp_path / "ckpt.pt"),
        artifact_path=str(tmp_path / "model.pt"),
    )


def test_classification_with_mixup_and_debiased_loss(tmp_path: Path) -> None:
    fp, lp, true = write_data(tmp_path, 4000, classes=3)
    manifest = {
        "mechanism": {
            "name": "rr",
            "epsilon": 2.0,
            "outputs": [0, 1, 2],
            "matrix": rr_matrix(3, 2.0).tolist(),
        }
    }
    s = spec(
        tmp_path,
        fp,
        lp,
        manifest,
        task="classification",
        loss="rr-debiased-cross-entropy",
        epochs=4,
        batch_size=256,
        mixup_alpha=0.2,
        optimizer="adam",
        learning_rate=3e-3,
        validation_fraction=0.0,
    )
    metrics = execute(s)
    assert metrics["epochs_run"] == 4
    predictor = load_artifact(Path(s.artifact_path))
    pred = predictor.predict(pq.read_table(fp))
    assert set(np.unique(pred)) <= {0, 1, 2}
    assert (pred == true).mean() > 0.6  # true labels; chance is 1/3


RANDOM_PARTS: dict[str, dict[str, Any]] = {
    "plain": {},
    # Mixup's λ and dropout draw from torch's global generators, which each process
    # seeds afresh: a run is reproducible only if the loop seeds them itself.
    "mixup+dropout": {
        "task": "classification",
        "loss": "cross-entropy",
        "mixup_alpha": 0.4,
        "dropout": 0.3,
    },
}


@pytest.mark.parametrize("random_parts", RANDOM_PARTS.values(), ids=RANDOM_PARTS.keys())
def test_interrupt_and_resume_from_checkpoint(tmp_path: Path, random_parts: dict[str, Any]) -> None:
    classes = 3 if random_parts else None
    fp, lp, _ = write_data(tmp_path, 2000, classes=classes)
    manifest = {"mechanism": {"outputs": [0, 1, 2]}} if classes else None
    config: dict[str, Any] = {
        "epochs": 4,
        "batch_size": 500,
        "hidden": [16],
        "early_stopping_patience": None,
        **random_parts,
    }
    s = spec(tmp_path, fp, lp, manifest, **config)

    def stop_after_epoch_2(p: Progress) -> None:
        if p.epoch == 2 and p.step == p.steps_per_epoch:
            raise Interrupted

    with pytest.raises(Interrupted):
        execute(s, report=stop_after_epoch_2)
    assert torch.load(s.checkpoint_path, weights_only=True)["epoch"] == 2
    resumed = execute(s)
    assert resumed["resumed_from_epoch"] == 2
    assert [h["epoch"] for h in resumed["history"]] == [1.0, 2.0, 3.0, 4.0]
    # Deterministic per-epoch seeds: a straight run ends with the same weights.
    straight = spec(tmp_path / "b", fp, lp, manifest, **config)
    Path(straight.checkpoint_path).parent.mkdir()
    execute(straight)
    a = torch.load(s.artifact_path, weights_only=True)["state_dict"]
    b = torch.load(straight.artifact_path, weights_only=True)["state_dict"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_early_stopping(tmp_path: Path) -> None:
    fp, lp, _ = write_data(tmp_path, 1000)
    config = TrainingConfig(
        epochs=50,
        batch_size=100,
        learning_rate=0.05,
        optimizer="sgd",
        early_stopping_patience=1,
        hidden=[8],
    )
    data = load_training_data(
        features_path=fp, labels_path=lp, roles=ROLES, config=config, manifest={}
    )
    result = train(data, config, device=torch.device("cpu"))
    assert result.metrics["stopped_early"]
    assert result.metrics["epochs_run"] < 50


def test_a_run_that_diverges_after_its_best_epoch_keeps_that_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Weights that stop being finite in epoch 3, after a validated best: training
    stops there and the best epoch's weights are the model (the job succeeds,
    saying when it diverged). Before any best epoch the run fails instead."""
    from feature_party.training import loop

    run = loop._Epochs.run

    def diverging_in_3(self: Any, epoch: int) -> float:
        loss = run(self, epoch)
        if epoch == 2:
            with torch.no_grad():
                next(self.net.parameters()).fill_(float("nan"))
        return loss

    monkeypatch.setattr(loop._Epochs, "run", diverging_in_3)
    fp, lp, _ = write_data(tmp_path, 1000)
    config = TrainingConfig(epochs=6, batch_size=100, hidden=[8], early_stopping_patience=None)
    data = load_training_data(
        features_path=fp, labels_path=lp, roles=ROLES, config=config, manifest={}
    )
    result = train(data, config, device=torch.device("cpu"))
    assert result.metrics["diverged_in_epoch"] == 3
    assert result.metrics["epochs_run"] == 2 and result.metrics["train_loss"] is not None
    assert all(bool(torch.isfinite(p).all()) for p in result.model.parameters())
    no_validation = TrainingConfig(**{**config.model_dump(), "validation_fraction": 0.0})
    data = load_training_data(
        features_path=fp, labels_path=lp, roles=ROLES, config=no_validation, manifest={}
    )
    with pytest.raises(loop.TrainingDivergedError, match="training diverged in epoch 3"):
        train(data, no_validation, device=torch.device("cpu"))


def test_a_feature_column_named_label_is_a_feature(tmp_path: Path) -> None:
    """The join named the received label "label" too: a feature of that name made
    two columns of one name, and a job accepted with a full join failed at load."""
    fp, lp, _ = write_data(tmp_path, 200)
    features = pq.read_table(fp)
    features = features.append_column("label", pa.array(np.arange(200, dtype=np.float64)))
    pq.write_table(features, fp)
    roles = ColumnRoles((*ROLES.numeric, "label"), ROLES.categorical)
    data = load_training_data(features_path=fp, labels_path=lp, roles=roles,
                              config=TrainingConfig(hidden=[8]), manifest={})  # fmt: skip
    received = pq.read_table(lp).sort_by("example_id").column("label").to_numpy()
    targets = torch.cat([data.train_targets, data.validation_targets]).sort().values
    np.testing.assert_allclose(targets.numpy(), np.sort(received), rtol=1e-6)
    assert data.preprocessing.numeric[-1] == "label"


def test_bad_classification_labels_are_refused(tmp_path: Path) -> None:
    fp, lp, _ = write_data(tmp_path, 100)  # real-valued labels
    s = spec(
        tmp_path,
        fp,
        lp,
        {"mechanism": {"outputs": [0, 1]}},
        task="classification",
        loss="cross-entropy",
    )
    with pytest.raises(ValueError, match="class indices"):
        execute(s)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        TrainingConfig(task="classification", loss="squared")
    with pytest.raises(ValueError, match="mixup"):
        TrainingConfig(mixup_alpha=0.2)
    assert TrainingConfig(device=4).world_size == 4
    assert TrainingConfig(device="cpu", processes=2).world_size == 2
    assert TrainingConfig(device=64).world_size == 64
    for gpus in (65, 2**32, 2**63):  # 2**63: a 500 writing the job's gpus (helper-86)
        with pytest.raises(ValueError, match="less than or equal to 64"):
            TrainingConfig.model_validate_json(f'{{"device": {gpus}}}')


def test_a_loss_left_out_follows_the_task_and_a_task_the_loss() -> None:
    """``{"task": "classification"}`` alone met the regression default loss and was
    refused (helper-82); as JSON, the way a job's body arrives."""
    classifier = TrainingConfig.model_validate_json('{"task": "classification"}')
    assert (classifier.task, classifier.loss) == ("classification", "cross-entropy")
    debiased = TrainingConfig.model_validate_json('{"loss": "rr-debiased-cross-entropy"}')
    assert debiased.task == "classification"
    regression = TrainingConfig.model_validate_json('{"loss": "poisson"}')
    assert (regression.task, TrainingConfig().loss) == ("regression", "squared")
    with pytest.raises(ValueError, match="does not fit"):
        TrainingConfig.model_validate_json('{"task": "regression", "loss": "cross-entropy"}')


@pytest.mark.parametrize("algorithm", ["rmsprop", "adam", "sgd"])
def test_lazy_row_updates_match_the_dense_optimizer_on_touched_rows(algorithm: str) -> None:
    """A batch that touches every row gets exactly the configured dense update;
    untouched rows are left alone (moments and weight decay included)."""
    from feature_party.training.optim import LazyRowOptimizer, build_optimizers

    config = TrainingConfig(optimizer=algorithm, learning_rate=0.01, weight_decay=1e-2)
    torch.manual_seed(0)
    table = torch.randn(6, 3)
    lazy_w = torch.nn.Parameter(table.clone())
    dense_w = torch.nn.Parameter(table.clone())
    lazy = LazyRowOptimizer(
        [lazy_w], algorithm=config.optimizer, lr=0.01, weight_decay=1e-2, momentum=0.9
    )
    holder = torch.nn.Module()
    holder.w = dense_w
    (dense,) = build_optimizers(holder, config)
    for _ in range(3):  # every row, some twice: duplicates are summed
        index = torch.tensor([0, 1, 2, 3, 4, 5, 2, 0])
        lazy_w.grad = None
        dense_w.grad = None
        torch.nn.functional.embedding(index, lazy_w, sparse=True).pow(2).sum().backward()
        torch.nn.functional.embedding(index, dense_w).pow(2).sum().backward()
        assert lazy_w.grad is not None and lazy_w.grad.is_sparse
        lazy.step()
        dense.step()
        torch.testing.assert_close(lazy_w.detach(), dense_w.detach())
    before = lazy_w.detach().clone()
    lazy_w.grad = None
    torch.nn.functional.embedding(torch.tensor([1, 1]), lazy_w, sparse=True).sum().backward()
    lazy.step()
    changed = (lazy_w.detach() != before).any(dim=1)
    assert changed.tolist() == [False, True, False, False, False, False]


@pytest.mark.parametrize(
    ("device", "wrapped", "checkpoint", "expected"),
    [
        ("cpu", False, None, "lazy"),  # sparse row updates save table-sized passes
        ("cuda", False, None, "dense"),  # measured faster on an H100
        ("cpu", True, None, "dense"),  # DDP all-reduces dense gradients
        ("cuda", False, {"embedding_updates": "lazy"}, "lazy"),  # a resumed run keeps its own
        ("cpu", False, {"embedding_updates": "dense"}, "dense"),
        ("cpu", False, {}, "dense"),  # checkpoints from before the choice was stored
    ],
)
def test_auto_embedding_updates(
    device: str, wrapped: bool, checkpoint: dict[str, Any] | None, expected: str
) -> None:
    got = auto_embedding_updates(torch.device(device), wrapped=wrapped, checkpoint=checkpoint)
    assert got == expected


def test_lazy_and_dense_embedding_updates_both_learn(tmp_path: Path) -> None:
    fp, lp, _ = write_data(tmp_path, 3000)
    config = TrainingConfig(epochs=5, batch_size=256, learning_rate=3e-3, hidden=[32])
    data = load_training_data(
        features_path=fp, labels_path=lp, roles=ROLES, config=config, manifest={}
    )
    losses = {}
    for updates in ("lazy", "dense"):
        result = train(data, config, device=torch.device("cpu"), embedding_updates=updates)
        assert result.metrics["embedding_updates"] == updates
        assert not result.model.sparse_gradients
        losses[updates] = result.metrics["best_validation_loss"]
    # Same data, same initial weights: the two updates end close to each other.
    assert losses["lazy"] == pytest.approx(losses["dense"], rel=0.1)


def test_a_job_that_could_only_fail_in_the_worker_is_refused_up_front() -> None:
    """A reviewer's jobs were accepted and failed in the worker: a weight decay of
    1e308, a seed past 64 bits, hidden layers of 2³¹ units (77 GB)."""
    for bad in ({"weight_decay": 1e308}, {"seed": 10**30}, {"seed": -1},
                {"hidden": [2**31] * 16}, {"hidden": [16_384] * 3}):  # fmt: skip
        with pytest.raises(ValueError):
            TrainingConfig(**bad)  # type: ignore[arg-type]
    assert TrainingConfig(seed=2**32 - 1, hidden=[16_384]).seed == 2**32 - 1
    assert TrainingConfig(hidden=[16_384, 16_384]).hidden == [16_384, 16_384]  # 2²⁸: the most
