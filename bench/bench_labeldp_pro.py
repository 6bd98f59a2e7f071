"""LabelDP-Pro vs DP-SGD vs RR on a Fashion-MNIST subsample (``labeldp-pro.txt`` Table 14).

``python -m bench.bench_labeldp_pro [--quick] [--dataset mnist-5k]`` writes
``bench/results/labeldp_pro.json`` (``labeldp_pro_quick.json`` with ``--quick``,
``labeldp_pro_mnist5k*.json`` on mnist-5k) and prints a markdown table beside the
paper's numbers for the dataset (Table 14: Fashion-MNIST; Table 5a: MNIST).

Methods, all with the paper's Table-10a CNN (:class:`shared.torch_models.ImageCNN`):

* ``dp-sgd`` — Algorithm 1 with the NOOP denoiser;
* ``labeldp-pro`` — Algorithm 1 with ALTCONV (λ from the settings: 1, no §3.3
  smoothing, which measured lower with clipped columns; bench/README.md);
* ``rr`` — K-ary randomized response on the training labels at ε, then ordinary
  cross-entropy training on the noisy labels (a local helper below: bench only).

``--epsilons inf`` is an ablation, not a private run: DP-SGD and LabelDP-Pro train
with σ = 0 (everything else unchanged) and RR on the true labels, which measures
each method's noise-free cap under the same training budget.

(ε, δ = 1/n) as in the paper; every (method, ε) runs with 3 seeds and reports test
accuracy mean ± std, plus the per-epoch time ratio LabelDP-Pro / DP-SGD (paper
Table 11: 1.11–3.84× on GPUs with JAX).

By default the runs train on the CPU, one torch thread each (``--jobs`` in
parallel); ``--device cuda`` trains them on the GPU (the H100 results in
bench/README.md). ``--train`` can take a fixed (public, seeded) subsample of
Zalando's 60k training split; the test split is its 10k images. The defaults
train 3 epochs with a small ALTCONV batch (all printed and stored), where the
paper trains up to 10 epochs with tuned hyper-parameters; the comparison between
methods at equal settings is the point. Seeds here are fixed for reproducibility:
the library's production default is an OS-seeded generator.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional

from bench.devices import add_device_argument, check_device, gpu_name, synchronize
from label_party.labeldp_pro import LabelDPProConfig, train_labeldp_pro
from label_party.labeldp_pro.dpsgd import SecretDraws, _EpochStats, _Loop, _make_optimizer
from labeldp.datasets import fashion_mnist_arrays, mnist_5k_arrays
from shared.torch_models import ImageCNN, ImageCNNConfig

RESULTS = Path(__file__).parent / "results"
NUM_CLASSES = 10
#: Public normalization constants (mean, std of the training pixels) by dataset.
PIXEL_STATS: dict[str, tuple[float, float]] = {
    "fashion-mnist": (0.2860, 0.3530),
    "mnist-5k": (0.1307, 0.3081),
}
DATASETS = tuple(PIXEL_STATS)

#: Table 14 of the paper (Fashion-MNIST, full data), test accuracy %.
PAPER_TABLE_14: dict[float, dict[str, float]] = {
    0.01: {"rr": 13.9, "dp-sgd": 59.1, "labeldp-pro": 63.0},
    0.1: {"rr": 15.7, "dp-sgd": 73.4, "labeldp-pro": 75.7},
    0.2: {"rr": 19.8, "dp-sgd": 75.6, "labeldp-pro": 77.9},
    0.5: {"rr": 46.9, "dp-sgd": 79.7, "labeldp-pro": 79.8},
    1.0: {"rr": 75.7, "dp-sgd": 81.5, "labeldp-pro": 81.7},
    2.0: {"rr": 84.6, "dp-sgd": 82.3, "labeldp-pro": 82.4},
}
#: Table 5a of the paper (MNIST, all 60,000 training images), test accuracy %.
PAPER_TABLE_5A: dict[float, dict[str, float]] = {
    0.01: {"rr": 6.5, "dp-sgd": 65.3, "labeldp-pro": 68.2},
    0.1: {"rr": 7.3, "dp-sgd": 85.6, "labeldp-pro": 91.1},
    0.2: {"rr": 8.1, "dp-sgd": 87.9, "labeldp-pro": 92.9},
    0.5: {"rr": 10.4, "dp-sgd": 90.9, "labeldp-pro": 94.1},
    1.0: {"rr": 51.3, "dp-sgd": 92.8, "labeldp-pro": 94.3},
    2.0: {"rr": 96.7, "dp-sgd": 93.8, "labeldp-pro": 95.4},
}
#: The paper's table for each dataset: (its name, its rows).
PAPER_TABLES = {"fashion-mnist": ("14", PAPER_TABLE_14), "mnist-5k": ("5a", PAPER_TABLE_5A)}
METHODS = ("rr", "dp-sgd", "labeldp-pro")


@dataclass(frozen=True)
class Settings:
    train: int
    test: int
    epsilons: tuple[float, ...]
    seeds: tuple[int, ...]
    epochs: int
    batch_size: int
    clip_norm: float
    learning_rate: float
    optimizer: str
    alt_batch_size: int
    projection_steps: int
    smoothing: float
    rr_epochs: int
    rr_batch_size: int
    rr_learning_rate: float
    #: §3.2's plain PGD, the paper's method (``"fista"`` is the library's option).
    projection_method: str = "pgd"
    dataset: str = "fashion-mnist"
    #: ``"dense"`` holds G in memory (the same projection, faster on small models).
    projection_backend: str = "autodiff"
    #: Where the runs train: ``"cpu"`` (one torch thread a run) or ``"cuda"``.
    device: str = "cpu"
    #: ALTCONV's noise-bias correction (beyond the paper; 0: the paper's ALTCONV).
    debias_draws: int = 0


FULL = Settings(
    train=60_000,
    test=10_000,
    epsilons=(0.1, 0.5, 1.0),
    seeds=(0, 1, 2),
    epochs=3,
    batch_size=1024,
    clip_norm=1.0,
    learning_rate=0.3,
    optimizer="momentum",
    alt_batch_size=64,
    projection_steps=100,
    smoothing=1.0,
    rr_epochs=3,
    rr_batch_size=128,
    rr_learning_rate=0.05,
    projection_method="fista",
)
QUICK = Settings(
    train=2_000,
    test=500,
    epsilons=(0.5,),
    seeds=(0,),
    epochs=2,
    batch_size=200,
    clip_norm=1.0,
    learning_rate=0.3,
    optimizer="momentum",
    alt_batch_size=8,
    projection_steps=20,
    smoothing=1.0,
    rr_epochs=2,
    rr_batch_size=128,
    rr_learning_rate=0.05,
    projection_method="fista",
)

#: mnist-5k (issue 7 allows "an MNIST subset"): 4,000 images to train on, 1,000 to
#: test; batches of 256 (q = 0.064) so that 10 epochs still make 160 steps.
MNIST_5K = replace(
    FULL,
    dataset="mnist-5k",
    train=4_000,
    test=1_000,
    epochs=10,
    batch_size=256,
    rr_epochs=10,
)


def load_subsample(
    train: int, test: int, dataset: str = "fashion-mnist"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Normalized ``[n, 1, 28, 28]`` images and labels; a seeded public subsample.

    Fashion-MNIST: ``train`` of Zalando's 60k training split, ``test`` of its 10k
    test split. mnist-5k has no split (and its rows are sorted by digit): one
    seeded permutation of its 5,000 rows, the first ``train`` to train on and the
    next ``test`` to test on.
    """
    mean, std = PIXEL_STATS[dataset]
    if dataset == "fashion-mnist":
        images, labels = fashion_mnist_arrays()
        order_train = np.random.default_rng(2024).permutation(60_000)[:train]
        order_test = 60_000 + np.random.default_rng(2025).permutation(10_000)[:test]
    else:
        images, labels = mnist_5k_arrays()
        if train + test > images.shape[0]:
            raise ValueError(f"mnist-5k has {images.shape[0]} images: {train} + {test} is more")
        order = np.random.default_rng(2024).permutation(images.shape[0])
        order_train, order_test = order[:train], order[train : train + test]

    def prep(rows: np.ndarray) -> tuple[Tensor, Tensor]:
        x = (images[rows].astype(np.float32) / 255.0 - mean) / std
        return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(labels[rows])

    x_train, y_train = prep(order_train)
    x_test, y_test = prep(order_test)
    return x_train, y_train, x_test, y_test


def randomized_response(labels: Tensor, epsilon: float, seed: int) -> Tensor:
    """K-ary RR (§2.2): keep w.p. e^ε/(e^ε+K−1), else a uniform *other* class."""
    if math.isinf(epsilon):
        return labels.clone()
    rng = np.random.default_rng(seed)
    y = labels.numpy()
    keep = rng.random(y.size) < math.exp(epsilon) / (math.exp(epsilon) + NUM_CLASSES - 1)
    shift = rng.integers(1, NUM_CLASSES, size=y.size)
    noisy = np.where(keep, y, (y + shift) % NUM_CLASSES)
    return torch.from_numpy(noisy.astype(np.int64))


def train_rr(
    x: Tensor, y: Tensor, epsilon: float, seed: int, s: Settings
) -> tuple[nn.Module, float]:
    torch.manual_seed(seed)
    model = ImageCNN(ImageCNNConfig()).to(s.device)
    noisy = randomized_response(y, epsilon, seed).to(s.device)
    x = x.to(s.device)
    opt = torch.optim.SGD(model.parameters(), lr=s.rr_learning_rate, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(s.rr_epochs):
        order = torch.randperm(x.shape[0], generator=gen).to(s.device)
        for i in range(0, x.shape[0], s.rr_batch_size):
            rows = order[i : i + s.rr_batch_size]
            loss = functional.cross_entropy(model(x[rows]), noisy[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
    synchronize(s.device)
    return model, (time.perf_counter() - start) / s.rr_epochs


def train_private(
    x: Tensor, y: Tensor, epsilon: float, seed: int, denoiser: str, s: Settings
) -> tuple[nn.Module, float, dict[str, Any] | None]:
    """Algorithm 1 at ε through the library; ε = ∞ runs it with σ = 0 (below)."""
    torch.manual_seed(seed)
    model = ImageCNN(ImageCNNConfig())
    config = LabelDPProConfig(
        epsilon=1.0 if math.isinf(epsilon) else epsilon,
        delta=1.0 / x.shape[0],
        num_classes=NUM_CLASSES,
        denoiser=denoiser,  # type: ignore[arg-type]
        epochs=s.epochs,
        expected_batch_size=s.batch_size,
        clip_norm=s.clip_norm,
        learning_rate=s.learning_rate,
        optimizer=s.optimizer,  # type: ignore[arg-type]
        alt_batch_size=s.alt_batch_size,
        projection_steps=s.projection_steps,
        projection_method=s.projection_method,  # type: ignore[arg-type]
        projection_backend=s.projection_backend,  # type: ignore[arg-type]
        smoothing=s.smoothing,
        debias_draws=s.debias_draws if denoiser == "alt-conv" else 0,
        device=s.device,
    )
    gen = torch.Generator(device=s.device).manual_seed(10_000 + seed)
    if math.isinf(epsilon):
        return model, train_noise_free(model, x, y, config, gen), None
    result = train_labeldp_pro(model, x, y, config=config, generator=gen)
    per_epoch = statistics.fmean(e.seconds for e in result.history)
    return result.model, per_epoch, result.accounting.to_dict()


def train_noise_free(
    model: nn.Module, x: Tensor, y: Tensor, config: LabelDPProConfig, gen: torch.Generator
) -> float:
    """Algorithm 1 with σ = 0: each denoiser's *noise-free cap* (seconds per epoch).

    Not private, so it cannot go through ``train_labeldp_pro``, which refuses a σ
    above its ε; it drives the library's own step loop instead. Clipping,
    sampling and the projection are unchanged, so the gap between ``dp-sgd`` and
    ``labeldp-pro`` here is the projection's bias alone.
    """
    n, device = int(x.shape[0]), torch.device(config.device)
    steps_per_epoch = max(1, round(n / config.expected_batch_size))
    model.to(device)
    optimizer = _make_optimizer(model, config)
    x, y = x.to(device), y.to(device)
    draws = SecretDraws(gen)  # seeded: the bench's runs repeat
    loop = _Loop(model, x, y, config, 0.0, config.expected_batch_size / n, gen, draws, optimizer)
    started = time.perf_counter()
    for _ in range(config.epochs * steps_per_epoch):
        loop.step(_EpochStats(device))
    synchronize(config.device)
    return (time.perf_counter() - started) / config.epochs


@torch.no_grad()
def accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    model.eval()
    device = next(model.parameters()).device
    chunks = [model(x[i : i + 1000].to(device)).argmax(dim=1).cpu() for i in range(0, len(x), 1000)]
    return float((torch.cat(chunks) == y).double().mean()) * 100


def summarize(runs: list[dict[str, Any]], s: Settings) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for eps in s.epsilons:
        row: dict[str, Any] = {}
        for method in METHODS:
            accs = [r["accuracy"] for r in runs if r["epsilon"] == eps and r["method"] == method]
            if accs:
                row[method] = {
                    "mean": statistics.fmean(accs),
                    "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                    "runs": len(accs),
                }
        table[str(eps)] = row
    ratios = []
    for eps in s.epsilons:
        for seed in s.seeds:
            pro = [
                r
                for r in runs
                if (r["epsilon"], r["seed"], r["method"]) == (eps, seed, "labeldp-pro")
            ]
            sgd = [
                r for r in runs if (r["epsilon"], r["seed"], r["method"]) == (eps, seed, "dp-sgd")
            ]
            if pro and sgd:
                ratios.append(pro[0]["seconds_per_epoch"] / sgd[0]["seconds_per_epoch"])
    return {
        "accuracy": table,
        "epoch_time_ratio_labeldp_pro_over_dp_sgd": {
            "mean": statistics.fmean(ratios) if ratios else None,
            "min": min(ratios) if ratios else None,
            "max": max(ratios) if ratios else None,
        },
    }


def markdown(summary: dict[str, Any], s: Settings) -> str:
    lines = [
        f"{s.dataset}: {s.train} train / {s.test} test, {s.epochs} epochs, "
        f"batch {s.batch_size}, δ = 1/{s.train}, ALTCONV n₂ = {s.alt_batch_size}, "
        f"{s.projection_steps} {s.projection_method} projection steps, λ = {s.smoothing}, "
        f"{s.debias_draws} noise-bias draws, "
        f"{len(s.seeds)} seed(s); paper: full 60k/10k.",
        "",
        "| ε | RR (ours) | DP-SGD (ours) | LabelDP-Pro (ours) | RR (paper) "
        "| DP-SGD (paper) | LabelDP-Pro (paper) |",
        "|---|---|---|---|---|---|---|",
    ]
    for eps in s.epsilons:
        row = summary["accuracy"][str(eps)]
        cells = []
        for method in METHODS:
            cell = row.get(method)
            cells.append("—" if cell is None else f"{cell['mean']:.1f} ± {cell['std']:.1f}")
        paper = PAPER_TABLES[s.dataset][1].get(eps, {})
        ref = [f"{paper[m]:.1f}" if m in paper else "—" for m in METHODS]
        lines.append(f"| {eps} | " + " | ".join(cells + ref) + " |")
    ratio = summary["epoch_time_ratio_labeldp_pro_over_dp_sgd"]
    if ratio["mean"] is not None:
        lines += [
            "",
            f"Per-epoch time LabelDP-Pro / DP-SGD: {ratio['mean']:.2f}× "
            f"(min {ratio['min']:.2f}, max {ratio['max']:.2f}); paper Table 11: 1.11–3.84×.",
        ]
    return "\n".join(lines)


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~2-minute smoke run")
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default="fashion-mnist",
        help="fashion-mnist (60k, the default) or mnist-5k (its own settings: 4k/1k, "
        "batch 256, 10 epochs)",
    )
    parser.add_argument(
        "--projection-method",
        choices=("pgd", "fista"),
        help="ALTCONV's solver (default: the settings', FISTA; PGD is §3.2's)",
    )
    parser.add_argument("--projection-steps", type=int, help="PGD/FISTA steps per projection")
    parser.add_argument(
        "--projection-backend",
        choices=("autodiff", "dense"),
        help="how G is applied (default autodiff; dense holds it in memory)",
    )
    parser.add_argument("--smoothing", type=float, help="§3.3's λ (default 1: no smoothing)")
    parser.add_argument(
        "--debias-draws", type=int,
        help="LabelDP-Pro: subtract the projection's noise bias estimated from this many "
        "public draws (default 0, the paper's ALTCONV; denoisers.projection_noise_bias)",
    )  # fmt: skip
    parser.add_argument("--train", type=int, help="training images (default 60000)")
    parser.add_argument("--epochs", type=int, help="DP-SGD/LabelDP-Pro epochs (default 3)")
    parser.add_argument(
        "--learning-rate", type=float, help="DP-SGD/LabelDP-Pro learning rate (default 0.3)"
    )
    parser.add_argument("--alt-batch-size", type=int, help="ALTCONV's n₂ (default 64)")
    parser.add_argument(
        "--epsilons",
        type=float,
        nargs="+",
        help="privacy budgets; inf: the noise-free ablation (σ = 0, not private)",
    )
    parser.add_argument("--seeds", type=int, help="how many seeds, from --first-seed (default 3)")
    parser.add_argument(
        "--first-seed", type=int, default=0,
        help="start the seeds here: --first-seed 2 --seeds 1 runs seed 2 only (to add a "
        "seed to a table without running the others again)",
    )  # fmt: skip
    parser.add_argument(
        "--methods", nargs="+", choices=METHODS, default=list(METHODS), help="subset to run"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs in parallel, one torch thread each"
    )
    add_device_argument(parser, "where the runs train (default cpu, one thread a run)")
    parser.add_argument("--out", type=Path, help="result JSON (default bench/results/…)")
    args = parser.parse_args()
    check_device(parser, args.device)
    return args


def _settings(args: argparse.Namespace) -> Settings:
    s = QUICK if args.quick else (MNIST_5K if args.dataset == "mnist-5k" else FULL)
    if args.quick:
        s = replace(s, dataset=args.dataset)
    overrides = {
        "projection_method": args.projection_method,
        "projection_steps": args.projection_steps,
        "projection_backend": args.projection_backend,
        "smoothing": args.smoothing,
        "debias_draws": args.debias_draws,
        "train": args.train,
        "epochs": args.epochs,
        "learning_rate": args.learning_rate,
        "alt_batch_size": args.alt_batch_size,
        "epsilons": tuple(args.epsilons) if args.epsilons else None,
    }
    count = args.seeds or len(s.seeds)
    overrides["seeds"] = tuple(range(args.first_seed, args.first_seed + count))
    return replace(s, **{k: v for k, v in overrides.items() if v is not None}, device=args.device)


_DATA: tuple[Tensor, Tensor, Tensor, Tensor] | None = None


def _run(task: tuple[Settings, int, float, str]) -> dict[str, Any]:
    """One (seed, ε, method): train, then test accuracy on the held-out images."""
    s, seed, eps, method = task
    global _DATA
    torch.set_num_threads(1)
    if _DATA is None:
        _DATA = load_subsample(s.train, s.test, s.dataset)
    x_train, y_train, x_test, y_test = _DATA
    t0 = time.perf_counter()
    record: dict[str, Any] | None = None
    if method == "rr":
        model, per_epoch = train_rr(x_train, y_train, eps, seed, s)
    else:
        denoiser = "noop" if method == "dp-sgd" else "alt-conv"
        model, per_epoch, record = train_private(x_train, y_train, eps, seed, denoiser, s)
    return {
        "method": method,
        "epsilon": eps,
        "seed": seed,
        "accuracy": accuracy(model, x_test, y_test),
        "seconds_per_epoch": per_epoch,
        "seconds_total": time.perf_counter() - t0,
        "accounting": record,
    }


def main() -> None:
    args = _options()
    s = _settings(args)
    name = "labeldp_pro" + ("_mnist5k" if s.dataset == "mnist-5k" else "")
    name += "_quick" if args.quick else ""
    out = args.out or RESULTS / f"{name}.json"
    command = "python -m bench.bench_labeldp_pro " + " ".join(sys.argv[1:])
    # Slowest first (ALTCONV), so the parallel runs finish together.
    order = {"labeldp-pro": 0, "dp-sgd": 1, "rr": 2}
    tasks = sorted(
        ((s, seed, eps, m) for seed in s.seeds for eps in s.epsilons for m in args.methods),
        key=lambda t: (order[t[3]], t[1], t[2]),
    )
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(max(1, args.jobs)) as pool:
        for run in pool.imap_unordered(_run, tasks):
            runs.append(run)
            print(
                f"seed {run['seed']} ε {run['epsilon']} {run['method']}: "
                f"{run['accuracy']:.1f}% ({run['seconds_per_epoch']:.1f} s/epoch, "
                f"{time.perf_counter() - started:.0f} s so far, {len(runs)}/{len(tasks)})",
                flush=True,
            )
            _write(out, command, s, runs, time.perf_counter() - started)
    print()
    print(markdown(summarize(runs, s), s))
    print(f"\nwrote {out}")


def _write(
    out: Path, command: str, s: Settings, runs: list[dict[str, Any]], elapsed: float
) -> None:
    payload = {
        "benchmark": "labeldp_pro",
        "command": command.strip(),
        "settings": asdict(s),
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads_per_run": 1,
            **gpu_name(s.device),
        },
        f"paper_table_{PAPER_TABLES[s.dataset][0]}": {
            str(k): v for k, v in PAPER_TABLES[s.dataset][1].items()
        },
        "summary": summarize(runs, s),
        "runs": sorted(runs, key=lambda r: (r["epsilon"], r["method"], r["seed"])),
        "elapsed_seconds": elapsed,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
