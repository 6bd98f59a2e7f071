"""What a training will take of its worker, estimated when it is requested.

A training is paid for when it is accepted and never refunded (DESIGN.md §3.3),
so one its worker could not hold or finish must be refused then (422, nothing
spent), not discovered after its budget was charged. Three bounds, each an
operator setting:

* **parameters** (``LABELDP_TRAINING_MAX_PARAMETERS``): DP-SGD's per-example
  gradients, ``physical_batch_size`` (1,024) of them at once, 4 bytes a parameter
  each;
* **projection memory** (``LABELDP_TRAINING_MAX_PROJECTION_BYTES``): a projecting
  denoiser builds its operator ``G`` over ``m`` examples — ALTCONV's
  ``alt_batch_size``, or the Poisson batch for SELF* — by recording their forward
  pass, about :data:`BYTES_PER_ACTIVATION` bytes for every float of one
  example's forward pass (its input and every layer's output), and meanwhile
  computes its column norms a block of ``c`` examples' per-class gradients at a
  time (``c·K·d`` floats, ``c = ⌊16 M / (K·d)⌋`` or 1), whose ``K`` backward
  passes hold ``c·K`` forward passes; the ``dense`` backend also holds ``G``
  (4 bytes an entry, up to 1 GiB); torch's autodiff machinery adds
  :data:`RUNTIME_BYTES`. This overestimates what was measured by 1.3–2.7× (the
  Table-10a CNN and the default MLP, ``tests/unit/test_training_resources.py``);
* **compute** (``LABELDP_TRAINING_MAX_EXAMPLE_GRADIENTS``): the run's
  example-gradients (one example's forward and backward pass), about
  ``T · (B + m · (K + 2·(P + s + 1)))`` — each of the ``T`` steps takes the
  batch's per-example gradients, then the projection's column norms (``K``), its
  step-size estimate (``P`` power iterations) and ``s`` projection steps, each a
  JVP and a VJP (:mod:`label_party.labeldp_pro.denoisers`).

All of it is public configuration and counts; nothing here reads a label.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from label_party.config import Settings
from label_party.exceptions import InvalidRequestError
from label_party.trainings.plan import steps_per_epoch

#: Bytes a projection holds for each float of one example's forward pass
#: (measured 7.5 on the Table-10a CNN, 5.4 on the default MLP).
BYTES_PER_ACTIVATION = 12
#: Bytes a per-class gradient block takes per float at its peak (the float32
#: Jacobian and autodiff's intermediates; 860 MiB measured for 67 M floats).
BYTES_PER_JACOBIAN_FLOAT = 12
#: What torch's functional autodiff loads on a worker's first projection
#: (measured about 95 MiB).
RUNTIME_BYTES = 128 << 20
#: A Poisson batch of expected size B exceeds B + 8√B with probability below 10⁻¹⁴.
_POISSON_SPREAD = 8


@dataclass(frozen=True)
class Estimate:
    """What the worker will need: ``parameters`` of the model; ``projection_examples``
    (``m``, 0 for ``noop``) and ``projection_bytes``; ``example_gradients`` of the run."""

    parameters: int
    projection_examples: int
    projection_bytes: int
    example_gradients: int


def estimate(resolved: dict[str, Any], num_examples: int, num_features: int) -> Estimate:
    """The :class:`Estimate` for a resolved spec (with ``num_classes``) over
    ``num_examples`` labelled examples of ``num_features`` numeric columns."""
    # torch, which the service otherwise never loads, counts the model.
    from label_party.labeldp_pro.denoisers import POWER_ITERATIONS
    from label_party.trainings.training import parameter_count

    k = int(resolved["num_classes"])
    params = parameter_count(resolved, num_features, k)
    batch = int(resolved["expected_batch_size"])
    m = projection_examples(resolved, num_examples)
    projection_bytes = passes = 0
    if m:
        projection_bytes = _projection_bytes(resolved, m, k, params, num_features)
        passes = m * (k + 2 * (POWER_ITERATIONS + int(resolved["projection_steps"]) + 1))
    steps = int(resolved["epochs"]) * steps_per_epoch(num_examples, batch)
    return Estimate(params, m, projection_bytes, steps * (batch + passes))


def _projection_bytes(
    resolved: dict[str, Any], m: int, k: int, params: int, num_features: int
) -> int:
    """The module docstring's sum for ``m`` examples of ``K = k`` classes."""
    from label_party.labeldp_pro.denoisers import DENSE_MAX_BYTES, NORM_CHUNK_FLOATS
    from label_party.trainings.training import activation_count

    activations = activation_count(resolved, num_features, k)
    block = min(m, max(1, NORM_CHUNK_FLOATS // (k * params)))  # the column norms' c
    total = RUNTIME_BYTES + BYTES_PER_ACTIVATION * (m + block * k) * activations
    total += BYTES_PER_JACOBIAN_FLOAT * block * k * params
    if resolved.get("projection_backend") == "dense":
        total += min(4 * m * k * params, DENSE_MAX_BYTES)
    return total


def projection_examples(resolved: dict[str, Any], num_examples: int) -> int:
    """``m``, the examples a step's projection set spans (Table 1): ALTCONV's n₂,
    SELF*'s Poisson batch (at most its mean plus eight standard deviations)."""
    denoiser = resolved["denoiser"]
    if denoiser == "noop":
        return 0
    if denoiser == "alt-conv":
        return min(int(resolved["alt_batch_size"]), num_examples)
    batch = int(resolved["expected_batch_size"])
    return min(num_examples, batch + math.ceil(_POISSON_SPREAD * math.sqrt(batch)))


def check(
    settings: Settings, resolved: dict[str, Any], num_examples: int, num_features: int
) -> None:
    """422 (nothing spent) for a training past any of the three bounds."""
    need = estimate(resolved, num_examples, num_features)
    architecture, denoiser = resolved["architecture"], resolved["denoiser"]
    if need.parameters > settings.training_max_parameters:
        raise InvalidRequestError(
            f"the {architecture} has {need.parameters:,} parameters; this labels party "
            f"trains models of at most {settings.training_max_parameters:,} "
            "(LABELDP_TRAINING_MAX_PARAMETERS)",
            {"parameters": need.parameters, "limit": settings.training_max_parameters},
        )
    allowed = settings.training_max_projection_bytes
    if need.projection_bytes > allowed:
        what = "alt_batch_size" if denoiser == "alt-conv" else "the batch"
        raise InvalidRequestError(
            f"the {denoiser} projection over {need.projection_examples:,} examples "
            f"({what}) of a {need.parameters:,}-parameter {architecture} with "
            f"{resolved['num_classes']:,} classes needs about "
            f"{need.projection_bytes / 2**30:.1f} GiB; this labels party allows "
            f"{allowed / 2**30:.1f} GiB (LABELDP_TRAINING_MAX_PROJECTION_BYTES): project "
            "over fewer examples, use a smaller model or the noop denoiser",
            {
                "projection_bytes": need.projection_bytes,
                "projection_examples": need.projection_examples,
                "limit": allowed,
            },
        )
    most = settings.training_max_example_gradients
    if need.example_gradients > most:
        raise InvalidRequestError(
            f"this training computes about {need.example_gradients:.3g} example-gradients "
            f"(steps × (batch + projection examples × passes a projection)); this labels "
            f"party trains at most {most:.3g} (LABELDP_TRAINING_MAX_EXAMPLE_GRADIENTS): "
            "lower projection_steps, alt_batch_size or epochs",
            {"example_gradients": need.example_gradients, "limit": most},
        )
