"""The torch side of a training: model, LabelDP-Pro call, artifact (worker only).

Kept apart from :mod:`label_party.trainings.worker` so that the service and the
queue code never import torch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from label_party.labeldp_pro.denoisers import Poll, no_poll
from label_party.labeldp_pro.dpsgd import (
    Checkpoint,
    Checkpointing,
    EpochSummary,
    LabelDPProConfig,
    TrainingResult,
    train_labeldp_pro,
)
from label_party.trainings.plan import below_charged
from label_party.trainings.schemas import unread_fields
from shared.artifact import model_artifact, preprocessing_dict
from shared.protocol import DELTA_SCALE, EPSILON_SCALE
from shared.torch_files import save_torch_file
from shared.torch_models import ImageCNN, ImageCNNConfig, TabularMLP, TabularMLPConfig

if TYPE_CHECKING:
    from label_party.trainings.worker import Prepared

logger = logging.getLogger("label_party.trainings")

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
    "projection_backend",
    "smoothing",
)

#: Spec keys the schema leaves ``None`` for the library to fill in.
_DEFAULTED = ("projection_steps", "projection_backend", "projection_method", "smoothing")


def build(spec: dict[str, Any], num_features: int, num_classes: int) -> ImageCNN | TabularMLP:
    """The untrained model the spec names, with one output per declared class."""
    if spec["architecture"] == "cnn":
        c, h, w = spec["image_shape"]
        return ImageCNN(ImageCNNConfig(channels=c, height=h, width=w, outputs=num_classes))
    config = TabularMLPConfig(
        num_numeric=num_features, hidden=tuple(spec["hidden"]), outputs=num_classes
    )
    return TabularMLP(config)


def library_defaults(denoiser: str) -> dict[str, Any]:
    """What :class:`LabelDPProConfig` uses for the spec keys the schema leaves
    ``None``, for those the denoiser reads (:func:`unread_fields`). The service
    stores them in the resolved spec, so the training and its artifact say what ran."""
    defaults = {f.name: f.default for f in fields(LabelDPProConfig)}
    unread = unread_fields(denoiser, architecture="")
    return {key: defaults[key] for key in _DEFAULTED if key not in unread}


def parameter_count(spec: dict[str, Any], num_features: int, num_classes: int) -> int:
    """How many parameters the spec's model has, counted without allocating them."""
    with torch.device("meta"):
        model = build(spec, num_features, num_classes)
    return sum(p.numel() for p in model.parameters())


def activation_count(spec: dict[str, Any], num_features: int, num_classes: int) -> int:
    """Floats one example's forward pass holds: its input and every layer's output,
    counted on the meta device without computing anything."""
    outputs = [num_features]

    def record(_module: torch.nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        outputs.append(output.numel())

    with torch.device("meta"):
        model = build(spec, num_features, num_classes)
        for module in model.modules():
            if next(module.children(), None) is None:  # a layer, not a container
                module.register_forward_hook(record)
        model(torch.empty(1, num_features))
    return sum(outputs)


def config_for(spec: dict[str, Any], num_classes: int, device: str) -> LabelDPProConfig:
    options = {k: spec[k] for k in _PASSED if spec.get(k) is not None}
    return LabelDPProConfig(
        epsilon=below_charged(spec["epsilon"], EPSILON_SCALE),
        delta=below_charged(spec["delta"], DELTA_SCALE),
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
    checkpoint_file: Path | None = None,
    poll: Poll = no_poll,
) -> TrainingResult:
    """Run LabelDP-Pro. ``seed`` (test mode only) fixes the generator; otherwise the
    library draws a fresh OS seed (DESIGN.md §3.5). With ``checkpoint_file`` the
    run saves its state there about :data:`CHECKPOINTS_PER_RUN` times and, if the
    file holds a checkpoint of this plan, goes on from it. ``poll`` runs many times
    a step (:func:`train_labeldp_pro`) and raises to stop the run."""
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
        checkpointing=None if checkpoint_file is None else _checkpointing(spec, checkpoint_file),
        poll=poll,
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


#: A resumed training repeats at most 1/20 of its steps.
CHECKPOINTS_PER_RUN = 20
_CHECKPOINT_FORMAT = "labeldp-checkpoint/1"


def _checkpointing(spec: dict[str, Any], path: Path) -> Checkpointing | None:
    """Save to ``path`` as the run goes; resume from it when it matches the plan."""
    plan = spec.get("plan")
    if plan is None:  # rows from before plans: nothing to check a checkpoint against
        return None
    every = max(1, math.ceil(int(plan["steps"]) / CHECKPOINTS_PER_RUN))

    def save(checkpoint: Checkpoint) -> None:
        write_checkpoint(path, checkpoint, plan)

    return Checkpointing(every_steps=every, save=save, resume=read_checkpoint(path, plan))


def write_checkpoint(path: Path, checkpoint: Checkpoint, plan: dict[str, Any]) -> None:
    """Atomically (a temporary file, then a rename): a crash mid-write leaves the
    previous checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": _CHECKPOINT_FORMAT,
        "plan": dict(plan),
        "step": checkpoint.step,
        "model": checkpoint.model,
        "optimizer": checkpoint.optimizer,
        "history": [asdict(h) for h in checkpoint.history],
        "partial": None if checkpoint.partial is None else asdict(checkpoint.partial),
    }
    # Its own temporary name: a worker that lost its lease may still be writing
    # while the one that took the training over saves.
    save_torch_file(path, payload)


def _summary(saved: dict[str, Any]) -> EpochSummary:
    """An epoch's summary as a checkpoint saved it; a field no longer reported
    (``mean_batch_size``, before 2026-11-24) is dropped."""
    known = {f.name for f in fields(EpochSummary)}
    return EpochSummary(**{k: v for k, v in saved.items() if k in known})


def read_checkpoint(path: Path, plan: dict[str, Any]) -> Checkpoint | None:
    """The checkpoint in ``path`` if it was saved under this very plan, else None
    (a missing, unreadable or foreign file means starting from step 0)."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None
    except Exception:  # a torn or foreign file: train from the start instead
        logger.warning("ignoring unreadable checkpoint %s", path.name, exc_info=True)
        return None
    if not isinstance(payload, dict) or payload.get("format") != _CHECKPOINT_FORMAT:
        return None
    if payload.get("plan") != dict(plan):
        return None
    return Checkpoint(
        step=int(payload["step"]),
        model=payload["model"],
        optimizer=payload["optimizer"],
        history=[_summary(h) for h in payload["history"]],
        # (None in a checkpoint saved before 2026-11-25: that epoch's summary then
        # covers the steps since the resume.)
        partial=None if payload.get("partial") is None else _summary(payload["partial"]),
    )
