"""LabelDP-Pro: label-DP training by DP-SGD with projection denoisers.

The central-model algorithm of ``labeldp-pro.txt`` (Algorithm 1): DP-SGD whose
privatized gradient is projected onto the span or convex hull of per-example
per-class gradients built from public features only (Table 1, §3.2), with §3.3's
coefficient smoothing and §3.4's accounting by Google's ``dp-accounting``.
The released message is the trained model together with its (ε, δ) record.


The package's names load lazily (PEP 562): importing :mod:`.accounting` (what the
labels-party API uses to plan a training) must not import torch, which only the
trainer and the denoisers need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from label_party.labeldp_pro.accounting import (
        AccountingRecord,
        account,
        amplification_for,
        calibrate_noise,
        epsilon_for,
    )
    from label_party.labeldp_pro.denoisers import (
        DENOISERS,
        PROJECTION_METHODS,
        DenoiserName,
        PerClassGradients,
        ProjectionMethod,
        denoise,
        origin_weights,
        project_convex_hull,
        project_simplex,
        project_span,
        smooth,
    )
    from label_party.labeldp_pro.dpsgd import (
        EpochSummary,
        LabelDPProConfig,
        ProgressEvent,
        TrainingResult,
        clip_per_example,
        privatize,
        secure_torch_generator,
        train_labeldp_pro,
    )

__all__ = [
    "DENOISERS",
    "PROJECTION_METHODS",
    "AccountingRecord",
    "DenoiserName",
    "EpochSummary",
    "LabelDPProConfig",
    "PerClassGradients",
    "ProgressEvent",
    "ProjectionMethod",
    "TrainingResult",
    "account",
    "amplification_for",
    "calibrate_noise",
    "clip_per_example",
    "denoise",
    "epsilon_for",
    "origin_weights",
    "privatize",
    "project_convex_hull",
    "project_simplex",
    "project_span",
    "secure_torch_generator",
    "smooth",
    "train_labeldp_pro",
]

_MODULES = {
    name: module
    for module, names in {
        "accounting": (
            "AccountingRecord",
            "account",
            "amplification_for",
            "calibrate_noise",
            "epsilon_for",
        ),
        "denoisers": (
            "DENOISERS",
            "PROJECTION_METHODS",
            "DenoiserName",
            "PerClassGradients",
            "ProjectionMethod",
            "denoise",
            "origin_weights",
            "project_convex_hull",
            "project_simplex",
            "project_span",
            "smooth",
        ),
        "dpsgd": (
            "EpochSummary",
            "LabelDPProConfig",
            "ProgressEvent",
            "TrainingResult",
            "clip_per_example",
            "privatize",
            "secure_torch_generator",
            "train_labeldp_pro",
        ),
    }.items()
    for name in names
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
