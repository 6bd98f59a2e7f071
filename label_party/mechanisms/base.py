"""The contract every label mechanism fulfils, and the pieces they all share.

A mechanism is configured by public parameters, fitted to a (private, already
noisy) prior and an ε, and then samples noisy labels (DESIGN.md §4). Two shapes:

* :class:`FiniteMechanism` — a transition matrix ``M[y, o]`` from a finite,
  sorted set of input values to a finite set of outputs. Its privacy is checkable
  entry by entry: ``M[y', o] ≤ e^ε · M[y, o]`` for all ``y, y', o``.
* :class:`ContinuousMechanism` — additive noise with a density; the loss and bias
  are computed analytically.

Neighbouring relation throughout: two datasets differ in the label of one example
(feature-oblivious label DP, Definition 3 of ``rr-on-bins-regression.txt``).

Everything here is pure: numpy in, numpy out, no I/O.
"""

from __future__ import annotations

import math
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal, localcontext
from functools import cached_property, lru_cache
from typing import Any, Literal, get_args

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

Loss = Literal["squared", "absolute", "poisson", "zero-one"]
LOSSES: tuple[str, ...] = get_args(Loss)

#: Labels are randomized in chunks of this many rows so that working memory stays
#: bounded whatever the number of labels.
DEFAULT_CHUNK = 1 << 17


class MechanismError(ValueError):
    """A mechanism was asked for something its parameters do not allow."""


class FitTimeLimitError(MechanismError):
    """A fit that can take long (the unbiased LP) ran past its request's deadline."""


def check_params(params: Mapping[str, Any], allowed: Collection[str], mechanism: str) -> None:
    """Refuse parameters ``mechanism`` does not take, naming the ones it does."""
    unknown = sorted(set(map(str, params)) - set(allowed))
    if unknown:
        known = ", ".join(sorted(allowed)) or "none"
        raise MechanismError(
            f"unknown parameter(s) {', '.join(unknown)} for {mechanism}; allowed: {known}"
        )


def map_chunks(
    labels: FloatArray,
    draw: Callable[[FloatArray, np.random.Generator], NDArray[Any]],
    *,
    rng: np.random.Generator | None,
    chunk_size: int,
    dtype: type[np.generic] = np.float64,
) -> NDArray[Any]:
    """``draw(chunk, rng)`` over ``labels`` chunk by chunk, into one output array.

    The one place where samplers get bounded working memory (a chunk at a time)
    and their default generator from the OS (:func:`secure_generator`).
    """
    if chunk_size < 1:
        raise MechanismError(f"chunk_size must be ≥ 1, got {chunk_size}")
    rng = rng or secure_generator()
    flat = np.asarray(labels, dtype=np.float64).ravel()
    out = np.empty(flat.size, dtype=dtype)
    for start in range(0, flat.size, chunk_size):
        chunk = flat[start : start + chunk_size]
        out[start : start + chunk.size] = draw(chunk, rng)
    return out


def secure_generator() -> np.random.Generator:
    """A generator seeded with 128 fresh bits from the OS (DESIGN.md §3.5).

    Release code must use this; only tests pass their own generator.
    """
    return np.random.default_rng(secrets.randbits(128))


#: A finite mechanism draws integers below 2⁶²: its law is an integer table over them.
TABLE_BITS = 62
TABLE_QUANTA = 1 << TABLE_BITS
#: A mechanism's coins draw the same integers: a probability is realized as a whole
#: number of 2⁻⁶² quanta, never as a float comparison with rounding in between.
#: 2⁶², not a float's 2⁵³: at ε = 10⁻¹² (the ledger's unit) and K = 10⁵ classes the
#: counts that keep both ratios of a coin within e^ε span about 92 quanta of 2⁻⁶²,
#: and none of 2⁻⁵³ (:func:`rare_draws`).
COIN_QUANTA = TABLE_QUANTA


@lru_cache(maxsize=4096)
def rare_draws(rare: int, common: int, epsilon: float) -> int:
    """How many of the 2⁶² draws of a coin go to its rare side: ``rare`` outcomes of
    weight 1 against ``common`` of weight e^ε (randomized response: the label kept
    against its ``rare`` others; a staircase's high step against its low one).

    The least count whose realized law is within e^ε both ways, decided in integers
    against :func:`exp_lower_bound`: at least the exact ``rare/(rare + e^ε·common)``,
    never a float of it rounded (a float coin realized ``1/(1 + e^{−40})`` as 1.0,
    no flip at all; even ⌈fl(p)·2⁵³⌉ fell a quantum short of p at ε = 0.1). Rounded
    up, the rare side moves toward chance, and at a tiny ε past it: a rare outcome
    (one other class) must stay within e^ε of a common one (the label kept) too.
    :class:`MechanismError` if no count does (a release's preflight samples once,
    so that is a free refusal)."""
    bound = exp_lower_bound(epsilon)
    numerator = COIN_QUANTA * rare * (1 << 64)
    draws = -(-numerator // (rare * (1 << 64) + bound * common))
    if draws * common * (1 << 64) > bound * (COIN_QUANTA - draws) * rare:
        raise MechanismError(
            f"at ε = {epsilon:g} a coin of {rare} outcomes against {common} cannot be "
            "realized within e^ε in 2⁶² draws: raise ε"
        )
    return draws


def flip_coins(rng: np.random.Generator, draws: int | IntArray, size: int) -> BoolArray:
    """``size`` coins, True for the rare side: a uniform integer below 2⁶² under
    ``draws`` (:func:`rare_draws`; one count, or one a coin)."""
    coins: BoolArray = rng.integers(0, COIN_QUANTA, size=size, dtype=np.int64) < draws
    return coins


def exp_lower_bound(epsilon: float) -> int:
    """An integer at most ``e^min(ε, 40)·2⁶⁴``: e^ε from below, exactly (a 50-digit
    exponential, floored, less one). Past 40 no coin or table here comes near it."""
    return _exp_lower_bound(min(float(epsilon), 40.0))


@lru_cache(maxsize=4096)
def _exp_lower_bound(epsilon: float) -> int:
    with localcontext() as context:
        context.prec = 50
        exact = Decimal(epsilon).exp() * (1 << 64)
    return int(exact.to_integral_value(rounding=ROUND_FLOOR)) - 1


def check_epsilon(epsilon: float) -> float:
    """Return ``epsilon`` as a float if it is a finite positive number."""
    eps = float(epsilon)
    if not math.isfinite(eps) or eps <= 0:
        raise MechanismError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    return eps


def pointwise_loss(prediction: FloatArray, label: FloatArray, loss: Loss) -> FloatArray:
    """ℓ(ŷ, y) elementwise, broadcasting.

    squared ``(ŷ − y)²`` (no ½, the papers' "MSE (Mechanism)"); absolute ``|ŷ − y|``;
    Poisson ``ŷ − y·log ŷ`` (the negative log-likelihood up to a term in y only);
    a non-positive ŷ has infinite Poisson loss; zero-one ``1[ŷ ≠ y]`` for classes.
    """
    if loss == "squared":
        return np.square(prediction - label)
    if loss == "absolute":
        return np.abs(prediction - label)
    if loss == "poisson":
        with np.errstate(divide="ignore", invalid="ignore"):
            log_pred = np.where(
                prediction > 0, np.log(np.where(prediction > 0, prediction, 1.0)), -np.inf
            )
            out = prediction - label * log_pred
        # 0·log(0) is 0: a zero label pays only ŷ.
        return np.where(label == 0, prediction, out)
    if loss == "zero-one":
        return np.not_equal(prediction, label).astype(np.float64)
    raise MechanismError(f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}")


def validate_prior(values: FloatArray, prior: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Check a (values, prior) pair: strictly increasing finite values, a probability vector."""
    v = np.asarray(values, dtype=np.float64)
    p = np.asarray(prior, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise MechanismError("values must be a non-empty list of numbers")
    if p.shape != v.shape:
        raise MechanismError(f"prior has {p.size} entries but there are {v.size} values")
    if not np.all(np.isfinite(v)):
        raise MechanismError("values must be finite numbers")
    if np.any(np.diff(v) <= 0):
        raise MechanismError("values must be sorted in increasing order without duplicates")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise MechanismError("prior entries must be finite and non-negative")
    if abs(float(p.sum()) - 1.0) > 1e-9:
        raise MechanismError(f"prior must sum to one (within 1e-9), it sums to {p.sum():.12g}")
    return v, p


@dataclass(frozen=True)
class FitRequest:
    """Everything a mechanism may be fitted to.

    ``values`` is the declared label grid (sorted); ``prior`` a probability vector
    over it that is already ε₁-DP (or public). For ``rr-with-prior`` the prior is
    the per-example prior over class indices. ``domain`` is the declared label range
    (defaults to the ends of ``values``); ``params`` the mechanism's own options.
    ``deadline`` (a ``time.monotonic()`` instant) bounds the fits that can take long
    (:class:`FitTimeLimitError` past it); None: no bound.
    """

    epsilon: float
    values: FloatArray
    prior: FloatArray
    loss: Loss = "squared"
    domain: tuple[float, float] | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    deadline: float | None = None

    @property
    def bounds(self) -> tuple[float, float]:
        if self.domain is not None:
            return self.domain
        return float(self.values[0]), float(self.values[-1])


class Mechanism(ABC):
    """What a release needs from any mechanism."""

    name: str
    epsilon: float

    @abstractmethod
    def sample(
        self,
        labels: FloatArray,
        *,
        rng: np.random.Generator | None = None,
        chunk_size: int = DEFAULT_CHUNK,
    ) -> FloatArray:
        """Noisy labels for ``labels``, drawn independently per label."""

    @abstractmethod
    def noisy_label_loss(self, values: FloatArray, prior: FloatArray, loss: Loss) -> float:
        """E[ℓ(M(y), y)] with y drawn from ``prior`` over ``values``."""

    @abstractmethod
    def bias(self, values: FloatArray) -> FloatArray:
        """E[M(y)] − y for each of ``values``."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Public description: enough for the features party to post-process."""


#: The largest transition matrix a description (a release's manifest) carries:
#: about 5 MB of JSON. Past it the matrix is null; inputs, outputs and parameters stay.
DESCRIBED_MATRIX_MAX_ENTRIES = 250_000


#: Uniform mass mixed into each entry of a sampled matrix: the first tried, doubled
#: until the table passes the exact ε check, while the mixed-in mass stays below
#: ``MIXING_MOST`` (at a tiny ε the check's slack, γ(e^ε − 1)·2⁶², needs a larger γ).
MIXING_FIRST, MIXING_MOST = 2.0**-50, 1e-3


def sampling_table(matrix: FloatArray, epsilon: float) -> IntArray:
    """Integer counts ``C``, rows summing to 2⁶², whose law ``C/2⁶²`` the sampler
    realizes exactly, each column within ``e^ε`` (checked exactly).

    ``M`` itself does not quantize within ε: an LP leaves columns of 10⁻¹⁵, whole
    numbers of draws whose ratio is not M's (at ε = 2 one came out 7.97, not
    e² = 7.39), and at ε ≳ 37 an entry e^{−ε} is no draw at all, an output no
    draw reaches from some label. Mixing in γ per entry, ``(1 − mγ)M + γ`` — a
    convex combination with a law that ignores the label, so no less private —
    lifts every entry to 2¹² quanta at least and pulls each column strictly inside
    e^ε. The smallest γ from 2⁻⁵⁰ that passes is used: at ε ≥ 0.1 it moves an entry
    by under 10⁻¹², and the mechanism's analysis (loss, bias) stays that of ``M``."""
    m = matrix.shape[1]
    gamma = MIXING_FIRST
    while m * gamma < MIXING_MOST:
        counts = _quantized((1.0 - m * gamma) * matrix + gamma)
        if _within(counts, epsilon):
            return counts
        gamma *= 2
    raise MechanismError("the mechanism's matrix cannot be sampled within its ε")


def _bucket_bits(m: int) -> int:
    """log₂ of a finite sampler's guide buckets per row: a power of two ≥ m."""
    return max(1, (m - 1).bit_length())


def _quantized(law: FloatArray) -> IntArray:
    """``law`` in whole quanta of 2⁻⁶², each row summing to 2⁶² exactly (its
    rounding remainder, under m quanta, goes to its largest entry)."""
    counts = np.floor(law * TABLE_QUANTA).astype(np.int64)
    rest = TABLE_QUANTA - counts.sum(axis=1)
    counts[np.arange(law.shape[0]), law.argmax(axis=1)] += rest
    return counts


def _within(counts: IntArray, epsilon: float) -> bool:
    """Whether each column's largest count is at most e^ε times its smallest, in
    integers against :func:`exp_lower_bound` (no table of mixed entries has a
    ratio near e⁴⁰: 2⁶²/2¹² = 2⁵⁰)."""
    bound = exp_lower_bound(epsilon)
    high = counts.max(axis=0).astype(object) * (1 << 64)
    low = counts.min(axis=0).astype(object) * bound
    return bool(np.all(high <= low))


@dataclass(frozen=True, eq=False)
class FiniteMechanism(Mechanism):
    """A mechanism given by its transition matrix.

    ``matrix[i, j]`` is the probability of output ``outputs[j]`` when the label is
    ``inputs[i]``. Sampling uses one ``searchsorted`` over the row-offset CDFs, so
    a chunk of labels is randomized with no Python loop over labels or rows.
    """

    name: str
    epsilon: float
    inputs: FloatArray
    outputs: FloatArray
    matrix: FloatArray
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        k, m = self.matrix.shape
        if self.inputs.shape != (k,) or self.outputs.shape != (m,):
            raise MechanismError("matrix shape does not match inputs and outputs")

    # -- analysis ---------------------------------------------------------------

    def dp_ratio(self) -> float:
        """max over o of max_y M[y, o] / min_y M[y, o]; ε-DP iff ≤ e^ε."""
        col_max = self.matrix.max(axis=0)
        col_min = self.matrix.min(axis=0)
        used = col_max > 0
        if np.any(col_min[used] <= 0):
            return math.inf
        return float(np.max(col_max[used] / col_min[used]))

    def noisy_label_loss(self, values: FloatArray, prior: FloatArray, loss: Loss) -> float:
        idx = self.input_index(np.asarray(values, dtype=np.float64))
        rows = self.matrix[idx]
        cost = pointwise_loss(self.outputs[None, :], self.inputs[idx][:, None], loss)
        with np.errstate(invalid="ignore"):
            per_value = np.where(rows > 0, rows * cost, 0.0).sum(axis=1)
        weights = np.asarray(prior, dtype=np.float64)
        used = weights > 0  # a zero-probability value may have infinite loss: 0·∞ is 0 here
        return float(np.dot(weights[used], per_value[used]))

    def bias(self, values: FloatArray | None = None) -> FloatArray:
        idx = (
            np.arange(self.inputs.size)
            if values is None
            else self.input_index(np.asarray(values, dtype=np.float64))
        )
        result: FloatArray = self.matrix[idx] @ self.outputs - self.inputs[idx]
        return result

    def describe(self) -> dict[str, Any]:
        """Name, ε, parameters, inputs and outputs; the matrix too, up to
        ``DESCRIBED_MATRIX_MAX_ENTRIES`` entries (every release's manifest carries
        this: 2001 values made 84 MB of JSON per release)."""
        small = self.matrix.size <= DESCRIBED_MATRIX_MAX_ENTRIES
        return {
            "name": self.name,
            "epsilon": self.epsilon,
            "params": self.params,
            "inputs": self.inputs.tolist(),
            "outputs": self.outputs.tolist(),
            "matrix": self.matrix.tolist() if small else None,
        }

    # -- sampling ---------------------------------------------------------------

    def input_index(self, labels: FloatArray) -> IntArray:
        """Row of each label in ``inputs``; every label must be one of them exactly."""
        labels = np.asarray(labels, dtype=np.float64)
        step = self._grid_step
        idx: IntArray
        if step is not None:
            # Evenly spaced inputs (the usual declared grid): arithmetic, no search.
            idx = np.rint((labels - self.inputs[0]) / step).astype(np.int64)
        else:
            idx = np.searchsorted(self.inputs, labels).astype(np.int64)
        np.clip(idx, 0, self.inputs.size - 1, out=idx)
        if not np.array_equal(self.inputs[idx], labels):
            raise MechanismError("labels must be values of the mechanism's input set")
        return idx

    @cached_property
    def _grid_step(self) -> float | None:
        if self.inputs.size < 2:
            return None
        gaps = np.diff(self.inputs)
        step = float(gaps[0])
        return step if np.allclose(gaps, step, rtol=1e-12, atol=0.0) else None

    @cached_property
    def _sampling_tables(self) -> tuple[IntArray, IntArray]:
        """Row-offset cumulative counts of :func:`sampling_table` (flattened) and a
        guide table for indexed inverse-CDF search.

        ``guide[r, g]`` is the first column whose cumulative count exceeds ``g·2^s``
        (``2^{62−s}`` buckets, at least m), so a draw u starts its search at
        ``guide[r, u >> s]`` and moves right about one step on average (Chen &
        Asau's guide-table method): O(1) per label, exact.
        """
        counts = sampling_table(self.matrix, self.epsilon)
        k, m = counts.shape
        cumulative = np.cumsum(counts, axis=1)
        bits = _bucket_bits(m)
        marks = np.arange(1 << bits, dtype=np.int64) << (TABLE_BITS - bits)
        guide = np.empty((k, 1 << bits), dtype=np.int64)
        for r in range(k):  # k searches of the marks each: table set-up only.
            guide[r] = np.searchsorted(cumulative[r], marks, side="right")
        np.minimum(guide, m - 1, out=guide)
        return cumulative.ravel(), guide.ravel()

    def sample_indices(
        self,
        rows: IntArray,
        *,
        rng: np.random.Generator | None = None,
        chunk_size: int = DEFAULT_CHUNK,
    ) -> IntArray:
        """Output column for each input row index, in chunks of ``chunk_size``: the
        first whose cumulative count exceeds a uniform integer draw below 2⁶²."""
        rng = rng or secure_generator()
        rows = np.asarray(rows, dtype=np.int64)
        cumulative, guide = self._sampling_tables
        m = self.outputs.size
        bits = _bucket_bits(m)
        out = np.empty(rows.size, dtype=np.int64)
        for start in range(0, rows.size, chunk_size):
            r = rows[start : start + chunk_size]
            u = rng.integers(0, TABLE_QUANTA, size=r.size, dtype=np.int64)
            base = r * m
            col = guide[(r << bits) + (u >> (TABLE_BITS - bits))]
            active = np.flatnonzero(cumulative[base + col] <= u)
            while active.size:
                col[active] += 1
                active = active[cumulative[base[active] + col[active]] <= u[active]]
            out[start : start + r.size] = col
        return out

    def sample(
        self,
        labels: FloatArray,
        *,
        rng: np.random.Generator | None = None,
        chunk_size: int = DEFAULT_CHUNK,
    ) -> FloatArray:
        def draw(chunk: FloatArray, g: np.random.Generator) -> FloatArray:
            cols = self.sample_indices(self.input_index(chunk), rng=g, chunk_size=chunk_size)
            values: FloatArray = self.outputs[cols]
            return values

        result: FloatArray = map_chunks(labels, draw, rng=rng, chunk_size=chunk_size)
        return result


class ContinuousMechanism(Mechanism):
    """Additive-noise mechanisms: ``describe()`` carries the noise parameters."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon, "params": self.params()}

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The public noise parameters."""
