"""Example priors the features party sends for ``rr-with-prior`` releases.

Two kinds of *prior sets*, each a Parquet file under
``<data dir>/priors/<dataset id>/<sha256>.parquet`` plus a ``prior_sets`` row:

* ``groups`` — ``example_id, group``: a label-independent group id per example
  (k-means on the features party's features, Algorithm 4 of the LP-MST
  supplement). A release with ``prior_source: "groups"`` spends ε_p (its
  ``prior_epsilon``) once on noisy per-group histograms (parallel composition over
  disjoint groups) and uses each example's group histogram as its prior.
* ``probabilities`` — ``example_id, prior`` (K probabilities per example): the
  features party's model outputs (an LP-MST stage, Algorithm 3). Computed from
  features and earlier releases only, so using them is post-processing: a release
  with ``prior_source: "example"`` spends its whole ε on RRTop-k.

Nothing here reads labels; uploads are audited as ``priors.uploaded``.
"""
