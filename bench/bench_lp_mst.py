"""LP-1ST vs LP-2ST on Fashion-MNIST, through both real services.

``python -m bench.bench_lp_mst [--quick] [--examples N] [--epochs E] [--seeds S]``

For each seed and ε the advertiser declares a fresh dataset (budget ε) holding
the seed's training labels (an 80/20 split of a seeded subsample of the 70,000
images; both public configuration). Then, as the publisher:

* **LP-1ST** — one ``rr`` release of every training label, one training job;
* **LP-2ST** — ``POST /v1/multistage`` with two stages (40/60): ``rr`` on part 1,
  train, priors for part 2 from that model, ``rr-with-prior`` on part 2, train
  on both parts from the stage-1 weights with the top-k* filter
  (``rr-with-prior-lp-mst.txt`` Algorithm 3; supplement, Appendix B);
* **ε = ∞** — the same model trained on the true labels outside the services.

Every model is the small CNN of ``labeldp-pro.txt`` Table 10a; the referee
measures accuracy on the held-out true labels. Results: ``bench/results/lp_mst.json``
and a markdown table beside the paper's Table 4 (supplement) for Fashion-MNIST.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from feature_party.client import LabelsPartyClient
from labeldp.datasets import Dataset, fashion_mnist
from labeldp.experiment import subsample
from labeldp.harness import (
    Endpoints,
    Publisher,
    local_services,
    non_private_predictions,
    parquet_bytes,
)

RESULTS = Path(__file__).parent / "results" / "lp_mst.json"

#: The supplement's Table 4, Fashion-MNIST rows (Inception model, 60,000 training
#: images, 40 epochs per stage, mixup and data augmentation).
PAPER = {
    "LP-1ST": {"1": 80.78, "2": 90.18, "3": 92.52, "4": 93.50, "inf": 94.28},
    "LP-2ST": {"1": 83.26, "2": 91.24, "3": 93.18, "4": 94.10},
}


def training(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    return {"task": "classification", "loss": "cross-entropy", "architecture": "cnn",
            "epochs": args.epochs, "batch_size": 128, "learning_rate": 3e-3,
            "num_classes": 10, "optimizer": "adam", "validation_fraction": 0.1,
            "early_stopping_patience": None, "seed": seed}  # fmt: skip


def _dataset(
    endpoints: Endpoints, data: Dataset, rows: np.ndarray, epsilon: float
) -> tuple[str, str]:
    """A fresh dataset holding the training labels; (dataset id, client token)."""
    with LabelsPartyClient(endpoints.labels_url, endpoints.labels_admin_token) as admin:
        dataset = admin.create_dataset(
            name=f"fashion-mnist ε={epsilon:g}",
            task="classification",
            label_domain=data.label_domain,
            epsilon_budget=epsilon,
        )
        admin.upload_labels(dataset["id"], parquet_bytes(data.labels_table(rows)))
        client = admin.create_client(name="bench", role="client")
        admin.create_grant(dataset["id"], client_id=client["id"])
    return dataset["id"], client["token"]


def lp_1st(endpoints: Endpoints, publisher: Publisher, feature_set: str, data: Dataset,
           rows: np.ndarray, epsilon: float, train: dict[str, Any]) -> str:  # fmt: skip
    dataset_id, token = _dataset(endpoints, data, rows, epsilon)
    release = {"mechanism": {"name": "rr"}, "epsilon": epsilon}
    received = publisher.receive({"feature_set_id": feature_set, "token": token,
                                  "labels_party_url": endpoints.labels_url,
                                  "dataset_id": dataset_id, "release": release})  # fmt: skip
    job = publisher.train({"feature_set_id": feature_set, "labels_id": received["id"], **train},
                          say=lambda _: None)  # fmt: skip
    return str(job["model_id"])


def lp_2st(endpoints: Endpoints, publisher: Publisher, feature_set: str, data: Dataset,
           rows: np.ndarray, epsilon: float, train: dict[str, Any], seed: int) -> str:  # fmt: skip
    dataset_id, token = _dataset(endpoints, data, rows, epsilon)
    body = {"feature_set_id": feature_set, "labels_party_url": endpoints.labels_url,
            "token": token, "dataset_id": dataset_id, "epsilon": epsilon, "stages": 2,
            "seed": seed, "training": train}  # fmt: skip
    response = publisher.http.post("/v1/multistage", json=body)
    response.raise_for_status()
    run_id = response.json()["id"]
    while True:
        run = publisher.http.get(f"/v1/multistage/{run_id}").json()
        if run["status"] == "succeeded":
            return str(run["model_id"])
        if run["status"] != "running":
            raise RuntimeError(f"LP-2ST run {run_id} {run['status']}: {run['error']}")
        time.sleep(1.0)


def accuracy(publisher: Publisher, model_id: str, data: Dataset, test: np.ndarray) -> float:
    predicted = publisher.predict(model_id, data.features_table(test)).astype(np.int64)
    return float(np.mean(predicted == data.labels[test]))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every configuration not yet in ``args.output`` (with ``--resume``); the file
    is rewritten after each one, so an interrupted sweep loses at most one."""
    data = subsample(fashion_mnist(), args.examples, seed=0)
    report = _report(args)
    done = {(r["method"], r["epsilon"], r["seed"]) for r in report["results"]}

    def record(method: str, epsilon: float | str, seed: int, acc: float, started: float) -> None:
        seconds = time.perf_counter() - started
        report["results"].append({"method": method, "epsilon": epsilon, "seed": seed,
                                  "accuracy": acc, "seconds": seconds})  # fmt: skip
        _say(f"seed {seed} ε={epsilon} {method}: {acc:.4f}")
        _write(args.output, report)

    with tempfile.TemporaryDirectory() as tmp, local_services(Path(tmp), say=_say) as endpoints:
        publisher = Publisher(endpoints.features_url, endpoints.features_token)
        feature_set = publisher.upload_features(
            data.features_table(), {"numeric": data.numeric, "categorical": []}, name="fmnist"
        )
        for seed in range(args.seeds):
            train_rows, test_rows = data.split(seed=seed)
            config = training(args, seed)
            if ("non-private", "inf", seed) not in done:
                started = time.perf_counter()
                predicted = non_private_predictions(data, train_rows, test_rows, config, Path(tmp))
                acc = float(np.mean(predicted == data.labels[test_rows]))
                record("non-private", "inf", seed, acc, started)
            for epsilon in args.epsilons:
                for method in ("LP-1ST", "LP-2ST"):
                    if (method, epsilon, seed) in done:
                        continue
                    started = time.perf_counter()
                    if method == "LP-1ST":
                        model = lp_1st(endpoints, publisher, feature_set, data, train_rows,
                                       epsilon, config)  # fmt: skip
                    else:
                        model = lp_2st(endpoints, publisher, feature_set, data, train_rows,
                                       epsilon, config, seed)  # fmt: skip
                    record(method, epsilon, seed, accuracy(publisher, model, data, test_rows),
                           started)  # fmt: skip
        publisher.close()
    return report


def _report(args: argparse.Namespace) -> dict[str, Any]:
    fresh = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores",
        "command": "python -m bench.bench_lp_mst " + " ".join(sys.argv[1:]),
        "examples": args.examples,
        "epochs": args.epochs,
        "seeds": args.seeds,
        "results": [],
    }
    if not args.resume or not args.output.exists():
        return fresh
    old: dict[str, Any] = json.loads(args.output.read_text())
    if (old["examples"], old["epochs"]) != (args.examples, args.epochs):
        raise SystemExit("--resume: the stored results used other --examples/--epochs")
    return {**old, "seeds": args.seeds, "command": fresh["command"]}


def _write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**report, "table": table(report)}, indent=2) + "\n")


def table(report: dict[str, Any]) -> str:
    """Mean ± std accuracy (%) per method and ε, with the paper's numbers."""
    rows = report["results"]
    if not rows:
        return ""
    epsilons = [*sorted({r["epsilon"] for r in rows if r["epsilon"] != "inf"}), "inf"]
    head = "| method | " + " | ".join(f"ε={_key(e)}" if e != "inf" else "ε=∞" for e in epsilons)
    head += " |"
    lines = [head, "|" + "---|" * (len(epsilons) + 1)]
    for method in ("LP-1ST", "LP-2ST"):
        cells = []
        for e in epsilons:
            want = "non-private" if e == "inf" else method
            acc = [r["accuracy"] * 100 for r in rows if r["method"] == want and r["epsilon"] == e]
            cells.append(f"{np.mean(acc):.2f} ± {np.std(acc):.2f}" if acc else "—")
        lines.append(f"| {method} (ours) | " + " | ".join(cells) + " |")
        paper = PAPER[method]
        cells = [f"{paper[_key(e)]:.2f}" if _key(e) in paper else "—" for e in epsilons]
        lines.append(f"| {method} (paper) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _key(epsilon: float | str) -> str:
    return "inf" if epsilon == "inf" else f"{float(epsilon):g}"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10_000, help="images used (of 70,000)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs per stage")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--quick", action="store_true", help="1,000 images, 2 epochs, 1 seed, ε=1")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--resume", action="store_true", help="skip configurations in --output")
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.epochs, args.seeds, args.epsilons = 1000, 2, 1, [1.0]
    report = run(args)
    _write(args.output, report)
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
