"""The scale, API-latency, LabelDP-Pro and accounting benchmarks still run: each
in its tiny ``--quick`` mode (4 clients; 20k flights labels; 2,000 images), as
``python -m bench.…`` from the repository root (``bench`` is not an installed
package), writing its JSON to a temporary path. The numbers themselves are not
checked — speed lives in bench/."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.bench_labeldp_pro import randomized_response
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


def test_labeldp_pro_noise_free_quick(tmp_path: Path) -> None:
    if not (datasets.datasets_dir() / "fashion-mnist").is_dir():
        pytest.skip("Fashion-MNIST is not fetched (scripts/fetch-datasets)")
    result = _bench(
        "bench_labeldp_pro",
        tmp_path / "pro.json",
        "--epsilons",
        "inf",
        "--methods",
        "dp-sgd",
        "labeldp-pro",
        "rr",
    )
    # σ = 0 is an ablation: trained, never accounted, so no privacy record.
    assert {r["method"] for r in result["runs"]} == {"dp-sgd", "labeldp-pro", "rr"}
    assert all(r["accounting"] is None for r in result["runs"])
    assert set(result["summary"]["accuracy"]["inf"]) == {"dp-sgd", "labeldp-pro", "rr"}


def test_randomized_response_at_infinite_epsilon_keeps_every_label() -> None:
    labels = torch.arange(10).repeat(50)
    assert torch.equal(randomized_response(labels, float("inf"), seed=0), labels)
    assert not torch.equal(randomized_response(labels, 0.1, seed=0), labels)


def test_accounting_relations(tmp_path: Path) -> None:
    out = tmp_path / "accounting.json"
    command = [sys.executable, "-m", "bench.bench_accounting", "--epsilons", "1", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(out.read_text())["rows"]["1.0"]
    # The service's σ meets its target; every other analysis of the same run is
    # tighter, the item-level add-or-remove one (sensitivity C, not 2C) most of all.
    assert row["service"] <= 1.0
    assert row["paper_add_remove"] < row["pld_replace_one"] < row["service"]
    assert row["pld_add_remove_half"] < row["service"]


def test_projection_backends(tmp_path: Path) -> None:
    out = tmp_path / "projection.json"
    command = [sys.executable, "-m", "bench.bench_projection", "--alt-batch-sizes", "8",
               "--steps", "5", "--repeats", "1", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(out.read_text())["rows"]["8"]
    # The two backends compute the same projection; only dense holds G (8·10·9066 floats).
    assert row["max_rel_diff"] < 1e-4
    assert row["dense"]["g_mib"] == pytest.approx(8 * 10 * 9066 * 4 / 2**20)
    assert row["autodiff"]["g_mib"] == 0


def test_no_label_change_is_easier_to_detect_than_the_antipodal_one() -> None:
    """The premise of the replace-one pair, on a coarse grid: among moves of one
    clipped gradient (norms 0 and C, angles 0, π/2, π), the worst is v = −v'."""
    from bench.bench_accounting import dominance

    result = dominance(2.604, 1024 / 60000, step=0.05, norms=2, angles=3)
    worst = result["max_ratio"]
    assert worst["ratio"] <= 1.0 + 2 * result["grid_error"] + 1e-6
    assert (worst["norm_v"], worst["norm_v_prime"]) == (1.0, 1.0)
    assert worst["angle"] == pytest.approx(math.pi)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("module", ["bench_labeldp_pro", "bench_projection", "bench_training"])
def test_a_gpu_run_without_a_gpu_is_refused_with_the_reason(module: str, tmp_path: Path) -> None:
    command = [sys.executable, "-m", f"bench.{module}", "--device", "cuda",
               "--out", str(tmp_path / "out.json")]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--device cuda: torch sees no CUDA device" in done.stderr
    assert not (tmp_path / "out.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_gpu_check_stops_at_once_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    done = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check"), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert done.returncode == 1
    assert "gpu-check: torch" in done.stderr and "sees no CUDA device here" in done.stderr
    assert not out.exists()


def test_denoiser_bias_rows_per_smoothing(tmp_path: Path) -> None:
    out = tmp_path / "bias.json"
    command = [sys.executable, "-m", "bench.bench_denoiser_bias", "--alt-batch-sizes", "8",
               "--draws", "2", "--epsilons", "1", "--projection-steps", "3", "--epochs", "0",
               "--threads", "1", "--out", str(out)]  # fmt: skip
    done = subprocess.run([*command, "--smoothing", "1", "0.5", "--debias-draws", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    cell = json.loads(out.read_text())["result"]["epsilons"]["1.0"]
    assert set(cell) == {"dp-sgd", "alt-conv n2=8", "alt-conv n2=8 λ=0.5"}
    assert cell["dp-sgd"]["systematic"] < cell["dp-sgd"]["bias"]  # the draws' variance is out
    bad = subprocess.run([*command, "--smoothing", "1.5"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--smoothing" in bad.stderr


def test_audit_verify(tmp_path: Path) -> None:
    result = _bench("bench_audit", tmp_path / "audit.json")
    assert [row["entries"] for row in result["sizes"]] == [2, 200]


def test_rr_classes_quick(tmp_path: Path) -> None:
    result = _bench("bench_rr_classes", tmp_path / "rr.json")
    assert [row["classes"] for row in result["rows"]] == [10, 1000]
    large = result["rows"][-1]
    assert large["rr"]["manifest_bytes"] * 100 < large["matrix"]["manifest_bytes"]


@pytest.mark.parametrize("upload", ["labels", "partitions", "priors"])
def test_write_wait_takes_each_upload(upload: str, tmp_path: Path) -> None:
    out = tmp_path / "wait.json"
    command = [sys.executable, "-m", "bench.bench_write_wait", "--labels", "2000",
               "--upload", upload, "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["upload"] == upload and result["rows"] == 2000


def test_predict_memory_quick(tmp_path: Path) -> None:
    runs = _bench("bench_predict_memory", tmp_path / "predict.json")["runs"]
    assert [(r["shape"], r["rows"]) for r in runs] == [("wide", 20_000), ("narrow", 20_000)]
    assert all(r["answer_mib"] > 0 and r["peak_extra_mib"] > 0 for r in runs)
