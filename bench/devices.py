"""Where a benchmark runs: the ``--device`` option the training benchmarks share,
and the clock discipline a GPU needs (a CUDA call returns before its kernels
end, so a timer read without a synchronization misses them)."""

from __future__ import annotations

import argparse

import torch

DEVICES = ("cpu", "cuda")


def add_device_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--device", choices=DEVICES, default="cpu", help=help_text)


def check_device(parser: argparse.ArgumentParser, device: str) -> None:
    """Refuse ``cuda`` up front, with the reason, where torch sees no GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        parser.error(
            "--device cuda: torch sees no CUDA device here "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})"
        )


def synchronize(device: str | torch.device) -> None:
    """Wait for the GPU's queued work, so that a clock read next counts it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def gpu_name(device: str) -> dict[str, str]:
    """``{"gpu": name}`` for a result's machine record, empty on the CPU."""
    return {"gpu": torch.cuda.get_device_name()} if torch.device(device).type == "cuda" else {}
