"""Time ``rr_on_bins.optimal_bins`` against the paper's O(k³) dynamic program.

Run as ``python -m bench.bench_rr_on_bins``. For k ∈ {52, 401, 2000} (the paper uses
k = 401, Appendix E), two priors (heavy-tailed ``p_y ∝ (1 + y)^−1.3`` and a seeded
Dirichlet(1)) over the values 0 … k − 1, ε ∈ {1, 4, 8} (2 to ~50 bins) and the
three losses, it measures
the compute time of ``optimal_bins`` (median and minimum of several runs), and
times a straightforward implementation of Algorithm 2 of
``rr-on-bins-regression.txt`` (bin costs by the formulas of Appendix B, then
``A[i][j] = min_r A[r][j−1] + L[r+1][i]`` vectorized over (r, i), one step per
number of bins j: O(k³)) in the same run, checking both reach the same loss.
At k = 2000 the reference runs only where its k = 401 time extrapolates
(×(2000/401)³ × ``REFERENCE_SCALING_MARGIN``) below ``REFERENCE_LIMIT_S``; otherwise
the table shows the estimate. Results go to ``bench/results/rr_on_bins.json``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from label_party.mechanisms.base import FloatArray, Loss
from label_party.mechanisms.rr_on_bins import optimal_bins

SIZES = (52, 401, 2000)
LOSSES: tuple[Loss, ...] = ("squared", "absolute", "poisson")
EPSILONS = (1.0, 4.0, 8.0)
#: The compute-time budget for the squared loss, in seconds.
BUDGET_S = {52: 0.002, 401: 0.020, 2000: 0.250}
REFERENCE_LIMIT_S = 30.0
#: The reference's k × k temporaries fall out of cache at k = 2000, so it scales
#: worse than k³: measured ~3.7× above the cubic extrapolation from k = 401.
REFERENCE_SCALING_MARGIN = 4.0
RESULTS = Path(__file__).resolve().parent / "results" / "rr_on_bins.json"


def priors(k: int) -> dict[str, tuple[FloatArray, FloatArray]]:
    values = np.arange(float(k))
    heavy = (1.0 + values) ** -1.3
    dirichlet = np.random.default_rng(k).dirichlet(np.ones(k))
    return {
        "heavy-tailed": (values, heavy / heavy.sum()),
        "dirichlet": (values, dirichlet / dirichlet.sum()),
    }


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], list[float], Any]:
    """Wall-clock and this thread's CPU seconds of each of ``repeats`` calls.

    The CPU time is what the computation costs when the machine is shared (on a
    loaded 2-core box the wall clock also counts time spent waiting for a core).
    """
    result = fn()  # warm-up (allocator, caches)
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.thread_time()
        result = fn()
        cpu.append(time.thread_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    return wall, cpu, result


# -- the reference: Algorithm 2 as written -------------------------------------------


def _reference_costs(values: FloatArray, prior: FloatArray, c: float, loss: Loss) -> FloatArray:
    """L[r, i] for the bin values[r:i] (Appendix B), +inf where i ≤ r."""
    k = values.size
    L = np.full((k + 1, k + 1), np.inf)
    r, i = np.triu_indices(k + 1, 1)
    if loss in ("squared", "poisson"):
        zero = np.zeros(1)
        P, PY = (np.concatenate([zero, np.cumsum(a)]) for a in (prior, prior * values))
        W = P[-1] + (c - 1.0) * (P[i] - P[r])
        WY = PY[-1] + (c - 1.0) * (PY[i] - PY[r])
        mean = WY / W
        if loss == "squared":
            PY2 = np.concatenate([zero, np.cumsum(prior * values**2)])
            WY2 = PY2[-1] + (c - 1.0) * (PY2[i] - PY2[r])
            L[r, i] = WY2 - 2.0 * WY * mean + W * mean**2
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                L[r, i] = np.where(WY > 0, W * mean - WY * np.log(mean), 0.0)
        return L
    # Absolute loss: the weighted median of each bin, O(k) per bin.
    idx = np.arange(k)
    for start in range(k):
        ends = np.arange(start + 1, k + 1)
        inside = (idx[None, :] >= start) & (idx[None, :] < ends[:, None])
        w = prior[None, :] * np.where(inside, c, 1.0)
        cum = np.cumsum(w, axis=1)
        med = values[np.argmax(cum >= 0.5 * cum[:, -1:], axis=1)]
        L[start, start + 1 :] = (w * np.abs(med[:, None] - values[None, :])).sum(axis=1)
    return L


def reference_loss(values: FloatArray, prior: FloatArray, *, epsilon: float, loss: Loss) -> float:
    """Algorithm 2: min over d of A[k][d] / (e^ε + d − 1)."""
    c = math.exp(epsilon)
    L = _reference_costs(values, prior, c, loss)
    k = values.size
    A = np.full(k + 1, np.inf)
    A[0] = 0.0
    best = math.inf
    for d in range(1, k + 1):
        A = np.min(A[:, None] + L, axis=0)
        best = min(best, float(A[k]) / (c + d - 1))
    return best


# -- the run --------------------------------------------------------------------------


def run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    reference_401: dict[tuple[str, str, float], float] = {}
    cases = [
        (k, prior_name, values, prior, eps, loss)
        for k in SIZES
        for prior_name, (values, prior) in priors(k).items()
        for eps in EPSILONS
        for loss in LOSSES
    ]
    for k, prior_name, values, prior, eps, loss in cases:
        repeats = 7 if k >= 2000 else 21

        def ours(
            v: FloatArray = values, p: FloatArray = prior, e: float = eps, lo: Loss = loss
        ) -> Any:
            return optimal_bins(v, p, epsilon=e, loss=lo)

        times, cpu, fitted = _timed(ours, repeats)
        row: dict[str, Any] = {
            "k": k,
            "prior": prior_name,
            "loss": loss,
            "epsilon": eps,
            "bins": int(fitted.outputs.size),
            "noisy_label_loss": fitted.loss,
            "ours_median_s": statistics.median(times),
            "ours_min_s": min(times),
            "ours_cpu_median_s": statistics.median(cpu),
            "budget_s": BUDGET_S[k] if loss == "squared" else None,
            "reference_s": None,
            "speedup": None,
            "agree": None,
        }
        estimate = (
            reference_401.get((prior_name, loss, eps), math.inf)
            * (k / 401) ** 3
            * REFERENCE_SCALING_MARGIN
        )
        if k <= 401 or estimate < REFERENCE_LIMIT_S:
            start = time.perf_counter()
            ref = reference_loss(values, prior, epsilon=eps, loss=loss)
            elapsed = time.perf_counter() - start
            if k == 401:
                reference_401[(prior_name, loss, eps)] = elapsed
            row["reference_s"] = elapsed
            row["speedup"] = elapsed / row["ours_median_s"]
            row["reference_loss"] = ref
            row["agree"] = abs(ref - fitted.loss) <= 1e-9 * max(abs(ref), 1e-12)
        elif math.isfinite(estimate):
            row["reference_estimate_s"] = estimate
        rows.append(row)
    return rows


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:9.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'k':>5} {'prior':<13}{'eps':>4} {'loss':<9}{'bins':>5} {'ours ms':>9} {'min ms':>9} "
        f"{'cpu ms':>9} "
        f"{'budget':>7} {'Alg.2 ms':>10} {'ratio':>8}  agree"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        budget = "" if r["budget_s"] is None else f"{r['budget_s'] * 1e3:5.0f}ms"
        ok = (
            ""
            if r["budget_s"] is None
            else (" ok" if r["ours_median_s"] <= r["budget_s"] else " OVER")
        )
        ref = _ms(r["reference_s"])
        if r["reference_s"] is None and "reference_estimate_s" in r:
            ref = f"~{r['reference_estimate_s']:.0f}s est"
        ratio = "" if r["speedup"] is None else f"{r['speedup']:7.0f}x"
        agree = "" if r["agree"] is None else str(r["agree"])
        lines.append(
            f"{r['k']:>5} {r['prior']:<13}{r['epsilon']:>4g} {r['loss']:<9}{r['bins']:>5} "
            f"{_ms(r['ours_median_s'])} {_ms(r['ours_min_s'])} {_ms(r['ours_cpu_median_s'])} "
            f"{budget:>7}{ok:<5}"
            f"{ref:>10} {ratio:>8}  {agree}"
        )
    return "\n".join(lines)


def main() -> None:
    load_before = os.getloadavg()
    rows = run()
    load_after = os.getloadavg()
    print(table(rows))
    print(
        "\nours ms: median wall clock; min ms: fastest run; cpu ms: median thread CPU time."
        f"\nload average (1, 5, 15 min) before {load_before}, after {load_after}"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "rr_on_bins.optimal_bins vs Algorithm 2 (O(k^3))",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
