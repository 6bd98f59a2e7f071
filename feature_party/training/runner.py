"""One training run, described by a self-contained :class:`RunSpec` (paths and
configuration, JSON-serializable) so the same code runs in the worker process or
in each rank of a ``torchrun`` launch."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from feature_party.training.artifact import load_artifact, save_artifact
from feature_party.training.config import TrainingConfig
from feature_party.training.data import ColumnRoles
from feature_party.training.dataset import load_training_data
from feature_party.training.loop import Reporter, resolve_device, train


@dataclass(frozen=True)
class RunSpec:
    features_path: str
    labels_path: str
    roles: dict[str, list[str]]
    config: dict[str, Any]
    manifest: dict[str, Any]
    checkpoint_path: str
    artifact_path: str
    #: The artifact of ``config.init_model_id`` (multi-stage training), resolved by the worker.
    init_artifact_path: str | None = None

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> RunSpec:
        return cls(**json.loads(path.read_text()))

    @property
    def training(self) -> TrainingConfig:
        return TrainingConfig.model_validate(self.config)


def execute(
    spec: RunSpec,
    *,
    report: Reporter | None = None,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | None = None,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
) -> dict[str, Any]:
    """Load data, train (resuming from the checkpoint if there is one), and on rank
    0 write the artifact. Returns the run's metrics."""
    config = spec.training
    init = load_artifact(Path(spec.init_artifact_path)) if spec.init_artifact_path else None
    data = load_training_data(
        features_path=Path(spec.features_path),
        labels_path=Path(spec.labels_path),
        roles=ColumnRoles(tuple(spec.roles["numeric"]), tuple(spec.roles["categorical"])),
        config=config,
        manifest=spec.manifest,
        preprocessing=init.preprocessing if init else None,
    )
    result = train(
        data,
        config,
        device=device or resolve_device(config),
        report=report,
        checkpoint_path=Path(spec.checkpoint_path),
        rank=rank,
        world_size=world_size,
        wrap=wrap,
        init_state=init.model.state_dict() if init else None,
    )
    if rank == 0:
        save_artifact(
            Path(spec.artifact_path),
            model=result.model,
            preprocessing=data.preprocessing,
            config=config,
            num_classes=data.num_classes,
            metrics=result.metrics,
        )
    return {**result.metrics, "history": result.history}
