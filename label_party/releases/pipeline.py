"""Randomize a dataset's labels into a release file, in chunks of bounded memory.

Regression, finite mechanism (RR-on-bins, unbiased, dbRR): labels are mapped to
the declared grid by unbiased randomized rounding (the identity for labels on the
grid), the prior over the grid is a Laplace histogram at ε₁ when the mechanism
uses one (DESIGN.md §3.2, charged inside the release's ε), the mechanism is
fitted at ε − ε₁ to (grid, noisy prior), and each example's grid row is sampled.
Additive mechanisms (Laplace, staircase, exponential) sample on the raw labels
with the declared (min, max). Classification: ``rr`` by randomized response,
``rr-with-prior`` with a global noisy histogram prior over the classes, or
(:func:`randomize_with_example_priors`) with per-example priors from a prior set
the features party uploaded: noisy per-group histograms over its groups
(``prior_source: "groups"``, ε_p charged once) or its model's probabilities
(``prior_source: "example"``, no ε for the prior).

Two passes over the stored Parquet file: the first rounds labels to grid rows
(kept as int32, 4 bytes per label), the second samples and writes the output
batch by batch. Nothing here touches the database.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from label_party.datasets.domain import ClassificationDomain, RegressionDomain, parse_domain
from label_party.example_priors.service import LoadedPriors
from label_party.exceptions import InvalidRequestError
from label_party.labels.validation import LABELS_SCHEMA
from label_party.mechanisms import rounding
from label_party.mechanisms.base import (
    FiniteMechanism,
    FitTimeLimitError,
    Loss,
    Mechanism,
    MechanismError,
    check_epsilon,
)
from label_party.mechanisms.registry import fit, get_spec, uses_prior
from label_party.priors import (
    IntegerRandom,
    default_prior_epsilon,
    group_histograms,
    laplace_histogram,
)
from label_party.storage import ROW_GROUP, label_batches
from shared.protocol import EPSILON_SCALE, float_below

#: Options no request may set: randomness comes from the OS (DESIGN.md §3.5).
SEED_OPTIONS = frozenset({"seed", "rng", "random_state", "random_seed"})
#: Where an ``rr-with-prior`` release's priors come from (see :func:`prior_source`).
PRIOR_SOURCES = ("global", "groups", "example")


@dataclass(frozen=True)
class ReleasePlan:
    """Everything public a release is configured by."""

    mechanism: str
    params: dict[str, Any]
    loss: Loss
    #: The release's total ε (its prior's ε₁ included), exact.
    epsilon: Decimal
    prior_epsilon: Decimal | None
    domain: RegressionDomain | ClassificationDomain


@dataclass(frozen=True)
class Randomized:
    description: dict[str, Any]
    prior: list[float] | None
    prior_epsilon: Decimal
    num_labels: int


def check_plan(plan: ReleasePlan, task: str) -> None:
    """Refuse what can be refused before any label is read."""
    spec = get_spec(plan.mechanism)
    if SEED_OPTIONS & set(plan.params):
        raise InvalidRequestError("a release cannot choose its randomness (no seed options)")
    if not spec.releasable:
        raise InvalidRequestError(
            f"{plan.mechanism} is not private by itself; it cannot be released"
        )
    if spec.task != task:
        raise InvalidRequestError(
            f"{plan.mechanism} is a {spec.task} mechanism; the dataset is {task}"
        )
    source = prior_source(plan)
    if source == "example":
        if plan.prior_epsilon:
            raise InvalidRequestError(
                "per-example priors cost no ε (post-processing); omit prior_epsilon"
            )
    elif plan.prior_epsilon is not None:
        if not spec.uses_prior and plan.prior_epsilon > 0:
            raise InvalidRequestError(f"{plan.mechanism} does not use a prior; omit prior_epsilon")
        if spec.uses_prior and not 0 < plan.prior_epsilon < plan.epsilon:
            raise InvalidRequestError("prior_epsilon must be > 0 and below epsilon")
        if spec.uses_prior and not reads_prior(plan):
            raise InvalidRequestError(
                f"{plan.mechanism} uses no prior at ε − prior_epsilon = "
                f"{plan.epsilon - plan.prior_epsilon}; omit prior_epsilon"
            )


def reads_prior(plan: ReleasePlan) -> bool:
    """Whether the release spends ε₁ on a prior: at ε − ε₁ when ε₁ is set, else at ε
    (``auto`` above ε = 12 picks a mechanism that reads none: its ε₁ was wasted)."""
    epsilon = plan.epsilon - (plan.prior_epsilon or 0)
    return uses_prior(plan.mechanism, loss=plan.loss, epsilon=float(epsilon))


def preflight(
    plan: ReleasePlan, num_labels: int, *, fit_seconds: float | None = None
) -> ReleasePlan:
    """Fit the mechanism to a uniform prior, before any label is read or any ε is
    reserved: an option it refuses, or a fit that fails whatever the labels, is a
    free refusal here. After the reservation every failure is charged
    (``releases.service``), since a fit to a noisy prior can fail or not with the
    labels. The fit is at the release's own ε₂, so a label-independent failure is
    never charged; ``plan`` is returned with its prior's ε fixed (the default split
    for ``num_labels`` labels in scope, a label-independent count). Results are
    cached: a release repeating a configuration pays for its fit once.

    ``fit_seconds`` (``LABELDP_RELEASE_FIT_SECONDS``) bounds the fit: past it the
    release is refused, free, and nothing is cached (the time depends on the load).
    Unbounded, an unbiased LP of mesh 65,536 ran for more than 12 minutes, and its
    locked fit would then have held SQLite's write lock as long (helper-86)."""
    if num_labels == 0:
        raise InvalidRequestError("the release's scope holds no labelled examples")
    if prior_source(plan) == "example":
        return plan  # fitted per example to the prior set's rows: checked with them
    if prior_source(plan) == "global" and reads_prior(plan):
        plan = replace(plan, prior_epsilon=prior_split(plan, plan.domain.grid().size, num_labels))
    epsilon = plan.epsilon - (plan.prior_epsilon or 0)
    params = {k: v for k, v in plan.params.items() if k not in ("prior_source", "prior_id")}
    try:
        problem = _uniform_fit_problem(
            plan.mechanism,
            json.dumps(params, sort_keys=True, default=str),
            str(epsilon),
            plan.domain.model_dump_json(),
            plan.loss,
            fit_seconds,
        )
    except FitTimeLimitError:
        raise InvalidRequestError(
            f"fitting {plan.mechanism} on this domain takes longer than {fit_seconds:g} s "
            "(LABELDP_RELEASE_FIT_SECONDS): choose a coarser mesh or another mechanism"
        ) from None
    if problem is not None:
        raise InvalidRequestError(problem)
    return plan


def prior_split(plan: ReleasePlan, num_values: int, num_labels: int) -> Decimal:
    """The prior's ε: the request's, or min(√(k/n), ε/2) rounded down to the
    ledger's unit, so that ε₁ + ε₂ = ε exactly in Decimal."""
    if plan.prior_epsilon is not None:
        prior_eps = plan.prior_epsilon
    else:
        split = default_prior_epsilon(
            num_values=num_values, num_labels=num_labels, epsilon=float(plan.epsilon)
        )
        prior_eps = Decimal(math.floor(split * EPSILON_SCALE)) / EPSILON_SCALE
    if not 0 < prior_eps < plan.epsilon:
        raise InvalidRequestError("the prior's ε must be > 0 and below the release's ε")
    return prior_eps


def _parse_domain_json(text: str) -> RegressionDomain | ClassificationDomain:
    raw = json.loads(text)
    return parse_domain(str(raw["kind"]), raw)


@functools.lru_cache(maxsize=256)
def _uniform_fit_problem(
    mechanism: str, params: str, epsilon: str, domain: str, loss: Loss, seconds: float | None
) -> str | None:
    """Why ``mechanism`` cannot be fitted to a uniform prior, or ``None``;
    :class:`FitTimeLimitError` (not cached) past ``seconds``."""
    parsed = _parse_domain_json(domain)
    grid = parsed.grid()
    bounds = (parsed.min, parsed.max) if isinstance(parsed, RegressionDomain) else None
    try:
        mech = fit(
            mechanism,
            epsilon=float_below(Decimal(epsilon)),
            values=grid,
            prior=np.full(grid.size, 1.0 / grid.size),
            loss=loss,
            domain=bounds,
            params=json.loads(params),
            deadline=None if seconds is None else time.monotonic() + seconds,
        )
    except FitTimeLimitError:
        raise
    except MechanismError as exc:
        return str(exc)
    try:
        # Every grid value once: a sampler that fails whatever the labels (it did,
        # for the staircase at ε ≳ 37) is refused here, before ε is reserved. The
        # draws are discarded; no seed is fixed outside tests (DESIGN.md §3.5).
        mech.sample(grid, rng=np.random.default_rng())
    except MechanismError as exc:
        return str(exc)  # it says why (a coin: "raise ε")
    except Exception as exc:
        return f"{mechanism} cannot sample at this ε on this domain ({type(exc).__name__})"
    return None


def prior_source(plan: ReleasePlan) -> str:
    """The plan's ``prior_source`` (``global`` by default), its options checked.

    ``groups`` and ``example`` are for ``rr-with-prior`` only and need ``prior_id``
    (a prior set of kind ``groups`` / ``probabilities``) and no other option.
    """
    source = plan.params.get("prior_source", "global")
    if source not in PRIOR_SOURCES:
        raise InvalidRequestError(f"prior_source must be one of {', '.join(PRIOR_SOURCES)}")
    if source == "global":
        if "prior_id" in plan.params:
            raise InvalidRequestError("prior_id needs prior_source 'groups' or 'example'")
        return "global"
    if plan.mechanism != "rr-with-prior":
        raise InvalidRequestError(f"prior_source {source!r} is for rr-with-prior only")
    prior_id = plan.params.get("prior_id")
    if not isinstance(prior_id, str) or not prior_id:
        raise InvalidRequestError(f"prior_source {source!r} needs a prior_id")
    extra = sorted(set(plan.params) - {"prior_source", "prior_id"})
    if extra:
        raise InvalidRequestError(
            f"rr-with-prior with prior_source {source!r} takes no other option: {extra}"
        )
    return str(source)


def _batches(
    labels_file: Path, selected: pa.Array | None, batch_size: int
) -> Iterator[tuple[pa.Array, np.ndarray]]:
    for batch in label_batches(labels_file, batch_size):  # in example_id order
        ids, values = batch.column(0), batch.column(1)
        if selected is not None:
            mask = pc.is_in(ids, value_set=selected)
            ids, values = ids.filter(mask), values.filter(mask)
        yield ids, values.to_numpy(zero_copy_only=False)


def randomize(
    plan: ReleasePlan,
    *,
    labels_file: Path,
    out_file: Path,
    selected: pa.Array | None,
    rng: np.random.Generator,
    prior_rng: IntegerRandom | None,
    chunk_size: int,
) -> Randomized:
    """Write the release to ``out_file``; describe the mechanism that made it.

    ``rng`` drives rounding and sampling; ``prior_rng`` the exact integer sampler of
    the prior's noise (``None``: the OS).
    """
    spec = get_spec(plan.mechanism)
    grid = plan.domain.grid()
    k = grid.size
    regression = isinstance(plan.domain, RegressionDomain)

    # Pass 1: grid row of every selected label (finite mechanisms only).
    rows: np.ndarray | None = None
    n = 0
    if spec.finite:
        parts = []
        for _ids, values in _batches(labels_file, selected, chunk_size):
            idx = rounding.round_to_grid(values, grid, rng=rng) if regression else values
            parts.append(np.asarray(idx).astype(np.int32))
        rows = np.concatenate(parts) if parts else np.empty(0, np.int32)
        n = rows.size
    else:
        n = sum(len(ids) for ids, _v in _batches(labels_file, selected, chunk_size))
    if n == 0:
        raise InvalidRequestError("the release's scope holds no labelled examples")

    prior_eps = Decimal(0)
    prior: np.ndarray = np.full(k, 1.0 / k)
    with_prior = reads_prior(plan)
    if with_prior:
        assert rows is not None
        prior_eps = prior_split(plan, k, n)
        prior = np.asarray(laplace_histogram(rows, k, epsilon=prior_eps, rng=prior_rng), np.float64)

    bounds = (
        (plan.domain.min, plan.domain.max) if isinstance(plan.domain, RegressionDomain) else None
    )
    mech = fit(
        plan.mechanism,
        epsilon=float_below(plan.epsilon - prior_eps),
        values=grid,
        prior=prior,
        loss=plan.loss,
        domain=bounds,
        params={k_: v for k_, v in plan.params.items() if k_ not in ("prior_source", "prior_id")},
    )
    if not np.isfinite(mech.epsilon):
        raise MechanismError(f"{plan.mechanism} is not private by itself")

    # Pass 2: sample and write, batch by batch.
    row_of_grid = mech.input_index(grid) if isinstance(mech, FiniteMechanism) else None
    written = 0
    with pq.ParquetWriter(out_file, LABELS_SCHEMA, compression="snappy") as writer:
        for ids, values in _batches(labels_file, selected, chunk_size):
            noisy = _sample(plan, mech, values, rows, row_of_grid, written, rng, chunk_size)
            written += len(ids)
            writer.write_table(
                pa.table({"example_id": ids, "label": pa.array(noisy, pa.float64())}),
                row_group_size=ROW_GROUP,
            )
    description = mech.describe()
    return Randomized(
        description=description,
        prior=prior.tolist() if with_prior else None,
        prior_epsilon=prior_eps,
        num_labels=n,
    )


def _sample(
    plan: ReleasePlan,
    mech: Mechanism,
    values: np.ndarray,
    rows: np.ndarray | None,
    row_of_grid: np.ndarray | None,
    offset: int,
    rng: np.random.Generator,
    chunk_size: int,
) -> np.ndarray:
    if isinstance(mech, FiniteMechanism):
        assert rows is not None and row_of_grid is not None
        chunk_rows = row_of_grid[rows[offset : offset + values.size]]
        cols = mech.sample_indices(chunk_rows, rng=rng, chunk_size=chunk_size)
        result: np.ndarray = mech.outputs[cols]
        return result
    return np.asarray(mech.sample(values, rng=rng, chunk_size=chunk_size), np.float64)


#: Example ids listed when a release's scope has examples without a prior.
MAX_LISTED = 100


def randomize_with_example_priors(
    plan: ReleasePlan,
    priors: LoadedPriors,
    *,
    labels_file: Path,
    out_file: Path,
    selected: pa.Array | None,
    rng: np.random.Generator,
    prior_rng: IntegerRandom | None,
    chunk_size: int,
) -> Randomized:
    """``rr-with-prior`` with a prior per example, from a prior set.

    ``groups``: every example in scope must have a group (else 422, nothing
    written). The G×K counts (G = all groups of the set, a label-independent
    number) get DLap(2/ε_p) noise once — ε_p = ``prior_epsilon`` or
    min(√(G·K/n), ε/2) — and each example's prior is its group's noisy
    histogram (Algorithm 4 of the supplement); RRTop-k runs at ε − ε_p.
    ``probabilities``: each example's prior is its row (post-processing: ε_p = 0,
    RRTop-k at ε). Sampling is :func:`rr_with_prior_sample`, batch by batch.
    """
    assert isinstance(plan.domain, ClassificationDomain)
    k = plan.domain.size
    labels, rows = _labels_and_prior_rows(priors, labels_file, selected, chunk_size)
    if labels.size == 0:
        raise InvalidRequestError("the release's scope holds no labelled examples")
    prior_eps = Decimal(0)
    if priors.kind == "groups":
        assert priors.group_names is not None
        prior_eps = prior_split(plan, k * len(priors.group_names), labels.size)
    epsilon = float_below(plan.epsilon - prior_eps)
    check_epsilon(epsilon)
    scope = _ScopePriors(priors, rows, epsilon)
    if priors.kind == "groups":
        scope.add_noisy_group_histograms(labels, k, prior_eps, prior_rng)
    batches = (ids for ids, _values in _batches(labels_file, selected, chunk_size))
    k_star_counts = _write_with_priors(out_file, batches, labels, scope, rng, chunk_size)
    params = {
        "num_classes": k,
        "prior_source": "groups" if priors.kind == "groups" else "example",
        "prior_id": priors.prior_id,
        "prior_sha256": priors.sha256,
        **scope.public_groups(),
        "k_star_counts": {str(j): int(c) for j, c in enumerate(k_star_counts.tolist()) if j and c},
    }
    classes = plan.domain.grid().tolist()
    description = {
        "name": "rr-with-prior",
        "epsilon": epsilon,
        "params": params,
        "inputs": classes,
        "outputs": classes,
        "matrix": None,
    }
    return Randomized(
        description=description, prior=None, prior_epsilon=prior_eps, num_labels=labels.size
    )


def _labels_and_prior_rows(
    priors: LoadedPriors, labels_file: Path, selected: pa.Array | None, chunk_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each in-scope example's class index and its row of the prior set, matched in one
    hash join (one hash table over the prior set, not one per batch). An example with
    no prior is a 422 that names up to ``MAX_LISTED`` of them (ids only)."""
    labels_parts: list[np.ndarray] = []
    id_parts: list[pa.Array] = []
    for ids, values in _batches(labels_file, selected, chunk_size):
        id_parts.append(ids)
        labels_parts.append(np.asarray(values).astype(np.int64))
    labels = np.concatenate(labels_parts) if labels_parts else np.empty(0, np.int64)
    del labels_parts
    scope_ids = pa.chunked_array(id_parts, pa.string())
    del id_parts
    pos = pc.index_in(scope_ids, value_set=priors.ids)
    if pos.null_count:
        missing = scope_ids.filter(pc.is_null(pos))
        raise InvalidRequestError(
            f"{len(missing)} example(s) in the release's scope have no "
            f"{'group' if priors.kind == 'groups' else 'prior'} in prior set "
            f"{priors.prior_id}; nothing was spent",
            {"missing": len(missing), "example_ids": missing.slice(0, MAX_LISTED).to_pylist()},
        )
    return labels, pos.to_numpy().astype(np.int64, copy=False)


@dataclass
class _ScopePriors:
    """The prior of each example in a release's scope, by its position there: its
    row of the prior set (``probabilities``), or its group's noisy histogram; and
    the size k* of its RRTop-k set at ``epsilon``."""

    priors: LoadedPriors
    rows: np.ndarray  # each in-scope example's row of the prior set
    epsilon: float  # RRTop-k's
    group_of: np.ndarray | None = None  # groups: each in-scope example's group
    group_priors: np.ndarray | None = None  # groups: the G×K noisy histograms
    group_k: np.ndarray | None = None  # groups: k* of each group
    group_order: np.ndarray | None = None  # groups: classes by noisy count, per group

    def add_noisy_group_histograms(
        self, labels: np.ndarray, k: int, epsilon: Decimal, rng: IntegerRandom | None
    ) -> None:
        """The groups' label histograms with DLap(2/ε) noise (the release's ε_p)
        and their RRTop-k sets."""
        from label_party.mechanisms.classification import top_k_sets

        assert self.priors.group_of_row is not None and self.priors.group_names is not None
        self.group_of = self.priors.group_of_row[self.rows]
        num_groups = len(self.priors.group_names)
        _ids, self.group_priors = group_histograms(
            labels, self.group_of, k, epsilon=epsilon, num_groups=num_groups, rng=rng
        )
        self.group_k, self.group_order = top_k_sets(self.group_priors, epsilon=self.epsilon)

    def block(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The priors of the scope's examples ``start:stop`` (a batch) and their k*."""
        from label_party.mechanisms.classification import top_k_sets

        if self.group_of is not None:
            assert self.group_priors is not None and self.group_k is not None
            groups = self.group_of[start:stop]
            return self.group_priors[groups], self.group_k[groups]
        assert self.priors.probabilities is not None
        block: np.ndarray = self.priors.probabilities[self.rows[start:stop]]
        return block, top_k_sets(block, epsilon=self.epsilon)[0]

    def public_groups(self) -> dict[str, Any]:
        """For groups, what the manifest says of them: the noisy histograms and their
        RRTop-k sets, public once released (post-processing)."""
        if self.group_k is None or self.group_order is None or self.group_priors is None:
            return {}
        k, order = self.group_k, self.group_order
        return {
            "groups": self.priors.group_names,
            "group_priors": self.group_priors.tolist(),
            "group_k_star": k.tolist(),
            "group_top_k": [order[g, : int(k[g])].tolist() for g in range(k.size)],
        }


def _write_with_priors(
    out_file: Path,
    batches: Iterator[pa.Array],
    labels: np.ndarray,
    scope: _ScopePriors,
    rng: np.random.Generator,
    chunk_size: int,
) -> np.ndarray:
    """Sample and write the release batch by batch (one batch of priors in memory);
    how many examples had each RRTop-k size k* (a function of the priors only)."""
    from label_party.mechanisms.classification import rr_with_prior_sample

    k_star_counts: np.ndarray = np.zeros(0, dtype=np.int64)
    written = 0
    with pq.ParquetWriter(out_file, LABELS_SCHEMA, compression="snappy") as writer:
        for ids in batches:
            stop = written + len(ids)
            block, k_star = scope.block(written, stop)
            noisy = rr_with_prior_sample(
                labels[written:stop], block, epsilon=scope.epsilon, rng=rng, chunk_size=chunk_size
            )
            counts = np.bincount(k_star, minlength=block.shape[1] + 1)
            k_star_counts = counts if k_star_counts.size == 0 else k_star_counts + counts
            written = stop
            writer.write_table(
                pa.table({"example_id": ids, "label": pa.array(noisy, pa.float64())}),
                row_group_size=ROW_GROUP,
            )
    return k_star_counts
