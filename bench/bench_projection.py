"""Cost of one ALTCONV projection by backend and n₂ (``labeldp-pro.txt`` §3.2).

On the Table-10a CNN (d = 9,066) over Fashion-MNIST training images, for each
alternative-batch size n₂ and each backend of
:func:`label_party.labeldp_pro.denoisers.per_class_gradients`:

* ``build_s``: building the operator — for ``autodiff`` the recorded reverse pass
  and the column norms, for ``dense`` the per-example Jacobians that become ``G``;
* ``step_ms``: one ``Gᵀ(G·u)``, the cost of a FISTA step (the median of
  ``--repeats``);
* ``projection_s``: a whole :func:`denoise` call with ``--steps`` FISTA steps, the
  way a training step pays for it (one call: it is 100+ steps long);
* ``g_mib``: the memory ``G`` takes when it is held (``dense``);
* ``max_rel_diff``: ``‖dense − autodiff‖/‖autodiff‖`` of the denoised gradients,
  which must be float rounding.

``autodiff`` is §3.2's memory-efficient path (never holds ``G``); ``dense`` holds
it. One torch thread, like one job of the training bench.

    python -m bench.bench_projection [--alt-batch-sizes 64 256 1024] [--steps 100 400]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bench.bench_labeldp_pro import FULL, load_subsample
from bench.devices import add_device_argument, check_device, gpu_name, synchronize
from label_party.labeldp_pro.denoisers import (
    PROJECTION_BACKENDS,
    denoise,
    eval_mode,
    per_class_gradients,
)
from shared.torch_models import ImageCNN, ImageCNNConfig

RESULTS = Path(__file__).resolve().parent / "results"
NUM_CLASSES = 10


def _median_seconds(fn: Any, repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_one(
    model: torch.nn.Module, inputs: Tensor, target: Tensor, steps: int, backend: str, repeats: int
) -> tuple[dict[str, float], Tensor]:
    """The four costs of one backend at one n₂, and its denoised gradient."""
    device = inputs.device
    with eval_mode(model):
        synchronize(device)
        start = time.perf_counter()
        op = per_class_gradients(model, inputs, NUM_CLASSES, clip_norm=1.0, backend=backend)  # type: ignore[arg-type]
        synchronize(device)
        build = time.perf_counter() - start
        u = torch.full((op.num_columns,), 1.0 / op.num_columns, device=device)
        step = _median_seconds(lambda: op.rmatvec(op.matvec(u)), repeats, device)

    start = time.perf_counter()
    denoised = denoise("alt-conv", target, model, inputs, NUM_CLASSES, steps=steps,
                       smoothing=1.0, method="fista", vertex_clip_norm=1.0,
                       backend=backend)  # type: ignore[arg-type]  # fmt: skip
    synchronize(device)
    projection = time.perf_counter() - start
    held = inputs.shape[0] * NUM_CLASSES * op.dim * 4 / 2**20 if backend == "dense" else 0.0
    costs = {"build_s": build, "step_ms": 1000 * step, "projection_s": projection, "g_mib": held}
    return costs, denoised


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    device = torch.device(args.device)
    x, _y, _xt, _yt = load_subsample(FULL.train, 0)
    x = x.to(device)
    model = ImageCNN(ImageCNNConfig()).to(device)
    target = 0.01 * torch.randn(sum(p.numel() for p in model.parameters())).to(device)
    for backend in PROJECTION_BACKENDS:  # warm-up: torch's one-time set-up is not a cost
        measure_one(model, x[:2], target, 1, backend, 1)
    rows: dict[str, Any] = {}
    for n2, steps in zip(args.alt_batch_sizes, args.steps, strict=True):
        inputs = x[torch.randperm(x.shape[0])[:n2].to(device)]
        row: dict[str, Any] = {"steps": steps}
        outputs = {}
        for backend in PROJECTION_BACKENDS:
            row[backend], outputs[backend] = measure_one(
                model, inputs, target, steps, backend, args.repeats
            )
            print(f"n₂ = {n2}, {steps} steps, {backend}: {row[backend]}", flush=True)
        a, d = outputs["autodiff"], outputs["dense"]
        row["max_rel_diff"] = float(torch.linalg.vector_norm(d - a) / torch.linalg.vector_norm(a))
        row["projection_speedup"] = row["autodiff"]["projection_s"] / row["dense"]["projection_s"]
        row["step_speedup"] = row["autodiff"]["step_ms"] / row["dense"]["step_ms"]
        rows[str(n2)] = row
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alt-batch-sizes", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument(
        "--steps", type=int, nargs="+", default=[100, 100, 400],
        help="FISTA steps per projection, one per n₂",
    )  # fmt: skip
    p.add_argument("--repeats", type=int, default=5, help="timed G·u, Gᵀ·v pairs")
    p.add_argument("--threads", type=int, default=1)
    add_device_argument(p, "where the model and G live")
    p.add_argument("--out", type=Path, default=RESULTS / "projection_backends.json")
    args = p.parse_args()
    if len(args.steps) != len(args.alt_batch_sizes):
        p.error("give one --steps value per --alt-batch-sizes value")
    check_device(p, args.device)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rows = measure(args)
    print("| n₂ | steps | autodiff: step ms / projection s | dense: step ms / projection s "
          "| G held (MiB) | speedup step / projection |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for n2, r in rows.items():
        a, d = r["autodiff"], r["dense"]
        print(
            f"| {n2} | {r['steps']} | {a['step_ms']:.1f} / {a['projection_s']:.2f} "
            f"| {d['step_ms']:.2f} / {d['projection_s']:.2f} | {d['g_mib']:.0f} "
            f"| {r['step_speedup']:.0f}× / {r['projection_speedup']:.1f}× |"
        )
    payload = {
        "benchmark": "projection_backends",
        "command": "python -m bench.bench_projection " + " ".join(sys.argv[1:]),
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": args.threads,
            "device": args.device,
            **gpu_name(args.device),
        },
        "model": "Table-10a CNN, d = 9066, untrained; FISTA, clipped columns (C = 1), λ = 1",
        "rows": rows,
        "elapsed_seconds": time.perf_counter() - start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
