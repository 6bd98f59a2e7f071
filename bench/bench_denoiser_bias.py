"""How far ALTCONV's denoised gradient is from the true one, by n₂ (``labeldp-pro.txt``
Lemma 4: ``E‖Proj_A(g̃) − g‖² ≤ O(C²(1/n₁ + 1/n₂ + σ√log(Kn₂)/√n₁))``).

At a model state reached by DP-SGD on Fashion-MNIST (the bench's CNN and settings),
for a Poisson batch of ``B`` images with their true labels: ``g`` is the mean of
the clipped per-example gradients (Algorithm 1 without noise) and ``g̃ = g + e``
the privatized one at the bench's σ for each ε. For each alternative-batch size
n₂ and several independent alternative batches and noise draws it reports

* ``cos``: the mean cosine of the denoised gradient with ``g`` (DP-SGD: of ``g̃``);
* ``norm``: the mean ‖denoised‖/‖g‖;
* ``error``: the mean ‖denoised − g‖/‖g‖ (DP-SGD: ‖e‖/‖g‖);
* ``bias``: ‖mean(denoised) − g‖/‖g‖ over the draws — what does not average out
  over steps, plus the variance left by averaging only ``--draws`` draws (so for
  DP-SGD it is ``error/√draws``, not its expectation 0): compare it across rows
  with the same draws only;
* ``systematic``: the part of ``bias`` that more draws would not shrink,
  ``b² = (draws·bias² − mean error²)/(draws − 1)`` (0 for DP-SGD up to sampling);
* ``mean_scale`` and ``bias_across``: the bias split along ``g`` (the mean output's
  length in units of ``g``: a rescaled step, as a learning rate would make) and
  across it (a wrong direction);
* ``layers``: per parameter tensor, the cosine of the mean output with ``g``'s
  part and their norm ratio — the overall numbers are dominated by the largest
  layers, and a projection that loses the small ones (convolutions, biases)
  looks fine in them.

``--epsilons inf`` measures σ = 0: what the projection does to the noise-free
gradient, i.e. its bias alone. ``--smoothing`` applies §3.3's coefficient
smoothing ``λ`` to the same projections (one row per λ; λ = 1 is the plain
projection, the training's default is 0.75): it pulls every output toward the
mean of the per-class gradients, so it trades the projection's error for a
label-free direction — this measures where that trade pays.

    python -m bench.bench_denoiser_bias [--alt-batch-sizes 64 256 1024] [--draws 4]
        [--epsilons 0.1 1 inf] [--projection-steps 100] [--projection-backend dense]
        [--smoothing 1 0.75 0.5]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bench.bench_labeldp_pro import FULL, load_subsample
from label_party.labeldp_pro.denoisers import (
    Params,
    eval_mode,
    per_class_gradients,
    project_convex_hull,
    projection_noise_bias,
    smooth,
    trainable_parameters,
    unflatten,
)
from label_party.labeldp_pro.dpsgd import LabelDPProConfig, clipped_gradient_sum, train_labeldp_pro
from shared.torch_models import ImageCNN, ImageCNNConfig

RESULTS = Path(__file__).resolve().parent / "results"
#: σ of the bench's runs (bench/results/labeldp_pro.json, 177 steps, q = 1024/60000).
SIGMAS = {0.1: 15.257, 0.5: 3.927, 1.0: 2.604, math.inf: 0.0}
NUM_CLASSES = 10


def _cos(a: Tensor, b: Tensor) -> float:
    return float(torch.dot(a, b) / (a.norm() * b.norm()).clamp(min=1e-12))


def _stats(outputs: list[Tensor], g: Tensor, like: Params) -> dict[str, Any]:
    gn, draws = float(g.norm()), len(outputs)
    mean = torch.stack(outputs).mean(dim=0)
    bias2 = float((mean - g).norm()) ** 2
    mse = statistics.fmean(float((o - g).norm()) ** 2 for o in outputs)
    # E‖mean − g‖² = b² + (E‖o − g‖² − b²)/draws, solved for the systematic b.
    systematic2 = (draws * bias2 - mse) / (draws - 1) if draws > 1 else math.nan
    return {
        "cos": statistics.fmean(_cos(o, g) for o in outputs),
        "norm": statistics.fmean(float(o.norm()) / gn for o in outputs),
        "error": statistics.fmean(float((o - g).norm()) / gn for o in outputs),
        "bias": float((mean - g).norm()) / gn,
        "systematic": math.sqrt(max(systematic2, 0.0)) / gn,
        # The bias split: along g (a rescaled step, which the learning rate absorbs)
        # and across it (a wrong direction, which nothing absorbs).
        "mean_scale": float(torch.dot(mean, g)) / gn**2,
        "bias_across": float((mean - torch.dot(mean, g) / gn**2 * g).norm()) / gn,
        "layers": _layers(mean, g, like),
    }


def _layers(mean: Tensor, g: Tensor, like: Params) -> dict[str, dict[str, float]]:
    """Per parameter tensor: cos(mean output, g) and ‖mean output‖/‖g‖ on its slice."""
    out_parts, g_parts = unflatten(mean, like), unflatten(g, like)
    return {
        name: {
            "cos": _cos(out_parts[name].reshape(-1), part.reshape(-1)),
            "norm": float(out_parts[name].norm() / part.norm().clamp(min=1e-12)),
        }
        for name, part in g_parts.items()
    }


def _state(x: Tensor, y: Tensor, epochs: int) -> torch.nn.Module:
    """A model after ``epochs`` of plain DP-SGD at ε = 1 (the bench's settings)."""
    torch.manual_seed(0)
    model = ImageCNN(ImageCNNConfig())
    if epochs == 0:
        return model
    config = LabelDPProConfig(
        epsilon=1.0, delta=1 / x.shape[0], num_classes=NUM_CLASSES, denoiser="noop",
        epochs=epochs, expected_batch_size=FULL.batch_size, clip_norm=FULL.clip_norm,
        learning_rate=FULL.learning_rate, optimizer="momentum",
    )  # fmt: skip
    train_labeldp_pro(model, x, y, config=config, generator=torch.Generator().manual_seed(1))
    return model


def _row_name(n2: int, smoothing: float) -> str:
    """λ = 1 keeps the name of the rows measured before ``--smoothing`` existed."""
    return f"alt-conv n2={n2}" + ("" if smoothing == 1.0 else f" λ={smoothing:g}")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    x, y, _xt, _yt = load_subsample(FULL.train, 0)
    model = _state(x, y, args.epochs)
    gen = torch.Generator().manual_seed(2)
    rows = torch.randperm(x.shape[0], generator=gen)[: FULL.batch_size]
    params = {k: v.detach() for k, v in trainable_parameters(model).items()}
    with eval_mode(model):
        total, _loss = clipped_gradient_sum(
            model, params, x[rows], y[rows], clip_norm=FULL.clip_norm, physical_batch_size=256
        )
    g = total / FULL.batch_size
    out: dict[str, Any] = {"gradient_norm": float(g.norm()), "epsilons": {}}
    for eps in args.epsilons:
        noise_scale = SIGMAS[eps] * FULL.clip_norm / FULL.batch_size
        noisy = [g + noise_scale * torch.randn(g.shape, generator=gen) for _ in range(args.draws)]
        cell: dict[str, Any] = {"dp-sgd": _stats(noisy, g, params)}
        for n2 in args.alt_batch_sizes:
            started = time.perf_counter()
            denoised: dict[float, list[Tensor]] = {lam: [] for lam in args.smoothing}
            for target in noisy:
                alt = torch.randperm(x.shape[0], generator=gen)[:n2]
                with eval_mode(model):
                    op = per_class_gradients(model, x[alt], NUM_CLASSES,
                                             clip_norm=FULL.clip_norm,
                                             backend=args.projection_backend)  # fmt: skip
                    alpha = project_convex_hull(op, target, steps=args.projection_steps,
                                                method="fista")  # fmt: skip
                    bias = projection_noise_bias(
                        op, noise_scale, draws=args.debias_draws, generator=gen,
                        steps=args.projection_steps, method="fista",
                    ) if args.debias_draws else torch.zeros_like(target)  # fmt: skip
                    for lam, outputs in denoised.items():
                        outputs.append(op.matvec(smooth(alpha, lam)) - lam * bias)
            seconds = (time.perf_counter() - started) / args.draws
            for lam, outputs in denoised.items():
                row = _row_name(n2, lam)
                cell[row] = {**_stats(outputs, g, params), "seconds_per_projection": seconds}
                summary = {k: v for k, v in cell[row].items() if k != "layers"}
                print(f"ε={eps} {row}: {summary}", flush=True)
        out["epsilons"][str(eps)] = cell
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alt-batch-sizes", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 1.0], choices=SIGMAS)
    p.add_argument("--draws", type=int, default=4, help="alternative batches × noise draws")
    p.add_argument("--projection-steps", type=int, default=FULL.projection_steps)
    p.add_argument(
        "--projection-backend", choices=("autodiff", "dense"), default="autodiff",
        help="how G is applied (dense: held in memory; the same projection, faster)",
    )  # fmt: skip
    p.add_argument(
        "--smoothing", type=float, nargs="+", default=[1.0], metavar="λ",
        help="§3.3 coefficient smoothing applied to each projection (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--debias-draws", type=int, default=0,
        help="subtract projection_noise_bias estimated from this many draws (default 0)",
    )  # fmt: skip
    p.add_argument("--epochs", type=int, default=1, help="DP-SGD epochs before measuring")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "denoiser_bias.json")
    args = p.parse_args()
    if not all(0.0 <= lam <= 1.0 for lam in args.smoothing):
        p.error("--smoothing values must be in [0, 1]")
    started = time.perf_counter()
    result = measure(args)
    payload = {
        "benchmark": "denoiser_bias",
        "command": "python -m bench.bench_denoiser_bias " + " ".join(sys.argv[1:]),
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": args.threads,
        },
        "model_state": f"{args.epochs} epoch(s) of DP-SGD at ε = 1, seed 0",
        "projection": f"{args.projection_steps} FISTA steps, clipped columns, "
        f"{args.projection_backend} backend",
        "smoothing": args.smoothing,
        "debias_draws": args.debias_draws,
        "result": result,
        "elapsed_seconds": time.perf_counter() - started,
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
