"""Fitting the optimal unbiased randomizer (Algorithm 1 on Algorithm 2's grid).

Targets (2-core machine), ε = 1: values 1..52 — mesh 416 ≤ 1 s, mesh 1664 ≤ 5 s (the
paper, Appendix G.3, reports 17.1 s and 161 s); values 0..400 — mesh 401 ≤ 5 s, mesh
1604 ≤ 60 s. High ε, where e^ε is in the thousands and the optimum uses hundreds of
outputs: values 0..752 step 4 (189 values, rand-hie-spend's domain), default mesh
756, ε = 4 and ε = 8 — well under a minute (the column generation as first written
took 35 s at ε = 4 and more than 15 minutes at ε = 8 on such a prior).

The same run times the paper's LP written out with every pairwise DP row
(``k(k−1)·|O|`` rows, "all-pairs") at a size where it finishes, next to ours on the
same problem, and checks that both reach the same optimum.

Priors (no data set is read; all are fixed formulas):

* ``weeks 1..52`` — weeks worked in a year, shaped like the US Census example:
  55 % of the mass at 52 (full-year workers), the rest over 1..51 with weight
  ``0.02 + (y/52)³`` plus bumps at 26 and 40 weeks (half-year and seasonal work).
* ``counts 0..400`` — a count label like the App Ads conversion counts: weight
  ``√(1 + y)·e^(−y/40)`` with an extra 30 % of that total at 0.
* ``spend 0..752`` — annual medical spend in $4 steps, clipped at $752, shaped like
  rand-hie-spend's *noisy* prior (Algorithm 4): 20,000 examples spread as
  ``e^(−y/150)`` with 30 % at 0 and 4 % at the clip, plus Laplace noise of scale 20
  (ε₁ = 0.1) from a fixed seed, clipped at 0 — sparse and irregular, as the prior
  the service fits to is.

Run: ``.venv/bin/python -m bench.bench_unbiased``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import highspy
import numpy as np
import scipy.sparse as sp

from label_party.mechanisms.unbiased import default_mesh, feasible_output_set, solve_unbiased

RESULTS = Path(__file__).parent / "results" / "unbiased.json"
EPSILON = 1.0
HIGH_EPSILONS = (4.0, 8.0)


def weeks_prior() -> tuple[np.ndarray, np.ndarray]:
    y = np.arange(1.0, 53.0)
    w = 0.02 + (y / 52.0) ** 3
    w[25] += 0.3  # 26 weeks
    w[39] += 0.2  # 40 weeks
    w[:51] *= 0.45 / w[:51].sum()
    w[51] = 0.55
    return y, w / w.sum()


def counts_prior() -> tuple[np.ndarray, np.ndarray]:
    y = np.arange(0.0, 401.0)
    w = np.sqrt(1.0 + y) * np.exp(-y / 40.0)
    w[0] += 0.3 * w.sum()
    return y, w / w.sum()


def spend_prior() -> tuple[np.ndarray, np.ndarray]:
    y = np.arange(0.0, 753.0, 4.0)
    w = np.exp(-y / 150.0)
    w *= 0.66 / w[1:-1].sum()
    w[0], w[-1] = 0.30, 0.04
    counts = 20_000 * w + np.random.default_rng(0).laplace(0.0, 20.0, y.size)
    counts = np.maximum(counts, 0.0)
    return y, counts / counts.sum()


def all_pairs_lp(values: np.ndarray, prior: np.ndarray, epsilon: float, grid: np.ndarray) -> float:
    """The straightforward implementation: Algorithm 1 exactly as printed.

    Variables ``M[y, o]``; rows: sums, unbiasedness and all ``M[y', o] ≤ e^ε M[y, o]``;
    built with scipy.sparse and passed to HiGHS in one call (its default solver
    choice, tight tolerances). Returns the optimal loss.
    """
    k, n = values.size, grid.size
    e = math.exp(epsilon)
    var = np.arange(k * n).reshape(k, n)
    ry = np.repeat(np.arange(k), n)
    sums = sp.csr_matrix((np.ones(k * n), (ry, var.ravel())), shape=(k, k * n))
    means = sp.csr_matrix((np.tile(grid, k), (ry, var.ravel())), shape=(k, k * n))
    yy, zz = np.nonzero(~np.eye(k, dtype=bool))
    yy, zz = np.repeat(yy, n), np.repeat(zz, n)
    oo = np.tile(np.arange(n), k * (k - 1))
    r = np.arange(yy.size)
    dp = sp.csr_matrix(
        (
            np.concatenate([np.ones(r.size), np.full(r.size, -e)]),
            (np.concatenate([r, r]), np.concatenate([var[zz, oo], var[yy, oo]])),
        ),
        shape=(r.size, k * n),
    )
    a = sp.vstack([sums, means, dp]).tocsc()
    lp = highspy.HighsLp()
    lp.num_col_ = k * n
    lp.num_row_ = a.shape[0]
    lp.col_cost_ = (prior[:, None] * np.square(grid[None, :] - values[:, None])).ravel()
    lp.col_lower_ = np.zeros(k * n)
    lp.col_upper_ = np.full(k * n, highspy.kHighsInf)
    lp.row_lower_ = np.concatenate([np.ones(k), values, np.full(r.size, -highspy.kHighsInf)])
    lp.row_upper_ = np.concatenate([np.ones(k), values, np.zeros(r.size)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = a.indptr.astype(np.int32)
    lp.a_matrix_.index_ = a.indices.astype(np.int32)
    lp.a_matrix_.value_ = a.data.astype(np.float64)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("primal_feasibility_tolerance", 1e-10)
    h.setOptionValue("dual_feasibility_tolerance", 1e-10)
    h.passModel(lp)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(h.modelStatusToString(h.getModelStatus()))
    return float(h.getInfo().objective_function_value)


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = math.inf, None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def _ours(
    case: str,
    values: np.ndarray,
    prior: np.ndarray,
    mesh: int,
    repeat: int,
    epsilon: float = EPSILON,
) -> dict[str, Any]:
    grid = feasible_output_set(values, epsilon=epsilon, mesh=mesh)
    seconds, sol = _timed(
        lambda: solve_unbiased(values, prior, epsilon=epsilon, outputs=grid), repeat
    )
    return {
        "case": case,
        "method": "column generation",
        "epsilon": epsilon,
        "mesh": mesh,
        "seconds": seconds,
        "loss": sol.loss,
        "gap": sol.loss - sol.lower_bound,
        "outputs_used": int(sol.outputs.size),
        "rounds": sol.rounds,
        "max_bias": float(np.max(np.abs(sol.matrix @ sol.outputs - values))),
        "dp_ratio_over_e_eps": float(
            np.max(sol.matrix.max(axis=0) / sol.matrix.min(axis=0)) / math.exp(epsilon)
        ),
    }


def run() -> list[dict[str, Any]]:
    weeks, counts = weeks_prior(), counts_prior()
    rows = [
        _ours("weeks 1..52", *weeks, 52, repeat=3),
        _ours("weeks 1..52", *weeks, 416, repeat=3),
        _ours("weeks 1..52", *weeks, 1664, repeat=1),
        _ours("counts 0..400", *counts, 401, repeat=1),
        _ours("counts 0..400", *counts, 1604, repeat=1),
    ]
    spend = spend_prior()
    rows += [
        _ours("spend 0..752", *spend, default_mesh(spend[0].size), repeat=1, epsilon=eps)
        for eps in HIGH_EPSILONS
    ]
    # The straightforward implementation at a size where it finishes.
    values, prior = weeks
    grid = feasible_output_set(values, epsilon=EPSILON, mesh=52)
    seconds, loss = _timed(lambda: all_pairs_lp(values, prior, EPSILON, grid), 1)
    ours = rows[0]
    rows.append(
        {
            "case": "weeks 1..52",
            "method": "all-pairs LP",
            "epsilon": EPSILON,
            "mesh": 52,
            "seconds": seconds,
            "loss": loss,
            "outputs_used": None,
            "speedup_vs_all_pairs": seconds / ours["seconds"],
            "relative_loss_difference": (ours["loss"] - loss) / loss,
        }
    )
    return rows


def main() -> None:
    rows = run()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    line = "{:<15} {:<18} {:>4} {:>5} {:>9} {:>17} {:>5}"
    print(line.format("case", "method", "ε", "mesh", "seconds", "noisy-label loss", "used"))
    for r in rows:
        used = "" if r["outputs_used"] is None else str(r["outputs_used"])
        print(
            f"{r['case']:<15} {r['method']:<18} {r['epsilon']:>4g} {r['mesh']:>5} "
            f"{r['seconds']:>9.3f} {r['loss']:>17.6f} {used:>5}"
        )
    last = rows[-1]
    print(
        f"all-pairs LP / column generation at mesh 52: {last['speedup_vs_all_pairs']:.0f}x "
        f"slower; loss difference {last['relative_loss_difference']:.1e} (relative)"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
