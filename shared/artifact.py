"""The model artifact format both parties agree on: ``labeldp-model/1``.

One ``torch.save`` file of plain containers and tensors, loadable with
``torch.load(path, weights_only=True)`` — no pickled code. The features party
writes it after its own training jobs (``feature_party.training.artifact``,
which also loads it for prediction); the labels party writes it as the message
of a LabelDP-Pro training (``label_party.trainings``). The two parties never
import each other (DESIGN.md §2), so the shape they share lives here.

Keys: ``format``, ``model`` (a ``shared.torch_models`` config dict),
``state_dict``, ``preprocessing`` (:func:`preprocessing_dict`), ``task``,
``loss``, ``num_classes``, ``training`` (the public training configuration),
``metrics``; a LabelDP-Pro model adds ``accounting`` (its (ε, δ) record).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from shared.torch_files import save_torch_file

__all__ = ["ARTIFACT_FORMAT", "model_artifact", "preprocessing_dict", "save_artifact_file"]

ARTIFACT_FORMAT = "labeldp-model/1"


def preprocessing_dict(
    numeric: Sequence[str], means: Sequence[float], stds: Sequence[float]
) -> dict[str, Any]:
    """The ``preprocessing`` entry for numeric-only features: prediction computes
    ``(x − mean) / std`` per column (missing values become 0)."""
    if not len(numeric) == len(means) == len(stds):
        raise ValueError("numeric, means and stds must have one entry per column")
    return {
        "numeric": list(numeric),
        "means": [float(m) for m in means],
        "stds": [float(s) for s in stds],
        "categorical": [],
        "vocabularies": [],
    }


def model_artifact(
    *,
    model: nn.Module,
    model_config: dict[str, Any],
    preprocessing: dict[str, Any],
    task: str,
    loss: str,
    num_classes: int | None,
    training: dict[str, Any],
    metrics: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """The artifact's dictionary (weights moved to the CPU)."""
    return {
        "format": ARTIFACT_FORMAT,
        "model": model_config,
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "preprocessing": preprocessing,
        "task": task,
        "loss": loss,
        "num_classes": num_classes,
        "training": training,
        "metrics": metrics,
        **extra,
    }


def save_artifact_file(path: Path, artifact: dict[str, Any]) -> None:
    """Write ``artifact`` atomically and durably (a crash never leaves half a file;
    a full disk raises its ``OSError``)."""
    save_torch_file(path, artifact, fsync=True)
