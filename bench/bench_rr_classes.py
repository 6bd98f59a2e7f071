"""Randomized response over many classes: what a release's fit and manifest cost.

``rr`` used to be a ``FiniteMechanism`` with its K×K matrix, built at every fit
and stored in the release's manifest; now it is (K, ε)
(``label_party.mechanisms.classification.RandomizedResponse``). For each K this
times the fit plus the manifest's JSON, as a release makes them, both ways (the
matrix way up to K = 3,000: past it the matrix takes gigabytes), and sampling 10⁶
labels.

Run: ``.venv/bin/python -m bench.bench_rr_classes [--quick] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from label_party.mechanisms.classification import RandomizedResponse
from label_party.mechanisms.registry import fit

RESULTS = Path(__file__).parent / "results" / "rr_classes.json"
MATRIX_MAX = 3000


def _manifest(k: int, *, matrix: bool) -> dict[str, Any]:
    start = time.perf_counter()
    mech = fit("rr", epsilon=1.0, values=np.arange(float(k)), prior=np.full(k, 1.0 / k))
    assert isinstance(mech, RandomizedResponse)
    described = mech.describe()
    if matrix:  # the manifest before 0bdf212: the K×K matrix, whatever its size
        finite = mech.as_finite()
        described = {**finite.describe(), "matrix": finite.matrix.tolist()}
    size = len(json.dumps(described))
    return {"seconds": time.perf_counter() - start, "manifest_bytes": size}


def run(classes: list[int], samples: int) -> dict[str, Any]:
    rows = []
    for k in classes:
        row: dict[str, Any] = {"classes": k, "rr": _manifest(k, matrix=False)}
        if k <= MATRIX_MAX:
            row["matrix"] = _manifest(k, matrix=True)
        labels = np.random.default_rng(k).integers(0, k, size=samples).astype(np.float64)
        start = time.perf_counter()
        RandomizedResponse(1.0, k).sample(labels, rng=np.random.default_rng(0))
        row["sample_seconds"] = time.perf_counter() - start
        rows.append(row)
        print(json.dumps(row))
    return {"samples": samples, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="K ≤ 1,000 and 10⁴ samples")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"default {RESULTS}")
    args = parser.parse_args()
    classes = [10, 1000] if args.quick else [10, 1000, 3000, 100_000]
    result = run(classes, 10_000 if args.quick else 1_000_000)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
