"""The reproduction report: the papers' Table 1 and Figures 3–5 on our datasets.

``python -m bench.report [--quick] [--datasets …] [--seeds 5] [--force] [--render-only]``

runs the sweep — every method × ε ∈ {0.05 … 8, ∞} × seeds for each dataset —
*in this process*, through one pair of local services per dataset (started once,
its features uploaded once), writing one JSON per configuration under
``bench/results/experiment/<dataset>/<method>/eps-<ε>.json`` as soon as it
finishes. A rerun skips the configurations already stored with the same public
configuration (seeds, examples, epochs) unless ``--force``, so an interrupted
sweep continues where it stopped. Then it renders ``bench/REPORT.md`` from the
stored JSON (``--render-only`` does only that). ``--quick`` is a small smoke run
into ``bench/results/experiment/quick/`` with its own ``REPORT.md`` there.

Run the full sweep outside CI; CI runs one small configuration per method
(``tests/experiment``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.report_render import render
from feature_party.client import LabelsPartyError
from labeldp.datasets import LOADERS, Dataset, load
from labeldp.experiment import (
    METHODS,
    REGRESSION,
    Services,
    Setup,
    experiment,
    methods_for,
    services_for,
    subsample,
)
from labeldp.harness import RunError

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "experiment"
REPORT = ROOT / "REPORT.md"

#: The papers' privacy budgets (Table 1 has a few more; these are the issue's).
EPSILONS: tuple[float, ...] = (0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
DATASETS = ("rand-hie-spend", "diamonds-price", "census-weeks", "flights-delay", "mnist-5k")
#: Public subsampling for the sweep on this 2-core machine (a seeded permutation
#: of the rows, never the labels): census-weeks has 254,654 rows, flights 3M; the
#: sizes are chosen so that each of them sweeps in under an hour here (the scale
#: runs of bench/bench_scale.py take all 3M flights).
#: Hundreds of jobs of a second or two each: poll for them often.
POLL_SECONDS = 0.1
#: The unbiased randomizer's LP at ε ≥ 4 on ~190 label values took 100+ s per
#: release on this shared machine: wait for it rather than fail the cell.
RELEASE_TIMEOUT = 1800.0
SWEEP_MAX_EXAMPLES = {"census-weeks": 20_000, "flights-delay": 100_000}


@dataclass(frozen=True)
class Plan:
    """The sweep's public configuration."""

    datasets: tuple[str, ...]
    methods: tuple[str, ...] | None  # None: every method of the dataset's task
    epsilons: tuple[float, ...]
    seeds: int
    epochs: int
    max_examples: dict[str, int]
    results: Path
    force: bool = False


def eps_name(epsilon: float) -> str:
    """``eps-0.05``, ``eps-1``, ``eps-inf``: the file name of a configuration."""
    return "eps-inf" if math.isinf(epsilon) else f"eps-{epsilon:g}"


def config_path(results: Path, dataset: str, method: str, epsilon: float) -> Path:
    return results / dataset / method / f"{eps_name(epsilon)}.json"


def stored(path: Path, setup: Setup) -> bool:
    """Whether ``path`` holds a finished run of exactly this public configuration."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    same = (result.get("seeds"), result.get("examples"), result.get("epochs"))
    return "error" not in result and same == (setup.seeds, len(setup.data), setup.epochs)


def write_json(path: Path, result: dict[str, Any]) -> None:
    """Atomically: a killed sweep never leaves half a file that a rerun would trust."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(result, indent=1) + "\n")
    partial.replace(path)


def _setups(plan: Plan, data: Dataset) -> Iterator[Setup]:
    methods = plan.methods or tuple(methods_for(data.task))
    for epsilon in plan.epsilons:
        for method in methods:
            if method == "non-private" and math.isfinite(epsilon):
                continue  # one non-private row, at ε = ∞
            yield Setup(data=data, method=method, epsilon=epsilon, seeds=plan.seeds,
                        epochs=plan.epochs)  # fmt: skip


def sweep_dataset(plan: Plan, name: str, *, say: Callable[[str], None]) -> list[float]:
    """Every pending configuration of one dataset, through one pair of services
    started on the first private configuration → seconds per configuration run."""
    data = load(name)
    if name in plan.max_examples:
        data = subsample(data, plan.max_examples[name])
    pending = [s for s in _setups(plan, data) if plan.force or not stored(
        config_path(plan.results, name, s.method, s.epsilon), s)]  # fmt: skip
    say(f"{name}: {len(pending)} configuration(s) to run, {len(data)} examples")
    seconds: list[float] = []
    # The services stop (ExitStack) before their data directory goes (tmp).
    tmp_dir = tempfile.TemporaryDirectory(prefix="labeldp-report-", ignore_cleanup_errors=True)
    with tmp_dir as tmp, ExitStack() as stack:
        services: Services | None = None
        for setup in pending:
            if setup.private and services is None:
                opened = services_for(None, Path(tmp), say=say, poll_seconds=POLL_SECONDS,
                                      timeout=RELEASE_TIMEOUT)  # fmt: skip
                services = stack.enter_context(opened)
            path = config_path(plan.results, name, setup.method, setup.epsilon)
            try:
                result = experiment(setup, Path(tmp), services=services, say=lambda _m: None)
            except (RunError, OSError, httpx.HTTPError, LabelsPartyError) as exc:
                # one failed cell; the sweep goes on
                say(f"  {setup.method} ε={setup.epsilon:g}: FAILED {exc}")
                failure = {"dataset": name, "method": setup.method,
                           "epsilon": eps_name(setup.epsilon)[4:], "error": str(exc)}  # fmt: skip
                write_json(path, failure)
                continue
            write_json(path, result)
            seconds.append(result["seconds"])
            metric = result["mechanism_metric"]
            say(f"  {setup.method:<18} ε={setup.epsilon:<5g} test {metric} "
                f"{result['test'][metric]:,.4g}  ({result['seconds']:.1f} s)")  # fmt: skip
    return seconds


def _plan(args: argparse.Namespace) -> Plan:
    if args.quick:
        return Plan(datasets=tuple(args.datasets or ("rand-hie-spend",)), methods=None,
                    epsilons=(0.5, 2.0, math.inf), seeds=1, epochs=2,
                    max_examples={d: 2000 for d in (args.datasets or DATASETS)},
                    results=args.results or RESULTS / "quick", force=args.force)  # fmt: skip
    limits = dict(SWEEP_MAX_EXAMPLES)
    for item in args.max_examples or []:
        dataset, _, count = item.partition("=")
        limits[dataset] = int(count)
    return Plan(datasets=tuple(args.datasets or DATASETS),
                methods=tuple(args.methods) if args.methods else None,
                epsilons=tuple(args.epsilons or EPSILONS), seeds=args.seeds,
                epochs=args.epochs, max_examples=limits, results=args.results or RESULTS,
                force=args.force)  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="1 seed, 2,000 rows, 2 epochs, 3 ε")
    p.add_argument("--datasets", nargs="+", metavar="NAME", help=f"default: {' '.join(DATASETS)}")
    p.add_argument("--methods", nargs="+", metavar="METHOD", help="default: all of the task")
    p.add_argument("--epsilons", nargs="+", type=float, metavar="E",
                   help="default: 0.05 0.1 0.3 0.5 1 2 4 8 inf")  # fmt: skip
    p.add_argument("--seeds", type=int, default=5, help="default 5")
    p.add_argument("--epochs", type=int, default=20, help="default 20")
    p.add_argument("--max-examples", nargs="+", metavar="DATASET=N",
                   help="public subsampling (default: census-weeks=20000 "
                        "flights-delay=100000)")  # fmt: skip
    p.add_argument("--results", type=Path, metavar="DIR",
                   help=f"where the JSON goes (default {RESULTS.relative_to(ROOT.parent)}, "
                        "with --quick its quick/)")  # fmt: skip
    p.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="the Markdown (default bench/REPORT.md, with --quick beside the JSON)",
    )
    p.add_argument("--force", action="store_true", help="rerun configurations already stored")
    p.add_argument("--render-only", action="store_true", help="only re-render from the JSON")
    args = p.parse_args(argv)
    _check_args(p, args)
    return args


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every name and count up front: a typo must not surface hours into a sweep."""
    unknown = [d for d in args.datasets or [] if d not in LOADERS]
    if unknown:
        p.error(f"unknown dataset(s) {', '.join(unknown)}; known: {', '.join(sorted(LOADERS))}")
    unknown = [m for m in args.methods or [] if m not in METHODS]
    if unknown:
        p.error(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")
    for item in args.max_examples or []:
        dataset, _, count = item.partition("=")
        if dataset not in LOADERS or not count.isdigit() or int(count) < 1:
            p.error(f"--max-examples expects DATASET=N with a known dataset, got {item!r}")
    if args.quick and (args.methods or args.epsilons or args.max_examples):
        p.error("--quick sets its own methods, ε and rows; drop --methods, --epsilons and "
                "--max-examples, or drop --quick")  # fmt: skip


def _stop_on_term(signum: int, frame: object) -> None:
    """``kill PID`` stops the sweep like Ctrl-C: the services it started are stopped
    too, and every configuration already stored stays stored."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = _plan(args)
    # One training thread per process: on a small shared machine several torch
    # processes (this one, the worker) each spinning up a thread per core thrash.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not args.render_only:
        signal.signal(signal.SIGTERM, _stop_on_term)
    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    if not args.render_only:
        for name in plan.datasets:
            seconds = sweep_dataset(plan, name, say=say)
            if seconds:
                say(f"{name}: {len(seconds)} configuration(s), "
                    f"{sum(seconds) / len(seconds):.1f} s each on average")  # fmt: skip
    report = args.report or (plan.results / "REPORT.md" if args.quick else REPORT)
    command = "python -m bench.report " + " ".join(sys.argv[1:] if argv is None else argv)
    render(plan.results, report, datasets=_rendered(plan), command=command.strip(),
           max_examples=plan.max_examples, epsilons=plan.epsilons)  # fmt: skip
    say(f"wrote {report}")
    return 0


def _rendered(plan: Plan) -> list[str]:
    """The datasets to render: those asked for and any others already stored, in
    the sweep's order (so a narrower rerun does not reorder the report)."""
    found = sorted(p.name for p in plan.results.iterdir() if p.is_dir() and p.name != "quick") \
        if plan.results.is_dir() else []  # fmt: skip
    wanted = {*plan.datasets, *found}
    return [d for d in DATASETS if d in wanted] + sorted(wanted - set(DATASETS))


__all__ = ["EPSILONS", "REGRESSION", "Plan", "config_path", "main", "sweep_dataset"]

if __name__ == "__main__":
    sys.exit(main())
