"""Private label priors (DESIGN.md §3.2, §4).

Everything label-dependent that a mechanism uses must itself be DP and charged:
the prior histogram costs ε₁. :mod:`.histogram` builds ε₁-DP priors (global or per
group) by the discrete Laplace mechanism; :mod:`.discrete_laplace` is its exact
integer sampler (DESIGN.md §3.5).
"""

from label_party.priors.discrete_laplace import (
    BufferedSystemRandom,
    IntegerRandom,
    bernoulli_exp,
    sample_discrete_laplace,
)
from label_party.priors.histogram import (
    Epsilon,
    default_prior_epsilon,
    group_counts,
    group_histograms,
    label_counts,
    laplace_histogram,
    noise_scale,
)

__all__ = [
    "BufferedSystemRandom",
    "Epsilon",
    "IntegerRandom",
    "bernoulli_exp",
    "default_prior_epsilon",
    "group_counts",
    "group_histograms",
    "label_counts",
    "laplace_histogram",
    "noise_scale",
    "sample_discrete_laplace",
]
