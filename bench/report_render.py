"""Render ``bench/REPORT.md`` from the stored per-configuration JSON.

Only what was stored is shown: a configuration that has not run (or failed) is a
"—" in the tables and is listed by name; no number is ever filled in. The claims
are computed from the same numbers and each says "met", "not met" or "not
checked" (its configurations have not run), with the numbers it used.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from labeldp.experiment import methods_for

#: (method, ε) → the stored result of one configuration (ε = inf for ∞).
Results = dict[tuple[str, float], dict[str, Any]]

#: Claim 1: "far below" — at least this ratio (the paper: 4.3× at ε = 0.5 on Criteo).
FAR_BELOW = 2.0
#: Claim 2: "a wide range" — unbiased wins at least this share of the finite ε run.
WIDE_RANGE = 0.75
#: Claim 2: where the paper found training on unbiased noisy labels stable.
WIDE_FROM = 0.3
#: Claim 3: equal up to float noise (the same training on the same true labels).
SAME = 1e-9
SMALL_EPSILONS = (0.05, 0.1, 0.3, 0.5)
BIASED = ("rr-on-bins", "laplace-clipped", "staircase-clipped")


def _epsilon(value: Any) -> float:
    return math.inf if value in ("inf", None) else float(value)


def load_results(results: Path, dataset: str) -> tuple[Results, dict[tuple[str, float], str]]:
    """The finished configurations of ``dataset``, and the failed ones' errors."""
    done: Results = {}
    failed: dict[tuple[str, float], str] = {}
    for path in sorted((results / dataset).glob("*/eps-*.json")):
        result = json.loads(path.read_text())
        key = (str(result["method"]), _epsilon(result["epsilon"]))
        if "error" in result:
            failed[key] = str(result["error"])
        else:
            done[key] = result
    return done, failed


def _metric(done: Results) -> str:
    first = next(iter(done.values()))
    return str(first.get("mechanism_metric", "mse"))


def test_mean(result: Mapping[str, Any]) -> float:
    metric = str(result.get("mechanism_metric", "mse"))
    return float(result["test"][metric])


def fmt(value: float | None) -> str:
    """Compact numbers for wide tables: 4.48e+05, 12,345, 123, 12.3, 0.812."""
    if value is None or not math.isfinite(value):
        return "—"
    if abs(value) >= 1e5:
        return f"{value:.3g}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _cell(mean: float | None, std: float | None) -> str:
    return "—" if mean is None else f"{fmt(mean)} ± {fmt(std or 0.0)}"


def _eps_label(epsilon: float) -> str:
    return "∞" if math.isinf(epsilon) else f"{epsilon:g}"


def table(done: Results, methods: Sequence[str], epsilons: Sequence[float], *, test: bool) -> str:
    """Rows: methods; columns: ε; cells mean ± std over the seeds."""
    lines = ["| method | " + " | ".join(f"ε = {_eps_label(e)}" for e in epsilons) + " |",
             "|---|" + "---|" * len(epsilons)]  # fmt: skip
    for method in methods:
        cells = []
        for epsilon in epsilons:
            result = done.get((method, epsilon))
            if result is None:
                cells.append("—")
            elif test:
                metric = str(result.get("mechanism_metric", "mse"))
                cells.append(_cell(result["test"][metric], result["test"][f"{metric}_std"]))
            else:
                cells.append(_cell(result.get("mechanism_mse"), result.get("mechanism_std")))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- claims ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    name: str
    met: bool | None  # None: not checked, its configurations have not run
    numbers: str

    def line(self) -> str:
        verdict = {True: "**met**", False: "**not met**", None: "**not checked**"}[self.met]
        return f"- {self.name}: {verdict} — {self.numbers}"


def claim_rr_on_bins(done: Results) -> Claim:
    """RR-on-Bins' noisy-label MSE far below Laplace's at small ε. The papers'
    Laplace clips its noisy labels to the label range (``optimal-unbiased-
    randomizers.txt`` §4 says so of ``rr-on-bins-regression.txt``'s Table 1):
    that is our ``laplace-clipped``; the unclipped ratio is shown beside it."""
    name = (f"RR-on-Bins mechanism MSE ≥ {FAR_BELOW:g}× below (clipped) Laplace's at "
            "every ε ≤ 0.5")  # fmt: skip
    ratios: dict[float, float] = {}
    unclipped: dict[float, float] = {}
    for epsilon in SMALL_EPSILONS:
        rob = _mechanism(done, "rr-on-bins", epsilon)
        lap, raw = (
            _mechanism(done, "laplace-clipped", epsilon),
            _mechanism(done, "laplace", epsilon),
        )
        if rob and lap:
            ratios[epsilon] = lap / rob
        if rob and raw:
            unclipped[epsilon] = raw / rob
    if not ratios:
        return Claim(name, None, "laplace-clipped and rr-on-bins at ε ≤ 0.5 have not run")
    shown = ", ".join(f"{r:,.1f}× at ε = {e:g}" for e, r in ratios.items())
    raw_shown = ", ".join(f"{r:,.0f}× at ε = {e:g}" for e, r in unclipped.items())
    met = min(ratios.values()) >= FAR_BELOW
    return Claim(name, met, f"clipped Laplace / RR-on-Bins: {shown} (paper: 4.3× at ε = 0.5 "
                            f"on Criteo); unclipped Laplace / RR-on-Bins: "
                            f"{raw_shown or 'not run'}")  # fmt: skip


def _mechanism(done: Results, method: str, epsilon: float) -> float | None:
    result = done.get((method, epsilon))
    value = None if result is None else result.get("mechanism_mse")
    return float(value) if value else None


def claim_unbiased(done: Results) -> Claim:
    """Unbiased beats RR-on-Bins and the clipped mechanisms in test loss over a wide
    ε range: the unbiased-randomizers paper §4 finds training stable for ε ≥ 0.3
    ("practically useful in ML") and reports the win "across a wide range of ε";
    smaller ε are shown but not counted."""
    name = (f"unbiased has the lowest test MSE among unbiased, {', '.join(BIASED)} at "
            f"≥ {WIDE_RANGE:.0%} of the ε in [{WIDE_FROM:g}, 8] run")  # fmt: skip
    wins, counted, rows = 0, 0, []
    finite = sorted({e for (_, e) in done if math.isfinite(e)})
    for epsilon in finite:
        ours = done.get(("unbiased", epsilon))
        others = [done.get((m, epsilon)) for m in BIASED]
        if ours is None or any(o is None for o in others):
            continue
        best = min((o for o in others if o is not None), key=test_mean)
        won = test_mean(ours) < test_mean(best)
        inside = epsilon >= WIDE_FROM
        wins += won and inside
        counted += inside
        rows.append(f"ε = {epsilon:g}: {_mean_std(ours)} vs {_mean_std(best)} ({best['method']})"
                    f"{' ✓' if won else ' ✗'}{'' if inside else ' (not counted)'}")  # fmt: skip
    if not counted:
        return Claim(name, None, f"the four methods have not all run at any ε ≥ {WIDE_FROM:g}")
    met = wins >= WIDE_RANGE * counted
    return Claim(name, met, f"won {wins} of {counted} (unbiased vs the best of the "
                            f"others, test MSE mean ± std over seeds): "
                            f"{'; '.join(rows)}")  # fmt: skip


def _mean_std(result: Mapping[str, Any]) -> str:
    metric = str(result.get("mechanism_metric", "mse"))
    return f"{fmt(result['test'][metric])} ± {fmt(result['test'][f'{metric}_std'])}"


def claim_infinity(done: Results) -> Claim:
    """At ε = ∞ every method trains on the true labels: the non-private baseline."""
    name = "test MSE at ε = ∞ equals the non-private baseline for every method"
    base = done.get(("non-private", math.inf))
    at_inf = {m: r for (m, e), r in done.items() if math.isinf(e) and m != "non-private"}
    if base is None or not at_inf:
        return Claim(name, None, "non-private or the methods at ε = ∞ have not run")
    baseline = test_mean(base)
    worst = max(abs(test_mean(r) - baseline) / max(abs(baseline), 1e-12) for r in at_inf.values())
    return Claim(name, worst <= SAME, f"baseline {fmt(baseline)}; {len(at_inf)} method(s) at ∞, "
                                      f"largest relative difference {worst:.1e}")  # fmt: skip


def claims(done: Results) -> list[Claim]:
    return [claim_rr_on_bins(done), claim_unbiased(done), claim_infinity(done)]


# -- plots -----------------------------------------------------------------------------


STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")


def plot(done: Results, methods: Sequence[str], dataset: str, path: Path) -> None:
    """Figure 3 style: (a) noisy-label error (log scale) and (b) test error vs ε,
    per method, mean ± std over the seeds; the non-private baseline dashed."""
    metric = _metric(done)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ticks: set[float] = set()
    for i, method in enumerate(methods):
        points = sorted((e, r) for (m, e), r in done.items() if m == method and math.isfinite(e))
        if not points:
            continue
        eps = [e for e, _ in points]
        ticks.update(eps)
        style = {"ls": STYLES[i % len(STYLES)], "marker": MARKERS[i % len(MARKERS)],
                 "ms": 4, "capsize": 2, "label": method}  # fmt: skip
        mech = [r.get("mechanism_mse") or math.nan for _, r in points]
        mech_std = [r.get("mechanism_std") or 0.0 for _, r in points]
        axes[0].errorbar(eps, mech, yerr=mech_std, **style)
        test = [r["test"][metric] for _, r in points]
        axes[1].errorbar(eps, test, yerr=[r["test"][f"{metric}_std"] for _, r in points],
                         **style)  # fmt: skip
    base = done.get(("non-private", math.inf))
    if base is not None:
        axes[1].axhline(base["test"][metric], color="k", ls="--", lw=1, label="non-private")
    name = "MSE" if metric == "mse" else metric
    for axis, title in zip(axes, (f"(a) noisy training labels: {name}", f"(b) test {name}"),
                           strict=True):  # fmt: skip
        axis.set_xscale("log")
        if ticks:
            axis.set_xticks(sorted(ticks), [f"{t:g}" for t in sorted(ticks)])
            axis.minorticks_off()
        axis.set_xlabel("ε")
        axis.set_title(f"{dataset} — {title}")
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:  # nothing finite ran: no legend
            axis.legend(fontsize=7)
    if metric == "mse":
        axes[0].set_yscale("log")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- the report ------------------------------------------------------------------------


def _machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores {model}".strip()


def _missing(done: Results, failed: Mapping[tuple[str, float], str], methods: Sequence[str],
             epsilons: Sequence[float]) -> list[str]:  # fmt: skip
    lines = []
    for method in methods:
        wanted = [math.inf] if method == "non-private" else list(epsilons)
        absent = [e for e in wanted if (method, e) not in done]
        if absent:
            how = ", ".join(f"{_eps_label(e)}{' (failed)' if (method, e) in failed else ''}"
                            for e in absent)  # fmt: skip
            lines.append(f"  - {method}: ε = {how}")
    return lines


def _section(results: Path, report: Path, dataset: str, epsilons: Sequence[float],
             max_examples: Mapping[str, int]) -> list[str]:  # fmt: skip
    done, failed = load_results(results, dataset)
    out = [f"## {dataset}", ""]
    if not done:
        return [*out, "Not run yet.", ""]
    # The sweep's ε and every ε already stored: a narrower rerun (--epsilons 0.5 1)
    # adds its cells without dropping the columns the report had.
    epsilons = sorted({*epsilons, *(e for _method, e in done)})
    any_result = next(iter(done.values()))
    task = str(any_result.get("task", "regression"))
    methods = methods_for(task)
    metric = _metric(done)
    name = "MSE" if metric == "mse" else metric
    seconds = [float(r["seconds"]) / max(int(r["seeds"]), 1) for r in done.values()]
    seeds = sorted({int(r["seeds"]) for r in done.values()})
    sub = f", subsampled to {max_examples[dataset]:,} rows (public config)" \
        if dataset in max_examples else ""  # fmt: skip
    out += [f"{any_result['examples']:,} examples{sub}; 80/20 split per seed; seeds per "
            f"configuration: {', '.join(map(str, seeds))}; {any_result['epochs']} epochs "
            f"(early stopping on a noisy validation split); {len(done)} configurations "
            f"stored, {sum(seconds) / len(seconds):.1f} s per seed on average.", ""]  # fmt: skip
    out += [f"### Mechanism: {name} of the noisy training labels (mean ± std over seeds)", "",
            table(done, methods, epsilons, test=False), "",
            f"### Generalization: test {name} against the true held-out labels", "",
            table(done, methods, epsilons, test=True), ""]  # fmt: skip
    png = results / f"{dataset}.png"
    plot(done, methods, dataset, png)
    out += [f"![{dataset}: error vs ε]({os.path.relpath(png, report.parent)})", ""]
    if task == "regression":
        out += ["### Claims", "", *[c.line() for c in claims(done)], ""]
    missing = _missing(done, failed, methods, epsilons)
    if missing:
        out += ["Not run (no numbers shown for these):", "", *missing, ""]
    return out


def summary(results: Path, datasets: Sequence[str]) -> list[str]:
    """The claims at a glance: one row per regression dataset that has results."""
    rows = []
    for dataset in datasets:
        done, _ = load_results(results, dataset)
        if done and next(iter(done.values())).get("task", "regression") == "regression":
            verdicts = {True: "met", False: "not met", None: "not checked"}
            rows.append(f"| {dataset} | "
                        + " | ".join(verdicts[c.met] for c in claims(done)) + " |")  # fmt: skip
    if not rows:
        return []
    return ["## Claims at a glance", "",
            "| dataset | RR-on-Bins ≪ Laplace (mechanism, ε ≤ 0.5) | unbiased best in test "
            "MSE (ε ∈ [0.3, 8]) | ε = ∞ = non-private |", "|---|---|---|---|", *rows,
            "", "Numbers and criteria: each dataset's Claims section below.", ""]  # fmt: skip


def render(results: Path, report: Path, *, datasets: Sequence[str], command: str,
           max_examples: Mapping[str, int], epsilons: Sequence[float]) -> None:  # fmt: skip
    """Write ``report`` (Markdown) and the plots beside the JSON in ``results``."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# labeldp experiments: Table 1 and Figures 3–5 on our datasets", "",
             "The numbers come from the sweep `python -m bench.report` (resumable; it "
             "writes one JSON per configuration under `bench/results/experiment/`). This "
             f"page was rendered by `{command}` on {now}. Machine: {_machine()}, shared "
             "with other work while the sweep ran (load average 5–10), so the seconds are "
             "pessimistic. How to run and read it: "
             "[docs/experiments.md](../docs/experiments.md).", "",
             "Every number is a mean ± population std over seeds 0..N−1 of "
             "`labeldp experiment` run in-process through the real labels and features "
             "services (one pair per dataset); `—` marks a configuration that has not run. "
             "ε = ∞ trains on the true labels (the non-private baseline). Claims are "
             "checked only on what ran. `census-weeks` is swept on a seeded public "
             "subsample of 20,000 rows and `flights-delay` (3M rows) on one of 100,000. "
             "`mnist-5k` (all 5,000 digits, the small CNN) reports accuracy, higher is "
             "better, and has no claims of the regression papers. `fashion-mnist` is not "
             "swept (`--datasets fashion-mnist` runs it; its numbers from the "
             "classification benchmarks close the page).", ""]  # fmt: skip
    lines += summary(results, datasets)
    for dataset in datasets:
        lines += _section(results, report, dataset, epsilons, max_examples)
    lines += classification(results.parent)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(lines).rstrip() + "\n")


def classification(bench_results: Path) -> list[str]:
    """Fashion-MNIST: the LP-MST and LabelDP-Pro benchmarks' stored tables."""
    lines = ["## Classification: Fashion-MNIST (benchmarks)", "",
             "From `bench/results/lp_mst.json` (`python -m bench.bench_lp_mst`, through "
             "both services) and `bench/results/labeldp_pro.json` "
             "(`python -m bench.bench_labeldp_pro`, the library's trainer); settings and "
             "discussion in [README.md](README.md). Test accuracy %, mean ± std over "
             "seeds.", ""]  # fmt: skip
    lp_mst = _read(bench_results / "lp_mst.json")
    if lp_mst is not None and "table" in lp_mst:
        lines += ["### LP-1ST vs LP-2ST", "", str(lp_mst["table"]), ""]
    pro = _read(bench_results / "labeldp_pro.json")
    if pro is not None and "summary" in pro:
        caps = _read(bench_results / "labeldp_pro_noise_free.json")
        table = _pro_table(pro, caps)
        lines += ["### RR vs DP-SGD vs LabelDP-Pro (paper Table 14)", "", *table, ""]
        lines += _larger_hull_table(bench_results)
    gpu = _read(bench_results / "labeldp_pro_cuda_n2_1024.json")
    if gpu is not None and "summary" in gpu:
        device = gpu.get("machine", {}).get("gpu", "a GPU")
        lines += [f"### The same with n₂ = 1024 on {device} (`--device cuda`)", "",
                  *_pro_table(gpu), "",
                  "README.md, \"On a GPU\", has the commands and the timings.",
                  ""]  # fmt: skip
    lines += _gpu_variants_table(bench_results)
    return lines if len(lines) > 6 else []


def _gpu_variants_table(bench_results: Path) -> list[str]:
    """Every stored n₂ = 1024 GPU run (``labeldp_pro_cuda_n2_1024*.json``), pooled by
    training length and noise-bias draws, so seeds added by later device calls
    (``--first-seed``) join their table. The draws change ALTCONV alone, so each row
    sets it beside DP-SGD's runs of the same length."""
    pooled: dict[tuple[int, int, str, str], list[float]] = {}
    for path in bench_results.glob("labeldp_pro_cuda_n2_1024*.json"):
        stored = _read(path) or {}
        settings = stored.get("settings", {})
        epochs, draws = int(settings.get("epochs", 0)), int(settings.get("debias_draws", 0))
        for run in stored.get("runs", []):
            method = str(run["method"])
            key = (epochs, draws if method == "labeldp-pro" else 0, str(run["epsilon"]), method)
            pooled.setdefault(key, []).append(float(run["accuracy"]))
    variants = sorted(
        {key[:3] for key in pooled if key[3] == "labeldp-pro"},
        key=lambda v: (v[0], v[1], float(v[2])),
    )
    if not variants:
        return []
    lines = ["All n₂ = 1024 runs on the GPU, by training length and noise-bias draws "
             "(`--debias-draws`; README.md, \"Why DP-SGD wins at ε ≥ 0.5\"):", "",
             "| epochs | noise-bias draws | ε | DP-SGD | LabelDP-Pro | seeds (DP-SGD / "
             "LabelDP-Pro) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for epochs, draws, eps in variants:
        runs = [pooled.get((epochs, 0, eps, "dp-sgd"), []),
                pooled.get((epochs, draws, eps, "labeldp-pro"), [])]  # fmt: skip
        # The sample std, as the benchmark's own summaries give it.
        cells = [_cell(fmean(r), stdev(r) if len(r) > 1 else 0.0) if r else "—" for r in runs]
        seeds = " / ".join(str(len(r)) for r in runs)
        lines.append(f"| {epochs} | {draws} | {eps} | {' | '.join(cells)} | {seeds} |")
    return [*lines, ""]


def _larger_hull_table(bench_results: Path) -> list[str]:
    """ALTCONV runs with n₂ = 1024 (``labeldp_pro_n2_1024_eps*.json``), when stored."""
    rows: list[tuple[float, str, dict[str, Any], list[float]]] = []
    for path in bench_results.glob("labeldp_pro_n2_1024_eps*.json"):
        stored = _read(path) or {}
        seconds = [r["seconds_per_epoch"] for r in stored.get("runs", [])
                   if r.get("method") == "labeldp-pro"]  # fmt: skip
        for eps, row in stored.get("summary", {}).get("accuracy", {}).items():
            if "labeldp-pro" in row:
                rows.append((float(eps), eps, row["labeldp-pro"], seconds))
    if not rows:
        return []
    lines = ["ALTCONV with n₂ = 1024 and 400 FISTA steps (`--projection-backend dense`), "
             "other settings as above (README.md, \"Why DP-SGD wins at ε ≥ 0.5\"):", "",
             "| ε | LabelDP-Pro, n₂ = 1024 | seeds | s per epoch |",
             "|---|---|---|---|"]  # fmt: skip
    for _, eps, cell, seconds in sorted(rows):
        label = "σ = 0 (not private)" if math.isinf(float(eps)) else eps
        per_epoch = fmt(sum(seconds) / len(seconds)) if seconds else "—"
        lines.append(f"| {label} | {_cell(cell['mean'], cell['std'])} | {cell['runs']} "
                     f"| {per_epoch} |")  # fmt: skip
    return [*lines, ""]


def _read(path: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def _pro_table(pro: Mapping[str, Any], caps: Mapping[str, Any] | None = None) -> list[str]:
    """The ε rows of ``pro``, then the σ = 0 ablation's row from ``caps`` when stored."""
    methods = ("rr", "dp-sgd", "labeldp-pro")
    settings = pro.get("settings", {})
    lines = [f"{settings.get('train', '?')} training images, {settings.get('epochs', '?')} "
             f"epochs, batch {settings.get('batch_size', '?')}, ALTCONV n₂ = "
             f"{settings.get('alt_batch_size', '?')}, {settings.get('projection_steps', '?')} "
             f"{settings.get('projection_method', 'pgd')} steps, λ = "
             f"{settings.get('smoothing', '?')}.", "",
             "| ε | RR | DP-SGD | LabelDP-Pro | paper RR | paper DP-SGD | paper LabelDP-Pro |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    paper = pro.get("paper_table_14", {})
    for eps, row in pro["summary"]["accuracy"].items():
        ours = [_cell(row[m]["mean"], row[m]["std"]) if m in row else "—" for m in methods]
        ref = [fmt(paper.get(eps, {}).get(m)) for m in methods]
        lines.append(f"| {eps} | " + " | ".join(ours + ref) + " |")
    cap_row = (caps or {}).get("summary", {}).get("accuracy", {}).get("inf")
    if cap_row:
        ours = [_cell(cap_row[m]["mean"], cap_row[m]["std"]) if m in cap_row else "—"
                for m in methods]  # fmt: skip
        lines += ["| σ = 0 (not private) | " + " | ".join(ours) + " | — | — | — |", "",
                  "The σ = 0 row is each method's noise-free cap at the same training "
                  "budget (`--epsilons inf`); README.md, \"Why DP-SGD wins at ε ≥ "
                  "0.5\"."]  # fmt: skip
    return lines
