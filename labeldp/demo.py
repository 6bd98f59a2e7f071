"""``labeldp demo``: both organizations, end to end, on the embedded default.

The demo starts a labels party, a features party and a worker as local processes
(SQLite, a temporary data directory, free loopback ports) — or talks to running
services given by URL — and plays both sides through the real HTTP APIs:

1. the advertiser declares a dataset (label domain, ε budget) and uploads the
   labels of a real dataset (RAND HIE medical spend, shipped in statsmodels);
2. the publisher uploads the features and asks for one release per mechanism,
   all at the same ε;
3. a worker trains on each release; the demo scores each model on held-out true
   labels, which only the demo (as referee) knows, next to a non-private baseline
   trained outside the services;
4. it prints a table and the audit verification, and writes a report.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from feature_party.client import LabelsPartyClient
from labeldp.datasets import load
from labeldp.harness import (
    Endpoints,
    Publisher,
    add_service_options,
    check_answering,
    endpoints_from,
    local_services,
    noisy_label_mse,
    non_private_baseline,
    parquet_bytes,
)
from labeldp.harness import RunError as DemoError
from shared.cli_errors import CommandError, amount_argument

__all__ = ["DemoError", "Plan", "default_plan", "play", "register", "run"]


@dataclass(frozen=True)
class Plan:
    """What the demo runs: mechanisms at one ε, and the training budget."""

    epsilon: float
    epochs: int
    mechanisms: list[dict[str, Any]]
    dataset: str = "rand-hie-spend"
    seed: int = 0
    batch_size: int = 512
    learning_rate: float = 3e-3

    def training(self) -> dict[str, Any]:
        """The training job's configuration (the same for every release)."""
        return {"task": "regression", "loss": "squared", "epochs": self.epochs,
                "batch_size": self.batch_size, "learning_rate": self.learning_rate,
                "seed": self.seed}  # fmt: skip

    @property
    def budget(self) -> float:
        return self.epsilon * len(self.mechanisms)


def shown_name(spec: dict[str, Any]) -> str:
    """A release's name in the report: clipped Laplace is not the unbiased Laplace."""
    return f"{spec['name']}-clipped" if spec.get("clip") else str(spec["name"])


def default_plan(*, quick: bool, epsilon: float) -> Plan:
    mechanisms: list[dict[str, Any]] = [
        {"name": "unbiased", "mesh": 200 if quick else 800},
        {"name": "rr-on-bins", "loss": "squared"},
        {"name": "laplace", "clip": True},
    ]
    return Plan(epsilon=epsilon, epochs=6 if quick else 20, mechanisms=mechanisms)


# -- the two organizations -----------------------------------------------------------


@dataclass
class Outcome:
    mechanism: str
    epsilon: float
    noisy_label_mse: float | None
    test_mse: float
    budget_left: float | None
    seconds: float
    release_id: str | None = None
    manifest: dict[str, Any] = field(default_factory=dict)


def play(
    endpoints: Endpoints, plan: Plan, workdir: Path, *, say: Callable[[str], None]
) -> dict[str, Any]:
    data = load(plan.dataset)
    train_rows, test_rows = data.split(seed=plan.seed)
    say(f"dataset {data.name}: {data.description}; {train_rows.size} training examples, "
        f"{test_rows.size} held out")  # fmt: skip

    # The advertiser: dataset, labels, a client for the publisher.
    with LabelsPartyClient(endpoints.labels_url, endpoints.labels_admin_token) as advertiser:
        dataset = advertiser.create_dataset(
            name=f"{data.name} demo", task=data.task, label_domain=data.label_domain,
            epsilon_budget=plan.budget,
        )  # fmt: skip
        advertiser.upload_labels(dataset["id"], parquet_bytes(data.labels_table(train_rows)))
        say(f"advertiser: dataset {dataset['id']} with ε budget {plan.budget:g}, "
            f"{train_rows.size} labels uploaded")  # fmt: skip
        client = advertiser.create_client(name="publisher", role="client")
        advertiser.create_grant(dataset["id"], client_id=client["id"])

    publisher = Publisher(endpoints.features_url, endpoints.features_token)
    roles = {"numeric": data.numeric, "categorical": data.categorical}
    feature_set = publisher.upload_features(data.features_table(), roles)
    say(f"publisher: feature set {feature_set} ({len(data)} rows, "
        f"{len(data.numeric)} numeric + {len(data.categorical)} categorical columns)")  # fmt: skip
    test_features = data.features_table(test_rows)
    true_train = dict(zip(data.example_id[train_rows], data.labels[train_rows], strict=True))

    outcomes: list[Outcome] = []
    for spec in plan.mechanisms:
        name = shown_name(spec)
        started = time.perf_counter()
        say(f"publisher: release with {name} at ε = {plan.epsilon:g}")
        received = publisher.receive({
            "feature_set_id": feature_set, "labels_party_url": endpoints.labels_url,
            "token": client["token"], "dataset_id": dataset["id"],
            "release": {"mechanism": spec, "epsilon": plan.epsilon,
                        "idempotency_key": f"demo-{spec['name']}"},
        })  # fmt: skip
        job = publisher.train(
            {"feature_set_id": feature_set, "labels_id": received["id"], **plan.training()},
            say=say,
        )
        predictions = publisher.predict(job["model_id"], test_features)
        test_mse = float(np.mean((predictions - data.labels[test_rows]) ** 2))
        noisy = noisy_label_mse(endpoints, client["token"], received["release_id"], true_train)
        with LabelsPartyClient(endpoints.labels_url, endpoints.labels_admin_token) as advertiser:
            budget = advertiser.get_budget(dataset["id"])
        outcomes.append(Outcome(name, plan.epsilon, noisy, test_mse,
                                float(budget["epsilon_remaining"]),
                                time.perf_counter() - started, received["release_id"],
                                received.get("manifest", {})))  # fmt: skip
        say(f"    test MSE {test_mse:,.0f}; noisy-label MSE {noisy:,.0f}")

    say("non-private baseline (trained on the true labels, outside the services)")
    baseline = non_private_baseline(data, train_rows, test_rows, plan.training(), workdir)
    outcomes.append(Outcome("non-private", float("inf"), 0.0, baseline, None, 0.0))
    with LabelsPartyClient(endpoints.labels_url, endpoints.labels_admin_token) as advertiser:
        verification = advertiser.verify_audit()
    return {"dataset": data, "outcomes": outcomes, "audit": verification, "test_rows": test_rows}


# -- reporting ---------------------------------------------------------------------


def format_table(outcomes: list[Outcome]) -> str:
    head = (
        f"{'mechanism':<15} {'ε':>5} {'noisy-label MSE':>16} {'test MSE':>10} {'budget left':>12}"
    )
    lines = [head, "-" * len(head)]
    for o in outcomes:
        eps = "∞" if o.epsilon == float("inf") else f"{o.epsilon:g}"
        noisy = "—" if o.noisy_label_mse is None else f"{o.noisy_label_mse:,.0f}"
        left = "—" if o.budget_left is None else f"{o.budget_left:g}"
        lines.append(f"{o.mechanism:<15} {eps:>5} {noisy:>16} {o.test_mse:>10,.0f} {left:>12}")
    return "\n".join(lines)


def write_report(result: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = result["outcomes"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [o.mechanism for o in outcomes]
    ax.bar(names, [o.test_mse for o in outcomes], color=["#4C72B0"] * (len(names) - 1) + ["#999"])
    ax.set_ylabel("test MSE (true labels)")
    ax.set_title(f"Privacy vs utility, ε = {outcomes[0].epsilon:g} ({result['dataset'].name})")
    fig.tight_layout()
    fig.savefig(out / "utility.png", dpi=120)
    plt.close(fig)

    bins = next((o for o in outcomes if o.mechanism == "rr-on-bins"), None)
    mech = (bins.manifest.get("mechanism") or {}) if bins else {}
    if mech.get("matrix"):
        matrix = np.asarray(mech["matrix"])
        fig, ax = plt.subplots(figsize=(5, 4))
        image = ax.imshow(matrix, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_xlabel("output bin")
        ax.set_ylabel("label value (grid index)")
        ax.set_title("RR-on-Bins transition matrix M[y, o]")
        fig.colorbar(image, ax=ax)
        fig.tight_layout()
        fig.savefig(out / "rr-on-bins-matrix.png", dpi=120)
        plt.close(fig)

    audit = result["audit"]
    report = [
        f"# labeldp demo — {result['dataset'].description}",
        "",
        "Each mechanism released the training labels once at the same ε; a worker trained the "
        "same MLP on each release; test MSE is against held-out true labels.",
        "",
        "```", format_table(outcomes), "```",
        "",
        f"Audit chain verified: **{audit.get('ok')}** ({audit.get('entries')} entries).",
        "",
        "![privacy vs utility](utility.png)",
        "",
        "![RR-on-Bins transition matrix](rr-on-bins-matrix.png)",
    ]  # fmt: skip
    path = out / "report.md"
    path.write_text("\n".join(report) + "\n")
    return path


# -- command -----------------------------------------------------------------------


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "demo",
        help="run both parties end to end on a real dataset and write a report",
        description=(__doc__ or "").replace("``", ""),  # plain text, not RST
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="fewer epochs and a coarser LP (CI)")
    p.add_argument(
        "--epsilon", type=amount_argument, default=1.0, help="ε of each release (default 1)"
    )
    p.add_argument("--output", type=Path, default=Path("labeldp-demo"),
                   help="report directory (default ./labeldp-demo)")  # fmt: skip
    add_service_options(p)
    p.set_defaults(handler=run)


def _writable_output(out: Path) -> None:
    """Refuse an ``--output`` the report could not be written to."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise CommandError(f"--output {out}: cannot write there ({exc.strerror})") from None


def run(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.epsilon) and args.epsilon > 0):
        raise CommandError(f"--epsilon must be a finite number > 0, got {args.epsilon}")
    plan = default_plan(quick=args.quick, epsilon=args.epsilon)
    _writable_output(args.output)  # before the minute of work, not after it
    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    with tempfile.TemporaryDirectory(prefix="labeldp-demo-") as tmp:
        workdir = Path(tmp)
        try:
            endpoints = endpoints_from(args.labels_party, args.labels_token,
                                       args.features_party, args.features_token)  # fmt: skip
            if endpoints is not None:
                check_answering(endpoints)
                result = play(endpoints, plan, workdir, say=say)
            else:
                with local_services(workdir, say=say) as endpoints:
                    result = play(endpoints, plan, workdir, say=say)
        except (httpx.HTTPError, OSError) as exc:
            raise DemoError(f"{type(exc).__name__}: {exc}") from exc
    print()
    print(format_table(result["outcomes"]))
    audit = result["audit"]
    print(f"\naudit verification: ok={audit.get('ok')} entries={audit.get('entries')}")
    try:
        report = write_report(result, args.output)
    except OSError as exc:
        raise DemoError(f"cannot write the report to {args.output}: {exc.strerror}") from None
    say(f"report written to {report.resolve()}")
    return 0 if audit.get("ok") else 1
