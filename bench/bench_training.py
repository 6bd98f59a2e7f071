"""Training throughput of the papers' tabular MLP on CPU.

``python -m bench.bench_training`` writes ``bench/results/training.json``:
examples per second for each epoch of ``feature_party.training.loop.train`` (the
worker's code path, data already preprocessed into tensors) on synthetic data of
Criteo's shape — 13 numeric and 26 categorical columns, embedding dim 8, hidden
128-64, batch 8192, RMSProp with cosine decay — and on a narrower shape, plus the
machine's measured fp32 matmul rate, which bounds what any implementation of
this model can reach here (forward + backward ≈ 6 · parameters-of-the-dense-layers
FLOPs per example).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from feature_party.training.config import TrainingConfig
from feature_party.training.data import ColumnRoles, fit_preprocessing
from feature_party.training.dataset import TrainingData
from feature_party.training.loop import train
from feature_party.training.losses import make_loss

RESULTS = Path(__file__).parent / "results" / "training.json"


def synthetic_tensors(
    n: int, numeric: int, categorical: int, vocab: int, seed: int
) -> TrainingData:
    """Zipf-distributed categorical values (as in click logs), Gaussian numerics;
    preprocessed with the same code as a job (vocabulary + OOV, scaling)."""
    rng = np.random.default_rng(seed)
    cols: dict[str, Any] = {f"n{j}": rng.lognormal(size=n) for j in range(numeric)}
    for j in range(categorical):
        values = np.minimum(rng.zipf(1.3, size=n), vocab * 2).astype(np.int64)
        cols[f"c{j}"] = pa.array(values).cast(pa.string())
    table = pa.table(cols)
    roles = ColumnRoles(
        tuple(f"n{j}" for j in range(numeric)), tuple(f"c{j}" for j in range(categorical))
    )
    pre = fit_preprocessing(table, roles, max_vocab=vocab)
    tensors = pre.transform(table)
    y = torch.from_numpy(rng.normal(size=n).astype(np.float32))
    empty = pre.transform(table.slice(0, 0))
    return TrainingData(tensors, y, empty, y[:0], pre, make_loss("squared"), None)


def matmul_gflops(threads: int) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(8192, 256), torch.randn(256, 128)
    for _ in range(3):
        a @ b
    reps = 30
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * 8192 * 256 * 128 * reps / (time.perf_counter() - t) / 1e9


def dense_flops_per_example(data: TrainingData, config: TrainingConfig) -> int:
    width = len(data.preprocessing.numeric) + len(data.preprocessing.categorical) * 8
    macs = 0
    for h in [*config.hidden, 1]:
        macs += width * h
        width = h
    return 6 * macs  # forward 2·MACs, backward 4·MACs


def run(
    name: str, n: int, numeric: int, categorical: int, vocab: int, epochs: int
) -> dict[str, Any]:
    t0 = time.perf_counter()
    data = synthetic_tensors(n, numeric, categorical, vocab, seed=0)
    prep = time.perf_counter() - t0
    config = TrainingConfig(
        epochs=epochs,
        batch_size=8192,
        embedding_dim=8,
        hidden=[128, 64],
        validation_fraction=0.0,
        early_stopping_patience=None,
        device="cpu",
    )
    result = train(data, config, device=torch.device("cpu"))
    per_epoch = [round(h["examples_per_second"]) for h in result.history]
    return {
        "name": name,
        "examples": n,
        "numeric": numeric,
        "categorical": categorical,
        "max_vocab": vocab,
        "embedding_rows": int(sum(data.preprocessing.vocab_sizes)),
        "preprocess_seconds": round(prep, 2),
        "examples_per_second_per_epoch": per_epoch,
        "best_examples_per_second": max(per_epoch),
        "dense_flops_per_example": dense_flops_per_example(data, config),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gflops = matmul_gflops(args.threads)
    runs = [
        run("criteo-shape 13+26", args.examples, 13, 26, 10_000, args.epochs),
        run("narrow 8+8", args.examples, 8, 8, 10_000, args.epochs),
    ]
    for r in runs:
        r["flop_bound_examples_per_second"] = round(gflops * 1e9 / r["dense_flops_per_example"])
    out = {
        "benchmark": "feature_party.training.loop.train, CPU, batch 8192, emb 8, hidden 128-64",
        "command": "python -m bench.bench_training",
        "torch": torch.__version__,
        "threads": args.threads,
        "cpu": platform.processor() or platform.machine(),
        "load_average_at_start": os.getloadavg()[0],
        "matmul_gflops_fp32": round(gflops, 1),
        "runs": runs,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
