"""LabelDP-Pro: label-DP training by DP-SGD with projection denoisers.

The central-model algorithm of ``labeldp-pro.txt`` (Algorithm 1): DP-SGD whose
privatized gradient is projected onto the span or convex hull of per-example
per-class gradients built from public features only (Table 1, §3.2), with §3.3's
coefficient smoothing and §3.4's accounting by Google's ``dp-accounting``.
The released message is the trained model together with its (ε, δ) record.
"""

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
