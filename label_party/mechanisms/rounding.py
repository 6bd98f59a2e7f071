"""Unbiased randomized rounding of continuous labels onto a grid.

``optimal-unbiased-randomizers.txt`` §3.1 ("Handling continuous 𝒴"): for a label
``y`` with consecutive grid points ``y₁ ≤ y ≤ y₂``, ``URR(y)`` is ``y₁`` with
probability ``(y₂ − y)/(y₂ − y₁)`` and ``y₂`` with probability
``(y − y₁)/(y₂ − y₁)``, so ``E[URR(y)] = y``. Composed with an unbiased randomizer
on the grid the result is unbiased for every ``y`` in the range; the paper's
bound on the cost of a discrete output grid (Appendix E) applies the same map to
a mechanism's outputs.

**Not private by itself.** Rounding is a lossy but label-revealing map (a label on a
grid point is returned unchanged), so it has no finite ε: the mechanism built by
:func:`from_request` reports ``epsilon = inf`` and ``dp_ratio() = inf``. Its privacy
is whatever ε-DP mechanism is composed *after* it on the grid (post-processing
does not apply in this direction: rounding is pre-processing of the private
input, and the composed map ``𝓜 ∘ URR`` is ε-DP whenever 𝓜 is, because each of
its output distributions is a mixture of 𝓜's rows). Its matrix is for preview
only; a release must never publish rounded labels on their own.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from label_party.mechanisms.base import (
    DEFAULT_CHUNK,
    FiniteMechanism,
    FitRequest,
    FloatArray,
    IntArray,
    Mechanism,
    MechanismError,
    check_params,
    map_chunks,
)

__all__ = [
    "RoundingMechanism",
    "check_grid",
    "from_request",
    "round_to_grid",
    "round_to_integers",
    "rounding_probabilities",
]

#: Largest grid ``from_request`` builds from ``grid_size``.
MAX_GRID = 100_000


def check_grid(grid: FloatArray | list[float]) -> FloatArray:
    """Return ``grid`` as floats if it has ≥ 2 finite, strictly increasing points."""
    g = np.asarray(grid, dtype=np.float64)
    if g.ndim != 1 or g.size < 2:
        raise MechanismError("grid must be a list of at least two numbers")
    if not np.all(np.isfinite(g)):
        raise MechanismError("grid must contain finite numbers")
    if np.any(np.diff(g) <= 0):
        raise MechanismError("grid must be strictly increasing")
    return g


def rounding_probabilities(labels: FloatArray, grid: FloatArray) -> tuple[IntArray, FloatArray]:
    """Lower neighbour index ``j`` and ``P(round up to grid[j + 1])`` for each label.

    ``grid[j] ≤ y ≤ grid[j + 1]`` and ``p = (y − grid[j]) / (grid[j+1] − grid[j])``,
    so ``(1 − p)·grid[j] + p·grid[j + 1] = y``. A label on a grid point gets
    ``p = 0`` (the top point: ``j = n − 2``, ``p = 1``): it stays put. Labels outside
    ``[grid[0], grid[-1]]`` raise :class:`MechanismError` (the message carries no
    label value).
    """
    g = grid
    y = np.asarray(labels, dtype=np.float64)
    if not np.all(np.isfinite(y)):
        raise MechanismError("labels must be finite numbers")
    if y.size and (y.min() < g[0] or y.max() > g[-1]):
        raise MechanismError(f"labels must lie within the grid range [{g[0]:g}, {g[-1]:g}]")
    j = np.searchsorted(g, y, side="right") - 1
    np.clip(j, 0, g.size - 2, out=j)
    lower = g[j]
    p = (y - lower) / (g[j + 1] - lower)
    np.clip(p, 0.0, 1.0, out=p)
    return j.astype(np.int64), p


def round_to_grid(
    labels: FloatArray,
    grid: FloatArray | list[float],
    *,
    rng: np.random.Generator | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> IntArray:
    """Index into ``grid`` of the unbiased randomized rounding of each label.

    ``E[grid[idx]] = label``; vectorized, in chunks of ``chunk_size`` labels.
    ``rng`` defaults to :func:`~label_party.mechanisms.base.secure_generator`.
    """
    g = check_grid(grid)

    def draw(chunk: FloatArray, r: np.random.Generator) -> IntArray:
        j, p = rounding_probabilities(chunk, g)
        # u ∈ [0, 1): p = 0 never rounds up, p = 1 always does.
        up: IntArray = j + (r.random(chunk.size) < p)
        return up

    out: IntArray = map_chunks(labels, draw, rng=rng, chunk_size=chunk_size, dtype=np.int64)
    return out


def round_to_integers(labels: FloatArray, rng: np.random.Generator) -> FloatArray:
    """Unbiased randomized rounding onto the integers (the grid ℤ): ``⌊y⌋ + 1``
    with probability ``y − ⌊y⌋``, else ``⌊y⌋``; an integer stays put. Labels within
    integer bounds stay within them. One chunk, no checks: the discrete additive
    mechanisms' first step, so that no label's value can make them fail."""
    y = np.asarray(labels, dtype=np.float64)
    lower = np.floor(y)
    rounded: FloatArray = lower + (rng.random(y.size) < (y - lower))
    return rounded


class RoundingMechanism(FiniteMechanism):
    """Randomized rounding as a :class:`FiniteMechanism` (preview only; not private).

    ``matrix`` is the rounding of the declared ``inputs`` (``request.values``);
    :meth:`sample` accepts any label in the grid's range, not only the inputs.
    """

    def sample(
        self,
        labels: FloatArray,
        *,
        rng: np.random.Generator | None = None,
        chunk_size: int = DEFAULT_CHUNK,
    ) -> FloatArray:
        def draw(chunk: FloatArray, g: np.random.Generator) -> FloatArray:
            rounded: FloatArray = self.outputs[round_to_grid(chunk, self.outputs, rng=g)]
            return rounded

        out: FloatArray = map_chunks(labels, draw, rng=rng, chunk_size=chunk_size)
        return out


def _grid_from_params(params: dict[str, Any], lo: float, hi: float) -> FloatArray:
    check_params(params, {"grid", "grid_size"}, "randomized-rounding")
    if ("grid" in params) == ("grid_size" in params):
        raise MechanismError("randomized-rounding needs exactly one of grid or grid_size")
    if "grid_size" in params:
        size = params["grid_size"]
        if isinstance(size, bool) or not isinstance(size, int | np.integer):
            raise MechanismError(f"grid_size must be an integer ≥ 2, got {size!r}")
        if not 2 <= size <= MAX_GRID:
            raise MechanismError(f"grid_size must be between 2 and {MAX_GRID}, got {size}")
        return np.linspace(lo, hi, int(size))
    raw = params["grid"]
    if isinstance(raw, str | bytes) or not hasattr(raw, "__len__"):
        raise MechanismError("grid must be a list of at least two numbers")
    try:
        grid = check_grid(np.asarray(raw, dtype=np.float64))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, MechanismError):
            raise
        raise MechanismError("grid must be a list of at least two numbers") from None
    if grid[0] > lo or grid[-1] < hi:
        raise MechanismError(f"grid must cover the bounds [{lo:g}, {hi:g}]")
    return grid


def from_request(request: FitRequest) -> Mechanism:
    """``randomized-rounding``: inputs ``request.values``, outputs the grid.

    Params: ``grid`` (a strictly increasing list covering ``request.bounds``) or
    ``grid_size`` (an integer ≥ 2: that many evenly spaced points from ``lo`` to
    ``hi``). ``epsilon`` is ``inf``: see the module docstring.
    """
    lo, hi = (float(x) for x in request.bounds)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise MechanismError(f"bounds must be finite with min ≤ max, got [{lo}, {hi}]")
    grid = _grid_from_params(dict(request.params), lo, hi)
    values = np.asarray(request.values, dtype=np.float64)
    j, p = rounding_probabilities(values, grid)
    matrix = np.zeros((values.size, grid.size))
    rows = np.arange(values.size)
    matrix[rows, j] = 1.0 - p
    matrix[rows, j + 1] += p
    return RoundingMechanism(
        "randomized-rounding",
        math.inf,
        values,
        grid,
        matrix,
        params={"grid": grid.tolist(), "private": False},
    )
