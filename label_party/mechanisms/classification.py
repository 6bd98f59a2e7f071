"""Classification label randomizers: K-ary randomized response and RRWithPrior.

Source: Ghazi, Golowich, Kumar, Manurangsi, Zhang, "Deep Learning with Label
Differential Privacy" (NeurIPS 2021), ``rr-with-prior-lp-mst.txt``:

* ``rr`` — randomized response RR_ε over K classes (§2, eq. (1)): output the true
  class w.p. e^ε/(e^ε+K−1), each other class w.p. 1/(e^ε+K−1).
* ``rr-with-prior`` — RRWithPrior (§3.1, Algorithm 2) = RRTop-k (Algorithm 1) with
  k* = argmax_k e^ε/(e^ε+k−1) · Σ_{y∈Y_k} p_y, where Y_k is the set of the k classes
  of largest prior probability. It maximizes P[M(y) = y] for y ~ p among all
  ε-DP randomizers (Theorem 3). LP-MST (Algorithm 3) calls it once per example
  with that example's prior from the previous stage's model; the SSL/group
  priors of the supplement (Algorithm 4) are another source of p.

Neighbouring relation: two datasets differ in the label of one example
(Definition 2.2). Every example's label is randomized once, independently, so a
release is ε-label-DP and spends ε on each example it randomizes (parallel
composition; Observation 4 for LP-MST, where each example lies in one stage).
The prior and hence k* and Y_k must not depend on the example's own label beyond
what is already charged (a DP histogram costs its own ε₁, DESIGN.md §3.2; a model
trained on earlier LP-MST stages sees only other examples' noisy labels);
choosing k from p is then post-processing (Corollary 2), and RRTop-k is ε-DP for
every k and every Y_k (Lemma 1).

Conventions: class indices are 0..K−1 (the papers' [K] shifted by one). Ties in
the prior are broken by class index (the smaller index ranks first); ties in the
objective (within a relative 1e-12, to absorb rounding in the cumulative sums)
by the smaller k. Probabilities are written with δ = e^{−ε}, e.g.
e^ε/(e^ε+k−1) = 1/(1+(k−1)δ), so no e^ε overflows for large ε.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from label_party.mechanisms.base import (
    DEFAULT_CHUNK,
    FiniteMechanism,
    FitRequest,
    FloatArray,
    IntArray,
    Loss,
    Mechanism,
    MechanismError,
    check_epsilon,
    check_params,
    flip_coins,
    pointwise_loss,
    rare_draws,
    secure_generator,
    validate_prior,
)

__all__ = [
    "TIE_RTOL",
    "RRTopK",
    "RandomizedResponse",
    "loss_sums",
    "rr_from_request",
    "rr_matrix",
    "rr_sample",
    "rr_top_k_matrix",
    "rr_with_prior_from_request",
    "rr_with_prior_sample",
    "top_k_objective",
    "top_k_sets",
]

#: Objective values within this relative distance of the maximum count as ties
#: (resolved to the smallest k), so that rounding in the cumulative sums cannot
#: make the choice of k* depend on summation order.
TIE_RTOL = 1e-12


# -- shared validation ----------------------------------------------------------


def _check_num_classes(num_classes: int) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int | np.integer):
        raise MechanismError(f"num_classes must be an integer, got {num_classes!r}")
    if num_classes < 2:
        raise MechanismError("classification needs at least two classes")
    return int(num_classes)


def _check_labels(labels: IntArray, num_classes: int) -> IntArray:
    """Labels as int64 class indices; messages name no label value (DESIGN.md §3.1)."""
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise MechanismError("labels must be a one-dimensional array")
    if (
        arr.size
        and arr.dtype.kind not in "iu"
        and (arr.dtype.kind != "f" or not np.all(np.isfinite(arr)) or np.any(arr != np.floor(arr)))
    ):
        raise MechanismError("labels must be integer class indices")
    out = arr.astype(np.int64, copy=False)
    if out.size and (int(out.min()) < 0 or int(out.max()) >= num_classes):
        raise MechanismError(f"labels must be class indices in [0, {num_classes})")
    return out


def _class_values(values: FloatArray) -> int:
    """K if ``values`` is exactly 0, 1, …, K−1 (K ≥ 2)."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or not np.array_equal(v, np.arange(v.size, dtype=np.float64)):
        raise MechanismError("classification values must be the class indices 0, 1, ..., K-1")
    return _check_num_classes(v.size)


def _check_priors(priors: FloatArray) -> FloatArray:
    """An n×K float64 array of finite, non-negative entries (flat checks only).

    Positive row mass is checked where the rows are sorted (:func:`_rank_block`).
    """
    p = np.asarray(priors, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise MechanismError("priors must be an n×K array with K >= 2 classes")
    if not np.isfinite(p).all() or (p < 0).any():
        raise MechanismError("prior entries must be finite and non-negative")
    return p


# -- randomized response --------------------------------------------------------


def rr_matrix(num_classes: int, *, epsilon: float) -> FloatArray:
    """RR_ε transition matrix: e^ε/(e^ε+K−1) on the diagonal, 1/(e^ε+K−1) elsewhere."""
    k = _check_num_classes(num_classes)
    delta = math.exp(-check_epsilon(epsilon))
    denom = 1.0 + (k - 1) * delta
    m: FloatArray = np.full((k, k), delta / denom)
    np.fill_diagonal(m, 1.0 / denom)
    return m


def loss_sums(labels: FloatArray, outputs: FloatArray, loss: Loss) -> FloatArray:
    """Σ_{o ∈ outputs} ℓ(o, y) for each label y, in O((n + m) log m) for m sorted,
    distinct ``outputs`` (class indices) — never the n×m table, so randomized
    response over 10⁵ classes describes itself in milliseconds."""
    y = np.asarray(labels, dtype=np.float64)
    o = np.asarray(outputs, dtype=np.float64)
    if loss == "zero-one":
        result: FloatArray = o.size - np.isin(y, o).astype(np.float64)
    elif loss == "squared":
        result = np.square(o).sum() - 2 * y * o.sum() + o.size * np.square(y)
    elif loss == "absolute":
        below = np.searchsorted(o, y, side="right")
        prefix = np.concatenate([[0.0], np.cumsum(o)])
        result = y * below - prefix[below] + (prefix[-1] - prefix[below]) - y * (o.size - below)
    else:  # Poisson: ŷ − y·log ŷ, infinite at ŷ = 0 unless y = 0 (pointwise_loss)
        positive = o[o > 0]
        finite = o.sum() - y * np.log(positive).sum()
        result = np.where((y > 0) & (o.size > positive.size), np.inf, finite)
    return result


@dataclass(frozen=True, eq=False)
class RandomizedResponse(Mechanism):
    """RR_ε over K classes, given by (K, ε) alone: its K×K matrix is never built
    (a release over 10⁵ classes would need 80 GB for it, and its manifest would
    carry it), and the features party rebuilds whatever it needs from (K, ε).
    :meth:`as_finite` is the same mechanism as a matrix, for small K."""

    epsilon: float
    num_classes: int
    name: str = "rr"

    @property
    def keep_probability(self) -> float:
        """e^ε/(e^ε+K−1), written so that no e^ε overflows."""
        return 1.0 / (1.0 + (self.num_classes - 1) * math.exp(-self.epsilon))

    @property
    def other_probability(self) -> float:
        """1/(e^ε+K−1): each class but the label's."""
        return math.exp(-self.epsilon) * self.keep_probability

    def sample(
        self,
        labels: FloatArray,
        *,
        rng: np.random.Generator | None = None,
        chunk_size: int = DEFAULT_CHUNK,
    ) -> FloatArray:
        noisy = rr_sample(
            np.asarray(labels), self.num_classes, epsilon=self.epsilon, rng=rng,
            chunk_size=chunk_size,
        )  # fmt: skip
        return noisy.astype(np.float64)

    def bias(self, values: FloatArray) -> FloatArray:
        """E[M(y)] − y = keep·y + other·(Σ_o o − y) − y, with Σ_o o = K(K−1)/2."""
        y = np.asarray(values, dtype=np.float64)
        total = self.num_classes * (self.num_classes - 1) / 2
        result: FloatArray = self.keep_probability * y + self.other_probability * (total - y) - y
        return result

    def noisy_label_loss(self, values: FloatArray, prior: FloatArray, loss: Loss) -> float:
        """E ℓ(M(y), y) = keep·ℓ(y, y) + other·Σ_{o≠y} ℓ(o, y), over y ~ prior."""
        y = np.asarray(values, dtype=np.float64)
        weights = np.asarray(prior, dtype=np.float64)
        used = weights > 0  # 0·∞ is 0: unused values may cost ∞
        own = pointwise_loss(y[used], y[used], loss)
        others = loss_sums(y[used], np.arange(self.num_classes, dtype=np.float64), loss) - own
        per_value = self.keep_probability * own + self.other_probability * others
        return float(np.dot(weights[used], per_value))

    def describe(self) -> dict[str, Any]:
        # inputs and outputs (O(K)) for features parties that read K from them
        classes = list(range(self.num_classes))
        return {"name": self.name, "epsilon": self.epsilon, "inputs": classes,
                "outputs": classes, "params": {"num_classes": self.num_classes}}  # fmt: skip

    def as_finite(self) -> FiniteMechanism:
        """The same mechanism with its K×K matrix (small K: previews, tests)."""
        classes = np.arange(self.num_classes, dtype=np.float64)
        matrix = rr_matrix(self.num_classes, epsilon=self.epsilon)
        return FiniteMechanism(self.name, self.epsilon, classes, classes.copy(), matrix,
                               {"num_classes": self.num_classes})  # fmt: skip


def rr_from_request(request: FitRequest) -> RandomizedResponse:
    """``rr``: K-ary randomized response (Ghazi et al. 2021, §2 eq. (1)).

    ``request.values`` must be the class indices 0..K−1; the prior is not used.
    ε-DP under substitution of one example's label (the matrix ratio is exactly
    e^ε); spends ``request.epsilon`` per randomized example.
    """
    check_params(request.params, (), "rr")
    k = _class_values(request.values)
    return RandomizedResponse(check_epsilon(request.epsilon), k)


def rr_sample(
    labels: IntArray,
    num_classes: int,
    *,
    epsilon: float,
    rng: np.random.Generator | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> IntArray:
    """Randomize class labels by RR_ε, vectorized and in chunks.

    Keep the label w.p. e^ε/(e^ε+K−1); otherwise draw one of the other K−1
    classes uniformly (j ∈ {0..K−2}, shifted past y). ε-DP per example under
    label substitution; spends ε on each example.
    """
    k = _check_num_classes(num_classes)
    flip = rare_draws(k - 1, 1, check_epsilon(epsilon))
    rng = rng if rng is not None else secure_generator()
    y_all = _check_labels(labels, k)
    block = _block_rows(chunk_size, 1)  # O(1) work a label whatever K: no K-wide rows
    out = np.empty(y_all.size, dtype=np.int64)
    for start in range(0, y_all.size, block):
        y = y_all[start : start + block]
        keep = ~flip_coins(rng, flip, y.size)
        other = rng.integers(0, k - 1, size=y.size, dtype=np.int64)
        other += other >= y
        out[start : start + y.size] = np.where(keep, y, other)
    return out


# -- RRWithPrior / RRTop-k --------------------------------------------------------


#: Rows per block are capped so that a block has at most this many cells: the
#: per-block temporaries (a few K×rows arrays) then stay within a few MiB, which
#: keeps them in cache and out of fresh page-faulting allocations.
_BLOCK_CELLS = 1 << 19


def _block_rows(chunk_size: int, num_classes: int) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int | np.integer):
        raise MechanismError("chunk_size must be an integer")
    if chunk_size < 1:
        raise MechanismError("chunk_size must be >= 1")
    return max(1, min(int(chunk_size), _BLOCK_CELLS // num_classes))


def _order_t(p: FloatArray) -> IntArray:
    """order_t[r, i] = the class at rank r in row i (K×n): decreasing prior, ties
    by class index (a stable argsort of −p per row)."""
    # Sorting the columns of the K×n transpose costs the same as sorting the rows
    # of p and yields the K×n layout directly.
    order_t: IntArray = np.argsort(-p.T, axis=0, kind="stable").astype(np.int64, copy=False)
    return np.ascontiguousarray(order_t)


def _rank_block(p: FloatArray, delta: float) -> tuple[IntArray, IntArray, FloatArray]:
    """Ranking, objective and k* for a block of validated priors (n×K).

    Returns ``(k_star, order_t, w)``, all with one column per example (K×n, so
    that the scans over k are contiguous vector operations): ``order_t[r, i]``
    is the class of rank r in row i — decreasing prior, ties by class index (the
    order of a stable sort of −p); ``w[k−1, i]`` is
    w_k = e^ε/(e^ε+k−1)·S_k = S_k/(1+(k−1)δ) with S_k the sum of the k largest
    priors; ``k_star`` is the smallest k whose w_k is within ``TIE_RTOL`` of the
    row's maximum. The single implementation behind :func:`top_k_sets`,
    :func:`top_k_objective` and the batch sampler, so they agree bit for bit.
    """
    n, num = p.shape
    order_t = _order_t(p)
    # Sorted priors, w[r, i] = p[i, order_t[r, i]].
    w: FloatArray = p.ravel()[order_t + np.arange(n, dtype=np.int64) * num]
    if n and not np.all(w[0] > 0):
        raise MechanismError("every prior must have positive total mass")
    for j in range(1, num):  # S_k, summed in order k = 1..K (a cumsum over rows)
        w[j] += w[j - 1]
    w /= (1.0 + np.arange(num, dtype=np.float64) * delta)[:, None]
    threshold = w.max(axis=0)
    threshold *= 1.0 - TIE_RTOL
    k_star: IntArray = np.full(n, num, dtype=np.int64)
    for j in range(num - 2, -1, -1):  # the smallest k reaching the threshold wins
        k_star[w[j] >= threshold] = j + 1
    return k_star, order_t, w


def top_k_objective(priors: FloatArray, *, epsilon: float) -> FloatArray:
    """w[i, k−1] = e^ε/(e^ε+k−1) · Σ_{top-k of p_i} p: Algorithm 2, step 1.

    For a normalized prior this is P[RRTop-k(y) = y] with y ~ p (§3.1).
    """
    delta = math.exp(-check_epsilon(epsilon))
    _, _, w = _rank_block(_check_priors(priors), delta)
    out: FloatArray = np.ascontiguousarray(w.T)
    return out


def top_k_sets(priors: FloatArray, *, epsilon: float) -> tuple[IntArray, IntArray]:
    """k* and the class ranking for each row of ``priors`` (n×K).

    Returns ``(k_star, order)``: ``order[i]`` lists the classes by decreasing
    ``priors[i]`` (ties by index), so Y_k = ``order[i, :k]``; ``k_star[i]`` is the
    smallest maximizer of e^ε/(e^ε+k−1)·Σ_{Y_k} p (Algorithm 2, steps 1–2). Rows
    need not be normalized (the argmax is scale-free). Depends on the priors
    only — never on a label — so it is post-processing of the prior.
    """
    delta = math.exp(-check_epsilon(epsilon))
    k_star, order_t, _ = _rank_block(_check_priors(priors), delta)
    order: IntArray = np.ascontiguousarray(order_t.T)
    return k_star, order


def rr_top_k_matrix(order: IntArray, k: int, *, epsilon: float) -> FloatArray:
    """RRTop-k transition matrix (Algorithm 1) with Y_k = ``order[:k]``.

    Row y ∈ Y_k: y w.p. e^ε/(e^ε+k−1), each other member of Y_k w.p.
    1/(e^ε+k−1). Row y ∉ Y_k: uniform over Y_k. Columns outside Y_k are zero in
    every row. ε-DP for every k and Y_k (Lemma 1): in a column of Y_k the entries
    are e^ε/(e^ε+k−1) ≥ 1/k ≥ 1/(e^ε+k−1), a ratio of exactly e^ε.
    """
    classes = np.asarray(order, dtype=np.int64)
    num = classes.size
    if classes.ndim != 1 or not np.array_equal(np.sort(classes), np.arange(num)):
        raise MechanismError("order must be a permutation of the class indices")
    _check_num_classes(num)
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= num:
        raise MechanismError(f"k must be an integer in [1, {num}], got {k!r}")
    delta = math.exp(-check_epsilon(epsilon))
    denom = 1.0 + (int(k) - 1) * delta
    top = classes[:k]
    m: FloatArray = np.zeros((num, num))
    m[:, top] = 1.0 / k  # rows outside Y_k: uniform over Y_k
    m[np.ix_(top, top)] = delta / denom
    m[top, top] = 1.0 / denom
    return m


@dataclass(frozen=True, eq=False)
class RRTopK(Mechanism):
    """RRTop-k (Algorithm 1) over K classes with Y_k = ``top``, given by (K, ε, Y_k):
    its K×K matrix (:func:`rr_top_k_matrix`) is never built, so a release over 10⁵
    classes neither holds nor stores it. :meth:`as_finite` is the matrix form."""

    epsilon: float
    num_classes: int
    top: tuple[int, ...]
    k_star: int
    name: str = "rr-with-prior"

    @property
    def keep_probability(self) -> float:
        """For a label in Y_k: e^ε/(e^ε+k−1)."""
        return 1.0 / (1.0 + (len(self.top) - 1) * math.exp(-self.epsilon))

    @property
    def other_probability(self) -> float:
        """For a label in Y_k, each other member of Y_k: e^{−ε} times keeping it."""
        return math.exp(-self.epsilon) * self.keep_probability

    def _position(self) -> IntArray:
        """Each class's index in Y_k, or −1."""
        position = np.full(self.num_classes, -1, dtype=np.int64)
        position[list(self.top)] = np.arange(len(self.top))
        return position

    def sample(
        self,
        labels: FloatArray,
        *,
        rng: np.random.Generator | None = None,
        chunk_size: int = DEFAULT_CHUNK,
    ) -> FloatArray:
        rng = rng if rng is not None else secure_generator()
        y_all = _check_labels(np.asarray(labels), self.num_classes)
        top, position, k = np.asarray(self.top, dtype=np.int64), self._position(), len(self.top)
        flip = rare_draws(k - 1, 1, self.epsilon)
        out = np.empty(y_all.size, dtype=np.float64)
        block = _block_rows(chunk_size, 1)
        for start in range(0, y_all.size, block):
            pos = position[y_all[start : start + block]]
            keep = (pos >= 0) & ~flip_coins(rng, flip, pos.size)
            # Another member of Y_k: uniform over Y_k minus the label's own (if in it).
            draw = rng.integers(0, max(k - 1, 1), size=pos.size)  # k = 1: always kept
            draw += (pos >= 0) & (draw >= pos)
            outside = pos < 0
            draw[outside] = rng.integers(0, k, size=int(outside.sum()))
            chosen = top[np.minimum(draw, k - 1)]
            out[start : start + pos.size] = np.where(keep, top[np.maximum(pos, 0)], chosen)
        return out

    def bias(self, values: FloatArray) -> FloatArray:
        """E[M(y)] − y: keep·y + other·(ΣY_k − y) − y inside Y_k, mean(Y_k) − y outside."""
        y = np.asarray(values, dtype=np.float64)
        inside = self._position()[y.astype(np.int64)] >= 0
        total, k = float(sum(self.top)), len(self.top)
        other = self.other_probability
        expected = np.where(inside, self.keep_probability * y + other * (total - y), total / k)
        result: FloatArray = expected - y
        return result

    def noisy_label_loss(self, values: FloatArray, prior: FloatArray, loss: Loss) -> float:
        """keep·ℓ(y, y) + other·Σ_{o∈Y_k, o≠y} ℓ(o, y) inside Y_k, the mean of ℓ(o, y)
        over Y_k outside, over y ~ prior."""
        weights = np.asarray(prior, dtype=np.float64)
        used = weights > 0  # 0·∞ is 0: unused values may cost ∞
        y = np.asarray(values, dtype=np.float64)[used]
        inside = self._position()[y.astype(np.int64)] >= 0
        sums = loss_sums(y, np.sort(np.asarray(self.top, np.float64)), loss)
        own = pointwise_loss(y, y, loss)
        other = self.other_probability
        with np.errstate(invalid="ignore"):  # ∞ − ∞ only where the branch is not taken
            kept = self.keep_probability * own + other * (sums - own)
        per_value = np.where(inside, kept, sums / len(self.top))
        return float(np.dot(weights[used], per_value))

    def describe(self) -> dict[str, Any]:
        params = {"num_classes": self.num_classes, "k": len(self.top),
                  "top_k": list(self.top), "k_star": self.k_star}  # fmt: skip
        classes = list(range(self.num_classes))
        return {"name": self.name, "epsilon": self.epsilon, "inputs": classes,
                "outputs": classes, "params": params}  # fmt: skip

    def as_finite(self) -> FiniteMechanism:
        """The same mechanism with its K×K matrix (small K: previews, tests)."""
        rest = [c for c in range(self.num_classes) if c not in set(self.top)]
        order = np.asarray([*self.top, *rest], dtype=np.int64)
        classes = np.arange(self.num_classes, dtype=np.float64)
        matrix = rr_top_k_matrix(order, len(self.top), epsilon=self.epsilon)
        return FiniteMechanism(self.name, self.epsilon, classes, classes.copy(), matrix,
                               self.describe()["params"])  # fmt: skip


def rr_with_prior_from_request(request: FitRequest) -> RRTopK:
    """``rr-with-prior``: RRWithPrior for one example's prior (Algorithm 2).

    ``request.values`` are the class indices 0..K−1 and ``request.prior`` the
    example's prior over them (already DP, or public). The mechanism is RRTop-k*
    with k* from :func:`top_k_sets`; ``params={"k": k}`` forces RRTop-k with that k
    instead. ε-DP under substitution of the example's label (Lemma 1, Corollary
    2); spends ``request.epsilon`` on each example randomized. ``describe()``
    carries k and Y_k (functions of the already private prior).
    """
    check_params(request.params, {"k"}, "rr-with-prior")
    num = _class_values(request.values)
    _values, prior = validate_prior(request.values, request.prior)
    eps = check_epsilon(request.epsilon)
    k_star, order = top_k_sets(prior[None, :], epsilon=eps)
    k: Any = request.params.get("k", int(k_star[0]))
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= num:
        raise MechanismError(f"k must be an integer in [1, {num}], got {k!r}")
    top = tuple(int(c) for c in order[0, : int(k)])
    return RRTopK(eps, num, top, int(k_star[0]))


def rr_with_prior_sample(
    labels: IntArray,
    priors: FloatArray,
    *,
    epsilon: float,
    rng: np.random.Generator | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> IntArray:
    """Randomize each label by RRWithPrior under its own prior (Algorithm 2, batched).

    ``labels[i]`` ∈ 0..K−1 and ``priors[i]`` its example's prior (row i of an n×K
    array; float32 model outputs are fine, rows need not sum to one exactly).
    Per example: rank classes by prior (ties by index), k* by cumulative sums,
    then RRTop-k*: if y ∈ Y_k*, keep it w.p. e^ε/(e^ε+k*−1) else draw one of the
    other k*−1 members uniformly; if y ∉ Y_k*, draw uniformly from Y_k*. No
    Python loop per example (loops run over the K classes, vectorized over a
    block of rows); blocks have at most ``chunk_size`` rows and about 2¹⁹ cells,
    which bounds the working memory whatever n is. ε-DP per example under label
    substitution (Corollary 2); spends ε on each example (the prior's own cost is
    charged where the prior is made).
    """
    eps = check_epsilon(epsilon)
    delta = math.exp(-eps)
    if np.ndim(priors) != 2:
        raise MechanismError("priors must be an n×K array")
    n, num = np.shape(priors)
    num = _check_num_classes(num)
    y_all = _check_labels(labels, num)
    if y_all.size != n:
        raise MechanismError("labels and priors must have the same number of rows")
    block = _block_rows(chunk_size, num)
    rng = rng if rng is not None else secure_generator()
    out = np.empty(n, dtype=np.int64)
    for start in range(0, n, block):
        y = y_all[start : start + block]
        m = y.size
        k, order_t, _ = _rank_block(_check_priors(priors[start : start + block]), delta)
        # Position of the true label in the ranking: rank < k  <=>  y ∈ Y_k.
        rank = np.zeros(m, dtype=np.int64)
        for j in range(1, num):
            rank[order_t[j] == y] = j
        in_top = rank < k
        sizes, which = np.unique(k, return_inverse=True)  # k* per example: a few values
        flips = np.array([rare_draws(int(n) - 1, 1, eps) for n in sizes], dtype=np.int64)
        keep = ~flip_coins(rng, flips[which.ravel()], m) & in_top
        # y ∈ Y_k, not kept: uniform over the k−1 other positions (skip y's own);
        # y ∉ Y_k: uniform over the k positions of Y_k.
        high = np.where(in_top, np.maximum(k - 1, 1), k)
        pos = rng.integers(0, high, dtype=np.int64)
        pos += in_top & (pos >= rank)
        np.copyto(pos, rank, where=keep)
        out[start : start + m] = order_t.ravel()[pos * m + np.arange(m, dtype=np.int64)]
    return out
