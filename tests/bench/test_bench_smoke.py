"""The scale and API-latency benchmarks still run: each in its tiny ``--quick``
mode (4 clients; 20k flights labels), as ``python -m bench.…`` from the
repository root (``bench`` is not an installed package), writing its JSON to a
temporary path. The numbers themselves are not checked — speed lives in bench/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labeldp import datasets

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _bench(module: str, out: Path, *args: str) -> dict[str, Any]:
    command = [sys.executable, "-m", f"bench.{module}", "--quick", "--out", str(out), *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_api_latency_quick(tmp_path: Path) -> None:
    result = _bench("bench_api_latency", tmp_path / "api.json", "--databases", "sqlite")
    phases = result["sqlite"]["phases"]
    assert set(phases) == {
        "budget",
        "releases_spread",
        "releases_one_dataset",
        "budget_one_dataset_after",
    }
    for stats in phases.values():
        assert stats["errors"] == 0
        assert stats["requests"] == stats["clients"] * stats["measured_per_client"]
        assert stats["p50_ms"] <= stats["p99_ms"] <= stats["max_ms"]


def test_scale_quick(tmp_path: Path) -> None:
    if not (datasets.datasets_dir() / "vega" / "flights-3m.parquet").is_file():
        pytest.skip("the flights file is not fetched (scripts/fetch-datasets)")
    # The 10M path is the same code as the flights one: left out to stay quick.
    result = _bench("bench_scale", tmp_path / "scale.json", "--skip", "replicated")
    assert result["flights"]["labels"] == 20_000
    for step in ("upload", "release", "download"):
        assert result["flights"][step]["peak_rss_mib"]["labels_party"] > 0
    training = result["features"]["train_one_epoch"]
    assert training["metrics"]["epochs_run"] == 1
    assert set(training["peak_rss_mib"]) == {"labels_party", "features_party", "worker"}
