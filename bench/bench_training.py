"""Training throughput of the papers' tabular MLP on CPU: the old path and the
new one, measured in the same run.

``python -m bench.bench_training`` writes ``bench/results/training.json``:
examples per second for each epoch of ``feature_party.training.loop.train`` (the
worker's code path, data already preprocessed into tensors) on synthetic data of
Criteo's shape — 13 numeric and 26 categorical columns, embedding dim 8, hidden
128-64, batch 8192, RMSProp with cosine decay — with at most 10k values per
column, with the jobs' default 100k (a table of ~0.5M rows at 400k examples,
~0.9M at 1M), and on a narrower shape (8+8).

Each shape is trained ``--reps`` times with each embedding update, alternating
(so a noisy, shared machine hurts both alike):

* ``before`` — ``embedding_updates="dense"``: dense gradient of the whole
  embedding table (``index_select`` backward = ``index_add``) and the optimizer
  over every row, every step (the code path before this change, and the one DDP
  still uses);
* ``after`` — ``embedding_updates="lazy"`` (the default in a single process):
  sparse embedding gradients, the configured optimizer applied to the touched
  rows only (``feature_party.training.optim``).

It reports min / median / max of the wall-clock examples per second over all
epochs of all repetitions, examples per CPU-second of each repetition (the work
done, less sensitive to other processes on a shared machine), the ratios
after/before, plus the machine's measured fp32 matmul rate, which bounds what any
implementation of this model can reach here (forward + backward ≈ 6 ·
multiply-adds of the dense layers per example).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from bench.devices import add_device_argument, check_device, gpu_name, synchronize
from feature_party.training.config import TrainingConfig
from feature_party.training.data import ColumnRoles, fit_preprocessing
from feature_party.training.dataset import TrainingData
from feature_party.training.loop import EmbeddingUpdates, train
from feature_party.training.losses import make_loss

RESULTS = Path(__file__).parent / "results" / "training.json"
RESULTS_CUDA = RESULTS.with_name("training_cuda.json")


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


def matmul_gflops(threads: int, device: str = "cpu") -> float:
    """The fp32 rate of a matmul of the first hidden layer's shape on ``device``."""
    torch.set_num_threads(threads)
    a, b = torch.randn(8192, 256, device=device), torch.randn(256, 128, device=device)
    for _ in range(3):
        a @ b
    synchronize(device)
    reps = 30
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    synchronize(device)
    return 2 * 8192 * 256 * 128 * reps / (time.perf_counter() - t) / 1e9


def dense_flops_per_example(data: TrainingData, config: TrainingConfig) -> int:
    width = len(data.preprocessing.numeric) + len(data.preprocessing.categorical) * 8
    macs = 0
    for h in [*config.hidden, 1]:
        macs += width * h
        width = h
    return 6 * macs  # forward 2·MACs, backward 4·MACs


def _summary(per_epoch: list[int]) -> dict[str, Any]:
    return {
        "examples_per_second_per_epoch": per_epoch,
        "min": min(per_epoch),
        "median": round(statistics.median(per_epoch)),
        "max": max(per_epoch),
    }


PATHS: dict[str, EmbeddingUpdates] = {"before": "dense", "after": "lazy"}


def run(
    name: str,
    n: int,
    numeric: int,
    categorical: int,
    vocab: int,
    epochs: int,
    reps: int,
    device: str = "cpu",
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
        device=device,  # type: ignore[arg-type]
    )
    per_epoch: dict[str, list[int]] = {label: [] for label in PATHS}
    per_cpu_second: dict[str, list[int]] = {label: [] for label in PATHS}
    for _ in range(reps):
        for label, updates in PATHS.items():
            cpu = time.process_time()
            result = train(data, config, device=torch.device(device), embedding_updates=updates)
            cpu = time.process_time() - cpu
            per_epoch[label] += [round(h["examples_per_second"]) for h in result.history]
            per_cpu_second[label].append(round(n * epochs / cpu))
            print(
                f"{name:<20} {label:<7} {per_epoch[label][-epochs:]} "
                f"({per_cpu_second[label][-1]:,} examples per CPU-second)",
                flush=True,
            )
    before, after = _summary(per_epoch["before"]), _summary(per_epoch["after"])
    for label, summary in (("before", before), ("after", after)):
        summary["examples_per_cpu_second_per_rep"] = per_cpu_second[label]
        summary["examples_per_cpu_second_max"] = max(per_cpu_second[label])
    return {
        "name": name,
        "examples": n,
        "numeric": numeric,
        "categorical": categorical,
        "max_vocab": vocab,
        "embedding_rows": int(sum(data.preprocessing.vocab_sizes)),
        "preprocess_seconds": round(prep, 2),
        "epochs_per_rep": epochs,
        "reps": reps,
        "before": {"embedding_updates": "dense", **before},
        "after": {"embedding_updates": "lazy", **after},
        "speedup_median": round(after["median"] / before["median"], 2),
        "speedup_max": round(after["max"] / before["max"], 2),
        "speedup_cpu_time": round(
            after["examples_per_cpu_second_max"] / before["examples_per_cpu_second_max"], 2
        ),
        "dense_flops_per_example": dense_flops_per_example(data, config),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per repetition")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each path")
    parser.add_argument("--threads", type=int, default=2)
    add_device_argument(parser, "where the model trains")
    parser.add_argument("--out", type=Path, help="result JSON (default bench/results/…)")
    args = parser.parse_args()
    check_device(parser, args.device)
    out_path = args.out or (RESULTS_CUDA if args.device == "cuda" else RESULTS)
    torch.set_num_threads(args.threads)
    load_at_start = os.getloadavg()[0]
    gflops = matmul_gflops(args.threads, args.device)
    shapes = [
        ("criteo-shape 13+26", 13, 26, 10_000),
        # The jobs' default max_vocab: the table grows with the data (Criteo-like).
        ("criteo 13+26 vocab100k", 13, 26, 100_000),
        ("narrow 8+8", 8, 8, 10_000),
    ]
    runs = [
        run(name, args.examples, numeric, categorical, vocab, args.epochs, args.reps, args.device)
        for name, numeric, categorical, vocab in shapes
    ]
    for r in runs:
        r["flop_bound_examples_per_second"] = round(gflops * 1e9 / r["dense_flops_per_example"])
    out = {
        "benchmark": f"feature_party.training.loop.train, {args.device.upper()}, batch 8192, "
        "emb 8, hidden 128-64",
        "command": "python -m bench.bench_training "
        f"--examples {args.examples} --epochs {args.epochs} --reps {args.reps} "
        f"--threads {args.threads}" + (" --device cuda" if args.device == "cuda" else ""),
        "torch": torch.__version__,
        "threads": args.threads,
        "cpu": platform.processor() or platform.machine(),
        **gpu_name(args.device),
        "load_average_at_start": load_at_start,
        "note": "shared, noisy machine: compare min/median/max of before and after, which "
        "were measured alternately in this run",
        "matmul_gflops_fp32": round(gflops, 1),
        "runs": runs,
    }
    out["load_average_at_end"] = os.getloadavg()[0]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\n{'shape':<20} {'path':<7} {'min':>9} {'median':>9} {'max':>9}  ex/s")
    for r in runs:
        for label in PATHS:
            x = r[label]
            print(f"{r['name']:<20} {label:<7} {x['min']:>9,} {x['median']:>9,} {x['max']:>9,}")
        print(
            f"{'':<20} {'ratio':<7} median ×{r['speedup_median']}, max ×{r['speedup_max']}, "
            f"CPU time ×{r['speedup_cpu_time']}"
        )


if __name__ == "__main__":
    main()
