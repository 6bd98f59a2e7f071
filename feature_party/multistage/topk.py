"""RRTop-k set sizes on the features party's side, for the supplement's label filter.

LP-MST's stage t trains on every label received so far. The supplement
(``rr-with-prior-lp-mst.txt``, Appendix B) drops an earlier stage's noisy label
when it lies outside the top-k* classes of the current model's prior for that
example: RRWithPrior at stage t would never have output it, so it is most likely
noise. k* is Algorithm 2's choice, ``argmax_k e^ε/(e^ε+k−1)·Σ_{Y_k} p`` (smallest
k on ties). The labels party computes the same choice when it randomizes
(``label_party.mechanisms.classification.top_k_sets``; a test checks that both
agree). Everything here is post-processing of released labels and of a model
trained on them.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Relative tolerance for ties in the objective, as on the labels party.
TIE_RTOL = 1e-12


def k_star(priors: FloatArray, epsilon: float) -> tuple[IntArray, IntArray]:
    """``(k*, order)`` per row of ``priors`` (n×K): ``order[i]`` ranks the classes by
    decreasing prior (ties by class index) and Y_k* = ``order[i, :k*[i]]``."""
    p = np.asarray(priors, dtype=np.float64)
    order: IntArray = np.argsort(-p, axis=1, kind="stable").astype(np.int64)
    mass = np.cumsum(np.take_along_axis(p, order, axis=1), axis=1)
    ks = np.arange(1, p.shape[1] + 1, dtype=np.float64)
    objective = mass / (1.0 + (ks - 1.0) * math.exp(-epsilon))
    best = objective.max(axis=1, keepdims=True) * (1.0 - TIE_RTOL)
    sizes: IntArray = (np.argmax(objective >= best, axis=1) + 1).astype(np.int64)
    return sizes, order


def in_top_k(priors: FloatArray, labels: IntArray, epsilon: float) -> npt.NDArray[np.bool_]:
    """Whether each label is among its example's top-k* classes."""
    sizes, order = k_star(priors, epsilon)
    rank = np.argmax(order == np.asarray(labels, dtype=np.int64)[:, None], axis=1)
    keep: npt.NDArray[np.bool_] = rank < sizes
    return keep
