"""Private label priors: discrete-Laplace histograms, global or per group.

Mechanism (``rr-on-bins-regression.txt``, Appendix C.1, Algorithm 4, with the
discrete Laplace of Definition 22 as in Algorithm 4 of
``rr-with-prior-lp-mst-supplementary.txt``): count the labels in each of the K
declared bins, add independent DLap(2/ε₁) noise to every count, clip at zero and
normalize. If every noisy count clips to zero the prior is uniform.

Neighbouring relation: two datasets differ in the label of one example (label
substitution, DESIGN.md §3). Replacing one label y by y' removes one from count y
and adds one to count y', so the count vector has L1 sensitivity 2 and DLap(2/ε₁)
noise makes the noisy counts ε₁-DP; clipping and normalizing are
post-processing. A release that uses the prior spends ε₁ on every example that
was counted, on top of the ε₂ of the randomizer (basic composition, Theorem 6 of
``rr-on-bins-regression.txt``).

Per-group priors (LP-MST / SSL priors, Algorithm 4 of the supplement): the groups
are a partition chosen from features only, so group membership is public. The
substituted example is in exactly one group, so the G×K count matrix changes in
two cells of one row: its L1 sensitivity is still 2 and DLap(2/ε₁) on each of the
G·K cells makes the whole matrix ε₁-DP (parallel composition over disjoint groups:
one ε₁ for all groups, not G·ε₁).

The label domain (K bins, the set of groups) is declared configuration, never
computed from the labels (DESIGN.md §3.2).
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np

from label_party.mechanisms.base import FloatArray, IntArray, MechanismError, check_epsilon
from label_party.priors.discrete_laplace import IntegerRandom, sample_discrete_laplace

__all__ = [
    "Epsilon",
    "default_prior_epsilon",
    "group_counts",
    "group_histograms",
    "label_counts",
    "laplace_histogram",
    "noise_scale",
]


#: An ε as the ledger or a caller holds it; each converts to a Fraction exactly.
Epsilon = float | int | Decimal | Fraction


def noise_scale(epsilon: Epsilon) -> Fraction:
    """The exact DLap scale 2/ε for the histogram (L1 sensitivity 2 under substitution).

    ε converts to a Fraction exactly (a float as its binary value, a ledger
    ``Decimal`` as its decimal value), so the noise is exactly DLap(2/ε) for the ε
    that is charged.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, float | int | Decimal | Fraction):
        raise MechanismError(f"epsilon must be a number, got {type(epsilon).__name__}")
    try:
        eps = Fraction(epsilon)
    except (ValueError, OverflowError):
        raise MechanismError(f"epsilon must be a finite number > 0, got {epsilon!r}") from None
    if eps <= 0:
        raise MechanismError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    return Fraction(2) / eps


def _check_positive_int(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise MechanismError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _check_indices(indices: IntArray, num_bins: int, what: str) -> IntArray:
    arr = np.asarray(indices)
    if arr.ndim != 1:
        raise MechanismError(f"{what} must be a one-dimensional array")
    # Integral floats are accepted; anything else is a configuration error. The
    # message names no value: these may be raw labels (DESIGN.md §3.1).
    if (
        arr.size
        and arr.dtype.kind not in "iu"
        and (arr.dtype.kind != "f" or not np.all(np.isfinite(arr)) or np.any(arr != np.floor(arr)))
    ):
        raise MechanismError(f"{what} must be integer indices")
    out = arr.astype(np.int64, copy=False)
    if out.size and (int(out.min()) < 0 or int(out.max()) >= num_bins):
        raise MechanismError(f"{what} must lie in [0, {num_bins})")
    return out


def label_counts(indices: IntArray, num_bins: int) -> IntArray:
    """Exact counts per bin. NOT private: only ever the input of a noisy release."""
    k = _check_positive_int(num_bins, "num_bins")
    idx = _check_indices(indices, k, "label indices")
    counts: IntArray = np.bincount(idx, minlength=k).astype(np.int64)
    return counts


def group_counts(
    indices: IntArray, groups: IntArray, num_bins: int, *, num_groups: int | None = None
) -> tuple[IntArray, IntArray]:
    """Exact G×K counts and the group ids of the rows. NOT private.

    With ``num_groups`` the groups are the declared ids ``0..num_groups−1`` (so a
    group with no example still has a row); without it, the ids present in
    ``groups`` — which depend on features only, never on labels.
    """
    k = _check_positive_int(num_bins, "num_bins")
    idx = _check_indices(indices, k, "label indices")
    grp = np.asarray(groups)
    if grp.shape != idx.shape:
        raise MechanismError("groups must have one entry per label")
    if num_groups is None:
        if grp.size and grp.dtype.kind not in "iu":
            raise MechanismError("groups must be integer ids")
        group_ids, row = np.unique(grp.astype(np.int64, copy=False), return_inverse=True)
        group_ids = group_ids.astype(np.int64)
    else:
        g = _check_positive_int(num_groups, "num_groups")
        row = _check_indices(grp, g, "groups")
        group_ids = np.arange(g, dtype=np.int64)
    flat = row.astype(np.int64) * k + idx
    counts: IntArray = (
        np.bincount(flat, minlength=group_ids.size * k).reshape(group_ids.size, k).astype(np.int64)
    )
    return group_ids, counts


def _normalize_rows(noisy: IntArray) -> FloatArray:
    clipped = np.maximum(noisy, 0).astype(np.float64)
    totals = clipped.sum(axis=-1, keepdims=True)
    k = clipped.shape[-1]
    out: FloatArray = np.where(totals > 0, clipped / np.where(totals > 0, totals, 1.0), 1.0 / k)
    return out


def laplace_histogram(
    indices: IntArray,
    num_bins: int,
    *,
    epsilon: Epsilon,
    rng: IntegerRandom | None = None,
) -> FloatArray:
    """An ε-DP prior over ``num_bins`` bins from the labels' bin indices.

    Algorithm 4 of ``rr-on-bins-regression.txt`` (Appendix C.1): h_y + DLap(2/ε),
    clipped at 0, normalized; all zero → uniform. Neighbours: one label replaced
    (L1 sensitivity 2). Spends ``epsilon`` (the ε₁ of Theorem 6/7) on every
    example in ``indices``. ``rng`` is an integer source (``random.Random``-like);
    the default draws from the OS.
    """
    counts = label_counts(indices, num_bins)
    noise = sample_discrete_laplace(noise_scale(epsilon), counts.size, rng=rng)
    return _normalize_rows(counts + noise)


def group_histograms(
    indices: IntArray,
    groups: IntArray,
    num_bins: int,
    *,
    epsilon: Epsilon,
    num_groups: int | None = None,
    rng: IntegerRandom | None = None,
) -> tuple[IntArray, FloatArray]:
    """ε-DP per-group priors: ``(group_ids, priors)`` with ``priors`` of shape G×K.

    Algorithm 4 of ``rr-with-prior-lp-mst-supplementary.txt`` (SSL priors): one
    noisy histogram per group, H_c + DLap(2/ε), clipped and normalized. Groups
    are disjoint and label-independent, so substituting one label changes two
    cells of one group's row (L1 sensitivity 2 over the whole matrix) and the
    release spends ``epsilon`` once per example, whatever G is. Rows of groups
    with no example are pure noise, clipped and normalized (uniform if all zero).
    """
    group_ids, counts = group_counts(indices, groups, num_bins, num_groups=num_groups)
    noise = sample_discrete_laplace(noise_scale(epsilon), counts.size, rng=rng)
    return group_ids, _normalize_rows(counts + noise.reshape(counts.shape))


def default_prior_epsilon(*, num_values: int, num_labels: int, epsilon: float) -> float:
    """ε₁ = min(√(k/n), ε/2): the share of ε spent on the prior (DESIGN.md §4).

    Theorem 7 of ``rr-on-bins-regression.txt`` (and Appendix E) recommends
    ε₁ = √(|Y|/n) for k = |Y| = ``num_values`` label values and n = ``num_labels``
    labels; it assumes n is large enough that ε₁ < ε, so we cap ε₁ at ε/2 to leave
    at least half the budget to the randomizer. n is public under substitution.
    """
    eps = check_epsilon(epsilon)
    k = _check_positive_int(num_values, "num_values")
    if isinstance(num_labels, bool) or not isinstance(num_labels, int | np.integer):
        raise MechanismError(f"num_labels must be an integer, got {num_labels!r}")
    n = int(num_labels)
    if n < 0:
        raise MechanismError("num_labels must be >= 0")
    if n == 0:
        return eps / 2
    return min(math.sqrt(k / n), eps / 2)
