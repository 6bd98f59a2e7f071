"""The resource estimate a training is accepted on (label_party.trainings.resources)
against what its worker really takes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from label_party.trainings.resources import estimate, projection_examples
from label_party.trainings.training import activation_count

ROOT = Path(__file__).resolve().parents[2]

#: One projection (two steps) in a fresh process: the memory it added to the
#: process's peak, after the model and inputs were made.
MEASURE = textwrap.dedent(
    """
    import json, sys
    import torch
    from label_party.labeldp_pro.denoisers import denoise
    from label_party.trainings.training import build

    spec, m, k, features = json.loads(sys.argv[1])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build(spec, features, k)
    inputs = torch.rand(m, features)
    target = torch.randn(sum(p.numel() for p in model.parameters())) * 0.01
    def peak():  # of this image (ru_maxrss would carry over the forking parent's)
        with open("/proc/self/status") as status:
            line = next(l for l in status if l.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    before = peak()
    denoise("alt-conv", target, model, inputs, k, steps=2, vertex_clip_norm=1.0,
            backend=spec["projection_backend"])
    print(peak() - before)
    """
)


def _spec(architecture: str, m: int, backend: str = "autodiff") -> dict[str, Any]:
    return {
        "architecture": architecture,
        "image_shape": [1, 28, 28],
        "hidden": [128, 64],
        "num_classes": 10,
        "denoiser": "alt-conv",
        "alt_batch_size": m,
        "expected_batch_size": 64,
        "epochs": 1,
        "projection_steps": 2,
        "projection_backend": backend,
    }


def _measured(spec: dict[str, Any], m: int) -> int:
    args = json.dumps([spec, m, spec["num_classes"], 784])
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    return int(out.stdout.strip())


@pytest.mark.parametrize(
    ("architecture", "m", "backend"),
    [("cnn", 512, "autodiff"), ("mlp", 4096, "autodiff"), ("cnn", 256, "dense")],
)
def test_the_projection_estimate_bounds_the_memory_it_takes(
    architecture: str, m: int, backend: str
) -> None:
    """Accepting on the estimate is safe only if the worker never takes more, and
    useful only if the estimate is not far above what it takes."""
    spec = _spec(architecture, m, backend)
    need = estimate(spec, num_examples=10_000, num_features=784)
    measured = _measured(spec, m)
    assert need.projection_examples == m
    assert measured <= need.projection_bytes <= 4 * measured, (measured, need)


def test_the_forward_pass_is_counted_layer_by_layer() -> None:
    # 784 inputs → Linear 128 → ReLU → Linear 64 → ReLU → Linear 10.
    spec = {"architecture": "mlp", "hidden": [128, 64]}
    assert activation_count(spec, 784, 10) == 784 + 128 + 128 + 64 + 64 + 10


def test_the_projection_set_s_size_follows_the_denoiser() -> None:
    spec = {"denoiser": "alt-conv", "alt_batch_size": 64, "expected_batch_size": 1024}
    assert projection_examples(spec, 60_000) == 64
    assert projection_examples({**spec, "alt_batch_size": 10**6}, 60_000) == 60_000
    # SELF* project on the Poisson batch itself: its mean plus 8 standard deviations.
    assert projection_examples({**spec, "denoiser": "self-conv"}, 60_000) == 1024 + 256
    assert projection_examples({**spec, "denoiser": "noop"}, 60_000) == 0


def test_the_projection_dominates_the_compute_estimate() -> None:
    """T · (B + m · (K + 2·(8 + s + 1))): the paper's ALTCONV (n₂ = 64, 200 PGD
    steps) computes 27 example-gradients in the projection for each in DP-SGD."""
    spec = {**_spec("cnn", 64), "expected_batch_size": 1024, "epochs": 3,
            "projection_steps": 200}  # fmt: skip
    need = estimate(spec, num_examples=60_000, num_features=784)
    steps = 3 * 59
    assert need.example_gradients == steps * (1024 + 64 * (10 + 2 * (8 + 200 + 1)))
    noop = estimate({**spec, "denoiser": "noop"}, num_examples=60_000, num_features=784)
    assert noop.example_gradients == steps * 1024 and noop.projection_bytes == 0
