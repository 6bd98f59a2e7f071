"""Sampling 10 million labels through a fitted finite mechanism.

Target (issue 2): ≤ 1 s, and working memory that does not grow with the number of
labels beyond the input and output arrays. ``working_mib`` is the peak memory
traced by ``tracemalloc`` (numpy reports its allocations to it) minus the output
array: it is set by the chunk size, not by the number of labels.

Run: ``.venv/bin/python -m bench.bench_sampling``.
"""

from __future__ import annotations

import json
import math
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from label_party.mechanisms.base import FiniteMechanism

RESULTS = Path(__file__).parent / "results" / "sampling.json"


def _rr_on_grid(k: int, m: int, epsilon: float) -> FiniteMechanism:
    """An ε-DP matrix of RR-on-bins shape: k inputs mapped onto m bins."""
    bins = np.minimum(np.arange(k) * m // k, m - 1)
    e = math.exp(epsilon)
    matrix = np.full((k, m), 1.0 / (e + m - 1))
    matrix[np.arange(k), bins] = e / (e + m - 1)
    return FiniteMechanism(
        "bench", epsilon, np.arange(k, dtype=float), np.arange(m, dtype=float), matrix
    )


def _naive_sample(
    mech: FiniteMechanism, labels: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Straightforward reference: one ``rng.choice`` per distinct input value."""
    out = np.empty(labels.size)
    for i, value in enumerate(mech.inputs):
        mask = labels == value
        out[mask] = rng.choice(mech.outputs, size=int(mask.sum()), p=mech.matrix[i])
    return out


def _time(fn: Any, repeat: int = 3) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run(n: int = 10_000_000) -> list[dict[str, Any]]:
    rows = []
    for k, m in [(52, 14), (401, 40), (2000, 200)]:
        mech = _rr_on_grid(k, m, 1.0)
        rng = np.random.default_rng(0)
        labels = rng.integers(0, k, size=n).astype(np.float64)
        seconds = _time(lambda mech=mech, labels=labels, rng=rng: mech.sample(labels, rng=rng))
        naive = _time(
            lambda mech=mech, labels=labels, rng=rng: _naive_sample(mech, labels, rng), repeat=1
        )
        tracemalloc.start()
        mech.sample(labels, rng=rng)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        peak -= n * 8  # the output array itself
        rows.append(
            {
                "inputs": k,
                "outputs": m,
                "labels": n,
                "seconds": round(seconds, 3),
                "naive_seconds": round(naive, 3),
                "speedup": round(naive / seconds, 1),
                "working_mib": round(peak / 2**20, 1),
                "output_array_mib": round(n * 8 / 2**20, 1),
            }
        )
    return rows


def main() -> None:
    rows = run()
    print(f"{'k':>5} {'m':>4} {'labels':>10} {'s':>7} {'naive s':>8} {'x':>6} {'work MiB':>9}")
    for r in rows:
        print(
            f"{r['inputs']:>5} {r['outputs']:>4} {r['labels']:>10} {r['seconds']:>7} "
            f"{r['naive_seconds']:>8} {r['speedup']:>6} {r['working_mib']:>9}"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
