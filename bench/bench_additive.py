"""Sampling 10 million labels through each additive-noise mechanism and rounding.

Each row is the best of ``repeat`` wall-clock runs of ``mechanism.sample(labels)``
(one generator, default chunk size) on uniformly spread labels in the declared
range, plus the peak memory traced by ``tracemalloc`` during one more run, less
the output array (numpy reports its allocations to tracemalloc).

Run: ``.venv/bin/python -m bench.bench_additive`` (writes ``bench/results/additive.json``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from label_party.mechanisms import additive, rounding
from label_party.mechanisms.base import FitRequest, FloatArray

RESULTS = Path(__file__).parent / "results" / "additive.json"

LO, HI = 0.0, 400.0  # the Criteo-like range of the papers' experiments (E.1)
EPSILON = 1.0

CASES: list[tuple[str, Callable[[FitRequest], Any], dict[str, Any]]] = [
    ("laplace", additive.laplace_from_request, {}),
    ("laplace clip", additive.laplace_from_request, {"clip": True}),
    ("laplace discrete", additive.laplace_from_request, {"discrete": True}),
    ("staircase", additive.staircase_from_request, {}),
    ("staircase clip", additive.staircase_from_request, {"clip": True}),
    ("staircase discrete", additive.staircase_from_request, {"discrete": True}),
    ("exponential", additive.exponential_from_request, {}),
    ("randomized-rounding", rounding.from_request, {"grid_size": 41}),
]


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run(n: int = 10_000_000, repeat: int = 3) -> list[dict[str, Any]]:
    """Time each mechanism on ``n`` labels; write and return the rows."""
    values = np.arange(LO, HI + 1.0)
    prior = np.full(values.size, 1.0 / values.size)
    rng = np.random.default_rng(0)
    continuous = rng.uniform(LO, HI, n)
    integer = np.floor(continuous)
    rows: list[dict[str, Any]] = []
    for label, factory, params in CASES:
        request = FitRequest(
            epsilon=EPSILON, values=values, prior=prior, domain=(LO, HI), params=params
        )
        mech = factory(request)
        labels: FloatArray = integer if params.get("discrete") else continuous

        def sample(mech: Any = mech, labels: FloatArray = labels) -> object:
            return mech.sample(labels, rng=rng)

        seconds = _best(sample, repeat)
        tracemalloc.start()
        sample()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rows.append(
            {
                "mechanism": label,
                "params": params,
                "epsilon": EPSILON,
                "bounds": [LO, HI],
                "labels": n,
                "seconds": round(seconds, 3),
                "mlabels_per_s": round(n / seconds / 1e6, 1),
                "working_mib": round((peak - n * 8) / 2**20, 1),
            }
        )
    meta = {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "load_1min": os.getloadavg()[0],
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    return rows


def main() -> None:
    rows = run()
    print(f"{'mechanism':<20} {'labels':>10} {'s':>7} {'M/s':>6} {'work MiB':>9}")
    for r in rows:
        print(
            f"{r['mechanism']:<20} {r['labels']:>10} {r['seconds']:>7} "
            f"{r['mlabels_per_s']:>6} {r['working_mib']:>9}"
        )


if __name__ == "__main__":
    main()
