"""Training losses on noisy labels (DESIGN.md §5).

Each loss maps raw model outputs ``[B, outputs]`` and noisy targets ``[B]`` to
per-example losses ``[B]`` (so mixup can weight them) and knows how to turn raw
outputs into predictions.

``rr-debiased-cross-entropy`` is the unbiased loss of RR-Debiased
(``labeldp-pro.txt`` Appendix D.1, after Ghazi et al. 2021 Appendix F.1): for a
label randomizer with transition matrix ``T[y, o] = P(o | y)`` the loss
``ℓ̃(f, o) = Σ_y (T⁻¹)[o, y] · ℓ(f, y)`` satisfies ``E_o[ℓ̃(f, o) | y] = ℓ(f, y)``.
For K-ary randomized response ``T⁻¹ = (I − (p/K)·J) / (1 − p)`` with
``p = K / (e^ε + K − 1)``, which is exactly the paper's formula
``(ℓ(f, ŷ) − (p/K)·Σ_κ ℓ(f, κ)) / (1 − p)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch.nn import functional

__all__ = ["LOSS_NAMES", "Loss", "LossName", "make_loss", "rr_matrix"]

LossName = Literal["squared", "absolute", "poisson", "cross-entropy", "rr-debiased-cross-entropy"]
LOSS_NAMES: tuple[LossName, ...] = (
    "squared",
    "absolute",
    "poisson",
    "cross-entropy",
    "rr-debiased-cross-entropy",
)
CLASSIFICATION_LOSSES = frozenset({"cross-entropy", "rr-debiased-cross-entropy"})


class Loss:
    """A per-example loss and its prediction rule."""

    name: LossName = "squared"
    classification = False

    def __init__(self, outputs: int = 1) -> None:
        self.outputs = outputs

    def per_example(self, raw: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (raw[:, 0] - target) ** 2

    def predict(self, raw: torch.Tensor) -> torch.Tensor:
        """Predictions in label units (class index for classification)."""
        return raw[:, 0]


class AbsoluteLoss(Loss):
    name: LossName = "absolute"

    def per_example(self, raw: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (raw[:, 0] - target).abs()


class PoissonLoss(Loss):
    """Poisson regression with log link: the model outputs ``log λ``; loss
    ``λ − y·log λ`` (the constant ``log y!`` dropped)."""

    name: LossName = "poisson"

    def per_example(self, raw: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        log_rate = raw[:, 0]
        return torch.exp(log_rate) - target * log_rate

    def predict(self, raw: torch.Tensor) -> torch.Tensor:
        return torch.exp(raw[:, 0])


class CrossEntropyLoss(Loss):
    name: LossName = "cross-entropy"
    classification = True

    def per_example(self, raw: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return functional.cross_entropy(raw, target.long(), reduction="none")

    def predict(self, raw: torch.Tensor) -> torch.Tensor:
        return raw.argmax(dim=1)


class DebiasedCrossEntropyLoss(CrossEntropyLoss):
    """Unbiased cross-entropy under a known label randomizer (see module docstring)."""

    name: LossName = "rr-debiased-cross-entropy"

    def __init__(self, transition: torch.Tensor) -> None:
        k = transition.shape[0]
        if transition.shape != (k, k):
            raise ValueError("the debiased loss needs a square K×K transition matrix")
        super().__init__(outputs=k)
        inverse = torch.linalg.inv(transition.double())
        # ℓ̃[:, o] = Σ_y T⁻¹[o, y] ℓ[:, y]  →  ℓ̃ = ℓ @ T⁻¹ᵀ
        self.mix = inverse.T.float().contiguous()

    def per_example(self, raw: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        all_classes = -functional.log_softmax(raw, dim=1)  # ℓ(f, y) for every y
        debiased: torch.Tensor = all_classes @ self.mix.to(raw.device)
        return debiased.gather(1, target.long().unsqueeze(1)).squeeze(1)


class RRDebiasedCrossEntropyLoss(CrossEntropyLoss):
    """The debiased cross-entropy for K-ary randomized response, without its K×K
    matrix: T = (1 − p)·I + (p/K)·11ᵀ has the inverse (Sherman–Morrison)
    T⁻¹ = I/(1 − p) − p/(K(1 − p))·11ᵀ, so ℓ̃ = (ℓ − (p/K)·Σ_y ℓ)/(1 − p): O(K) an
    example, where the matrix form is O(K²) (and 80 GB at K = 10⁵)."""

    name: LossName = "rr-debiased-cross-entropy"

    def __init__(self, num_classes: int, epsilon: float) -> None:
        super().__init__(outputs=num_classes)
        self.p = num_classes / (math.exp(epsilon) + num_classes - 1)

    def per_example(self, raw: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        all_classes = -functional.log_softmax(raw, dim=1)  # ℓ(f, y) for every y
        own = all_classes.gather(1, target.long().unsqueeze(1)).squeeze(1)
        k = all_classes.shape[1]
        return (own - self.p / k * all_classes.sum(dim=1)) / (1 - self.p)


def rr_matrix(num_classes: int, epsilon: float) -> torch.Tensor:
    """Transition matrix of K-ary randomized response at ``epsilon``."""
    k = num_classes
    p = k / (math.exp(epsilon) + k - 1)
    return (1 - p) * torch.eye(k, dtype=torch.float64) + p / k


def debiasing_problem(mechanism: Mapping[str, Any]) -> str | None:
    """Why ``rr-debiased-cross-entropy`` cannot correct a release made by
    ``mechanism`` (its manifest's description), or None: it needs the release's
    square matrix, or K-ary randomized response, whose matrix (K, ε) give. An
    ``rr-with-prior`` release is RRTop-k, whose matrix is not invertible."""
    if mechanism.get("matrix") or mechanism.get("name") == "rr":
        return None
    return (
        "rr-debiased-cross-entropy corrects K-ary randomized response (rr); this release "
        f"was made by {mechanism.get('name')!r}: use cross-entropy"
    )


def make_loss(
    name: LossName,
    *,
    num_classes: int | None = None,
    matrix: Sequence[Sequence[float]] | None = None,
    epsilon: float | None = None,
) -> Loss:
    """The loss ``name``. Classification losses need ``num_classes``; the debiased
    one uses the release's ``matrix`` when it is square, else K-ary RR at
    ``epsilon``."""
    if name == "squared":
        return Loss()
    if name == "absolute":
        return AbsoluteLoss()
    if name == "poisson":
        return PoissonLoss()
    if num_classes is None or num_classes < 2:
        raise ValueError(f"{name} needs num_classes ≥ 2")
    if name == "cross-entropy":
        return CrossEntropyLoss(outputs=num_classes)
    if name == "rr-debiased-cross-entropy":
        if matrix is not None and len(matrix) == num_classes and len(matrix[0]) == num_classes:
            return DebiasedCrossEntropyLoss(torch.tensor(matrix, dtype=torch.float64))
        if epsilon is not None:  # K-ary RR, whose manifest no longer carries its matrix
            return RRDebiasedCrossEntropyLoss(num_classes, epsilon)
        raise ValueError("rr-debiased-cross-entropy needs the release's matrix or epsilon")
    raise ValueError(f"unknown loss {name!r}")
