"""``bench/report``: the renderer on stored JSON (tables, "—" for what has not
run, the three claims computed right, the plot written), and the sweep's
incremental rerun on a configuration that needs no service."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.report import config_path, main
from bench.report_render import (
    BIASED,
    claim_infinity,
    claim_rr_on_bins,
    claim_unbiased,
    classification,
    load_results,
    render,
)

EPSILONS = (0.5, 1.0, math.inf)


def _store(results: Path, method: str, epsilon: float, mechanism: float, test: float,
           *, std: float = 1.0) -> None:  # fmt: skip
    """One configuration's JSON, as ``labeldp experiment --json`` writes it."""
    private = math.isfinite(epsilon) and method != "non-private"
    result: dict[str, Any] = {
        "dataset": "toy", "task": "regression", "method": method,
        "epsilon": epsilon if private else "inf", "seeds": 5, "examples": 1000, "epochs": 3,
        "mechanism_metric": "mse", "mechanism_mse": mechanism if private else 0.0,
        "mechanism_std": 0.5 if private else 0.0, "test": {"mse": test, "mse_std": std},
        "epsilon_spent": 5 * epsilon if private else 0.0, "seconds": 10.0, "per_seed": [],
    }  # fmt: skip
    path = config_path(results, "toy", method, epsilon)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))


def _fixture(results: Path, *, unbiased_test: float = 90.0, rob_mech: float = 100.0) -> None:
    _store(results, "non-private", math.inf, 0, 50.0)
    for method in ("laplace", "laplace-clipped", "staircase-clipped", "rr-on-bins", "unbiased"):
        _store(results, method, math.inf, 0, 50.0)
    _store(results, "laplace", 0.5, 1000.0, 200.0)
    _store(results, "rr-on-bins", 0.5, rob_mech, 120.0)
    _store(results, "laplace-clipped", 0.5, 400.0, 150.0)
    _store(results, "staircase-clipped", 0.5, 280.0, 140.0)
    _store(results, "unbiased", 0.5, 2000.0, unbiased_test)
    _store(results, "laplace", 1.0, 500.0, 100.0)
    _store(results, "rr-on-bins", 1.0, 60.0, 80.0)
    _store(results, "laplace-clipped", 1.0, 150.0, 90.0)
    _store(results, "staircase-clipped", 1.0, 140.0, 85.0)
    _store(results, "unbiased", 1.0, 900.0, 70.0)


def test_claims_met(tmp_path: Path) -> None:
    _fixture(tmp_path)
    done, failed = load_results(tmp_path, "toy")
    assert not failed and len(done) == 16
    first = claim_rr_on_bins(done)
    assert first.met is True and "clipped Laplace / RR-on-Bins: 4.0× at ε = 0.5" in first.numbers
    assert "unclipped Laplace / RR-on-Bins: 10× at ε = 0.5" in first.numbers
    second = claim_unbiased(done)
    assert second.met is True and "won 2 of 2" in second.numbers
    third = claim_infinity(done)
    assert third.met is True and "5 method(s) at ∞" in third.numbers


def test_claims_not_met(tmp_path: Path) -> None:
    _fixture(tmp_path, unbiased_test=130.0, rob_mech=250.0)  # ratio 1.6×; loses at 0.5
    _store(tmp_path, "unbiased", math.inf, 0, 50.5)  # not the baseline
    done, _ = load_results(tmp_path, "toy")
    assert claim_rr_on_bins(done).met is False and "1.6×" in claim_rr_on_bins(done).numbers
    second = claim_unbiased(done)
    assert second.met is False and "won 1 of 2" in second.numbers  # 50% < 75%
    _store(tmp_path, "unbiased", 0.1, 9000.0, 10.0)  # a win below ε = 0.3 ...
    for method in BIASED:
        _store(tmp_path, method, 0.1, 100.0, 100.0)
    done, _ = load_results(tmp_path, "toy")
    second = claim_unbiased(done)  # ... is shown, not counted
    assert second.met is False and "won 1 of 2" in second.numbers
    assert "ε = 0.1: 10 ± 1 vs 100 ± 1 (rr-on-bins) ✓ (not counted)" in second.numbers
    third = claim_infinity(done)
    assert third.met is False and "1.0e-02" in third.numbers


def test_claims_not_checked_without_numbers(tmp_path: Path) -> None:
    _store(tmp_path, "laplace", 1.0, 500.0, 100.0)
    done, _ = load_results(tmp_path, "toy")
    assert [c.met for c in (claim_rr_on_bins(done), claim_unbiased(done),
                            claim_infinity(done))] == [None, None, None]  # fmt: skip


def test_render(tmp_path: Path) -> None:
    results, report = tmp_path / "results", tmp_path / "REPORT.md"
    _fixture(results)
    failed = config_path(results, "toy", "exponential", 0.5)
    failed.parent.mkdir()
    failed.write_text(json.dumps({"dataset": "toy", "method": "exponential",
                                  "epsilon": "0.5", "error": "boom"}))  # fmt: skip
    render(results, report, datasets=["toy", "absent"], command="python -m bench.report",
           max_examples={"toy": 1000}, epsilons=EPSILONS)  # fmt: skip
    text = report.read_text()
    assert "| method | ε = 0.5 | ε = 1 | ε = ∞ |" in text
    assert "| laplace | 1,000 ± 0.5 | 500 ± 0.5 | 0 ± 0 |" in text  # mechanism block
    assert "| unbiased | 90 ± 1 | 70 ± 1 | 50 ± 1 |" in text  # test block
    assert "| staircase | — | — | — |" in text  # never ran: no number invented
    assert "- exponential: ε = 0.5 (failed), 1, ∞" in text
    assert text.count("**met**") == 3
    assert "| toy | met | met | met |" in text  # the claims at a glance
    assert "## absent" in text and "Not run yet." in text
    assert (results / "toy.png").stat().st_size > 1000
    assert "](results/toy.png)" in text


def test_a_narrower_render_keeps_every_stored_epsilon(tmp_path: Path) -> None:
    results, report = tmp_path / "results", tmp_path / "REPORT.md"
    _fixture(results)
    render(results, report, datasets=["toy"], command="python -m bench.report",
           max_examples={}, epsilons=[1.0])  # fmt: skip
    assert "| method | ε = 0.5 | ε = 1 | ε = ∞ |" in report.read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--datasets", "bogus"], "unknown dataset(s) bogus"),
        (["--methods", "bogus"], "unknown method(s) bogus"),
        (["--max-examples", "census-weeks"], "--max-examples expects DATASET=N"),
        (["--quick", "--epsilons", "1"], "--quick sets its own"),
    ],
)
def test_bad_arguments_stop_before_anything_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--render-only"])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_sweep_is_incremental(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--datasets", "rand-hie-spend", "--methods", "non-private", "--epsilons", "inf",
            "--seeds", "1", "--epochs", "1", "--max-examples", "rand-hie-spend=300",
            "--results", str(tmp_path / "r"), "--report", str(tmp_path / "R.md")]  # fmt: skip
    assert main(argv) == 0
    stored = config_path(tmp_path / "r", "rand-hie-spend", "non-private", math.inf)
    first = json.loads(stored.read_text())
    assert first["examples"] == 300 and first["seeds"] == 1 and first["test"]["mse"] > 0
    assert "1 configuration(s) to run" in capsys.readouterr().err
    assert main(argv) == 0  # the rerun skips what is stored
    assert "0 configuration(s) to run" in capsys.readouterr().err
    assert json.loads(stored.read_text()) == first
    assert main([*argv, "--seeds", "2"]) == 0  # another public configuration: rerun
    assert json.loads(stored.read_text())["seeds"] == 2
    assert "| non-private |" in (tmp_path / "R.md").read_text()


def _pro_results(epsilon: str, dp_sgd: float, pro: float) -> dict[str, Any]:
    """A ``bench_labeldp_pro`` result with one ε row (std 0.5, 3 seeds)."""
    row = {
        m: {"mean": v, "std": 0.5, "runs": 3} for m, v in (("dp-sgd", dp_sgd), ("labeldp-pro", pro))
    }
    return {"settings": {"train": 60000, "epochs": 3}, "summary": {"accuracy": {epsilon: row}}}


def test_labeldp_pro_table_shows_the_noise_free_caps(tmp_path: Path) -> None:
    stored = {**_pro_results("1.0", 74.7, 70.9), "paper_table_14": {"1.0": {"dp-sgd": 81.5}}}
    (tmp_path / "labeldp_pro.json").write_text(json.dumps(stored))
    text = "\n".join(classification(tmp_path))
    assert "| 1.0 | — | 74.7 ± 0.5 | 70.9 ± 0.5 | — | 81.5 | — |" in text
    assert "σ = 0" not in text  # no ablation stored: no row invented
    caps = _pro_results("inf", 75.1, 71.7)
    (tmp_path / "labeldp_pro_noise_free.json").write_text(json.dumps(caps))
    text = "\n".join(classification(tmp_path))
    assert "| σ = 0 (not private) | — | 75.1 ± 0.5 | 71.7 ± 0.5 | — | — | — |" in text


def test_labeldp_pro_report_adds_the_larger_hull_runs_when_stored(tmp_path: Path) -> None:
    (tmp_path / "labeldp_pro.json").write_text(json.dumps(_pro_results("1.0", 74.7, 70.9)))
    assert "n₂ = 1024" not in "\n".join(classification(tmp_path))
    for eps, acc in (("inf", 74.81), ("1.0", 73.92)):
        stored = _pro_results(eps, 0.0, acc)
        del stored["summary"]["accuracy"][eps]["dp-sgd"]
        stored["runs"] = [{"method": "labeldp-pro", "seconds_per_epoch": 1200.0}]
        (tmp_path / f"labeldp_pro_n2_1024_eps{eps}.json").write_text(json.dumps(stored))
    lines = classification(tmp_path)
    start = lines.index("| ε | LabelDP-Pro, n₂ = 1024 | seeds | s per epoch |")
    assert lines[start + 2 : start + 4] == [
        "| 1.0 | 73.9 ± 0.5 | 3 | 1,200 |",
        "| σ = 0 (not private) | 74.8 ± 0.5 | 3 | 1,200 |",
    ]


def test_labeldp_pro_report_adds_the_gpu_table_when_stored(tmp_path: Path) -> None:
    assert "--device cuda" not in "\n".join(classification(tmp_path))
    stored = {**_pro_results("0.5", 74.45, 72.62), "machine": {"gpu": "NVIDIA H100 80GB HBM3"}}
    stored["settings"] |= {"alt_batch_size": 1024, "projection_steps": 400}
    (tmp_path / "labeldp_pro_cuda_n2_1024.json").write_text(json.dumps(stored))
    text = "\n".join(classification(tmp_path))
    assert "### The same with n₂ = 1024 on NVIDIA H100 80GB HBM3 (`--device cuda`)" in text
    assert "ALTCONV n₂ = 1024, 400" in text
    assert "| 0.5 | — | 74.5 ± 0.5 | 72.6 ± 0.5 | — | — | — |" in text


def _gpu_runs(epochs: int, draws: int, method: str, accuracies: dict[int, float]) -> str:
    """A stored GPU run file: ``accuracies`` by seed, at ε = 1."""
    runs = [
        {"method": method, "epsilon": 1.0, "seed": seed, "accuracy": acc}
        for seed, acc in accuracies.items()
    ]
    return json.dumps({"settings": {"epochs": epochs, "debias_draws": draws}, "runs": runs})


def test_gpu_runs_pool_their_seeds_across_files_beside_dp_sgd_of_the_same_length(
    tmp_path: Path,
) -> None:
    files = {
        "labeldp_pro_cuda_n2_1024_10ep_dp_sgd.json": _gpu_runs(10, 0, "dp-sgd", {0: 78, 1: 77}),
        "labeldp_pro_cuda_n2_1024_10ep_pro.json": _gpu_runs(10, 0, "labeldp-pro", {0: 75, 1: 76}),
        "labeldp_pro_cuda_n2_1024_10ep_pro_seed2.json": _gpu_runs(10, 0, "labeldp-pro", {2: 77}),
        "labeldp_pro_cuda_n2_1024_debias.json": _gpu_runs(10, 1, "labeldp-pro", {0: 74.5}),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    lines = classification(tmp_path)
    start = lines.index("| epochs | noise-bias draws | ε | DP-SGD | LabelDP-Pro | "
                        "seeds (DP-SGD / LabelDP-Pro) |")  # fmt: skip
    assert lines[start + 2 : start + 4] == [
        "| 10 | 0 | 1.0 | 77.5 ± 0.707 | 76 ± 1 | 2 / 3 |",
        "| 10 | 1 | 1.0 | 77.5 ± 0.707 | 74.5 ± 0 | 2 / 1 |",
    ]
