"""The torch side of a training: model, LabelDP-Pro call, artifact (worker only).

Kept apart from :mod:`label_party.trainings.worker` so that the service and the
queue code never import torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from label_party.labeldp_pro import LabelDPProConfig, TrainingResult, train_labeldp_pro
from shared.artifact import model_artifact, preprocessing_dict
from shared.torch_models import ImageCNN, ImageCNNConfig, TabularMLP, TabularMLPConfig

if TYPE_CHECKING:
    from label_party.trainings.worker import Prepared

#: Spec keys passed to :class:`LabelDPProConfig` as they are (when present).
_PASSED = (
    "denoiser",
    "epochs",
    "expected_batch_size",
    "clip_norm",
    "learning_rate",
    "optimizer",
    "alt_batch_size",
    "projection_steps",
    "projection_method",
    "smoothing",
)


def build(spec: dict[str, Any], num_features: int, num_classes: int) -> ImageCNN | TabularMLP:
    """The untrained model the spec names, with one output per declared class."""
    if spec["architecture"] == "cnn":
        c, h, w = spec["image_shape"]
        return ImageCNN(ImageCNNConfig(channels=c, height=h, width=w, outputs=num_classes))
    config = TabularMLPConfig(
        num_numeric=num_features, hidden=tuple(spec["hidden"]), outputs=num_classes
    )
    return TabularMLP(config)


def config_for(spec: dict[str, Any], num_classes: int, device: str) -> LabelDPProConfig:
    options = {k: spec[k] for k in _PASSED if spec.get(k) is not None}
    return LabelDPProConfig(
        epsilon=float(spec["epsilon"]),
        delta=float(spec["delta"]),
        num_classes=num_classes,
        device=device,
        **options,
    )


def train(
    spec: dict[str, Any],
    data: Prepared,
    *,
    device: str,
    report: Callable[[dict[str, Any]], None],
    seed: int | None,
) -> TrainingResult:
    """Run LabelDP-Pro. ``seed`` (test mode only) fixes the generator; otherwise the
    library draws a fresh OS seed (DESIGN.md §3.5)."""
    model = build(spec, data.features.shape[1], data.num_classes)
    config = config_for(spec, data.num_classes, device)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=torch.device(device))
        generator.manual_seed(seed)

    def on_step(event: Any) -> None:
        report(
            {
                "epoch": event.epoch + 1,
                "epochs": config.epochs,
                "step": event.step,
                "total_steps": event.total_steps,
                "elapsed_seconds": round(event.elapsed_seconds, 3),
                "eta_seconds": round(event.eta_seconds, 3),
            }
        )

    return train_labeldp_pro(
        model,
        torch.from_numpy(data.features),
        torch.from_numpy(data.labels),
        config=config,
        report=on_step,
        generator=generator,
        noise_multiplier=planned_sigma(spec),
    )


def planned_sigma(spec: dict[str, Any]) -> float | None:
    """σ of the plan accepted with the training (None for rows from before plans)."""
    plan = spec.get("plan")
    return None if plan is None else float(plan["noise_multiplier"])


def artifact(
    spec: dict[str, Any], data: Prepared, result: TrainingResult, metrics: dict[str, Any]
) -> dict[str, Any]:
    """The ``labeldp-model/1`` dictionary the features party's registry loads."""
    model = result.model
    assert isinstance(model, ImageCNN | TabularMLP)
    config = model.config.to_dict()
    config.setdefault("architecture", spec["architecture"])
    return model_artifact(
        model=model.cpu(),
        model_config=config,
        preprocessing=preprocessing_dict(data.columns, data.means, data.stds),
        task="classification",
        loss="cross-entropy",
        num_classes=data.num_classes,
        training=dict(spec),
        metrics=metrics,
        accounting=result.accounting.to_dict(),
    )
