"""``labeldp experiment``: one configuration, end to end through both services.

One dataset, one method, one ε, several seeds. For each seed the experiment

1. splits the examples 80/20 by the seed (public configuration — the split,
   the preprocessing, the label domain and clip values are fixed before any label
   is read and are never computed from the labels inside the labels party);
2. as the advertiser, declares a fresh dataset at the labels party with budget ε
   and uploads the seed's training labels;
3. as the publisher, asks for one release of the method at ε, and a worker
   trains the model with the seed on it;
4. as the referee (who alone knows the true labels), measures the mechanism's
   noisy-label MSE on the training labels and the model's test MSE on the
   held-out true labels.

With ``--epsilon inf`` or ``--method non-private`` the model is trained on the
true labels outside the services (like the demo's baseline): nothing is released
and nothing is spent.

``--json`` prints one object on stdout (progress goes to stderr)::

  {"dataset", "method", "epsilon", "seeds", "mechanism_mse",
   "test": {"mse": mean, "mse_std": std}, "epsilon_spent", "seconds", ...}

``mechanism_mse`` and ``test.mse`` are means over the seeds, ``mse_std`` the
population standard deviation (0 for one seed); ``epsilon_spent`` is the **sum**
over the seeds' datasets of what each dataset's budget endpoint reports as spent
(ε × seeds when every release succeeded); ``epsilon`` is the string ``"inf"``
for a non-private run; ``per_seed`` has each seed's numbers and ids.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from feature_party.client import LabelsPartyClient
from labeldp.datasets import LOADERS, Dataset, load
from labeldp.harness import (
    Endpoints,
    Publisher,
    RunError,
    endpoints_from,
    local_services,
    noisy_label_mse,
    non_private_baseline,
    parquet_bytes,
)

__all__ = ["METHODS", "ExperimentError", "Setup", "load_user_data", "main", "register", "run"]

#: A failed step of a run (a service refused, a job failed): exit status 1.
ExperimentError = RunError

#: Each method's release ``mechanism`` object; ``None``: trained on the true labels.
METHODS: dict[str, dict[str, Any] | None] = {
    "non-private": None,
    "laplace": {"name": "laplace"},
    "laplace-clipped": {"name": "laplace", "clip": True},
    "staircase": {"name": "staircase"},
    "staircase-clipped": {"name": "staircase", "clip": True},
    "exponential": {"name": "exponential"},
    "rr-on-bins": {"name": "rr-on-bins", "loss": "squared"},
    "unbiased": {"name": "unbiased"},
}

TEST_FRACTION = 0.2


@dataclasses.dataclass(frozen=True)
class Setup:
    """One configuration: all of it public."""

    data: Dataset
    method: str
    epsilon: float
    seeds: int
    epochs: int = 20
    batch_size: int = 512
    learning_rate: float = 3e-3
    mesh: int | None = None

    @property
    def private(self) -> bool:
        return METHODS[self.method] is not None and math.isfinite(self.epsilon)

    def mechanism(self) -> dict[str, Any]:
        spec = dict(METHODS[self.method] or {})
        if self.method == "unbiased" and self.mesh is not None:
            spec["mesh"] = self.mesh
        return spec

    def training(self, seed: int) -> dict[str, Any]:
        return {"task": "regression", "loss": "squared", "epochs": self.epochs,
                "batch_size": self.batch_size, "learning_rate": self.learning_rate,
                "seed": seed}  # fmt: skip


# -- data --------------------------------------------------------------------------


def subsample(data: Dataset, max_examples: int, *, seed: int = 0) -> Dataset:
    """At most ``max_examples`` rows, chosen by a seeded permutation of the rows —
    never by looking at the labels (public configuration)."""
    if max_examples >= len(data):
        return data
    rows = np.sort(np.random.default_rng(seed).permutation(len(data))[:max_examples])
    return dataclasses.replace(
        data,
        example_id=data.example_id[rows],
        labels=data.labels[rows],
        features=data.features.take(pa.array(rows)),
        description=f"{data.description}; {max_examples} of {len(data)} rows",
    )


def _read_table(path: Path) -> pa.Table:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return pacsv.read_csv(path)
    if suffix in (".parquet", ".pq"):
        return pq.read_table(path)
    raise ValueError(f"{path}: expected a .csv or .parquet file")


def parse_domain(text: str) -> dict[str, Any]:
    """``--domain``: a JSON object (or a path to one) ``{"min", "max", ...}``."""
    try:
        source = text if text.lstrip().startswith("{") else Path(text).read_text()
        domain = json.loads(source)
    except OSError as exc:
        raise ValueError(f"--domain: not a JSON object nor a readable file: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"--domain is not valid JSON: {exc}") from None
    if not isinstance(domain, dict) or not {"min", "max"} <= domain.keys():
        raise ValueError('--domain must be a JSON object with "min" and "max"')
    if not float(domain["min"]) < float(domain["max"]):
        raise ValueError("--domain: min must be < max")
    return domain


def load_user_data(
    labels_path: Path,
    features_path: Path,
    *,
    task: str,
    domain: dict[str, Any],
    categorical: Sequence[str] = (),
) -> Dataset:
    """The user's own data: ``example_id, label`` and ``example_id, <features>``
    (CSV or Parquet), joined on ``example_id``. Feature columns of string or
    boolean type, and those named in ``categorical``, are categorical; the rest
    numeric (nulls filled with 0)."""
    if task != "regression":
        raise ValueError(f"--task {task!r}: experiments support regression only")
    labels, features = _read_table(labels_path), _read_table(features_path)
    for name, table, needed in (("labels", labels, {"example_id", "label"}),
                                ("features", features, {"example_id"})):  # fmt: skip
        missing = needed - set(table.column_names)
        if missing:
            raise ValueError(f"--{name} file lacks column(s) {', '.join(sorted(missing))}")
    feature_ids = features.column("example_id").cast(pa.string()).to_numpy(zero_copy_only=False)
    label_ids = labels.column("example_id").cast(pa.string()).to_numpy(zero_copy_only=False)
    if len(set(feature_ids)) != len(feature_ids) or len(set(label_ids)) != len(label_ids):
        raise ValueError("example_id must be unique in each file")
    position = {example_id: i for i, example_id in enumerate(feature_ids)}
    unknown = [i for i in label_ids if i not in position]
    if unknown:
        raise ValueError(f"{len(unknown)} labelled example_id(s) have no features, "
                         f"e.g. {unknown[0]!r}")  # fmt: skip
    rows = np.array([position[i] for i in label_ids], dtype=np.int64)
    values = labels.column("label").cast(pa.float64())
    if values.null_count:
        raise ValueError("--labels: the label column has empty values")
    columns = [c for c in features.column_names if c != "example_id"]
    unknown_cat = set(categorical) - set(columns)
    if unknown_cat:
        raise ValueError(f"--categorical: no feature column(s) {', '.join(sorted(unknown_cat))}")
    table = features.select(columns).take(pa.array(rows))
    cats = [c for c in columns if c in categorical or pa.types.is_string(table.schema.field(c).type)
            or pa.types.is_boolean(table.schema.field(c).type)]  # fmt: skip
    numeric = [c for c in columns if c not in cats]
    table = pa.table({c: (pc.fill_null(table.column(c), 0) if c in numeric else table.column(c))
                      for c in columns})  # fmt: skip
    return Dataset(
        name=labels_path.stem,
        task=task,
        description=f"{labels_path.name} + {features_path.name}",
        example_id=np.asarray(label_ids, dtype=object).astype(str),
        labels=values.to_numpy(zero_copy_only=False).astype(np.float64),
        features=table,
        label_domain=domain,
        numeric=numeric,
        categorical=cats,
    )


# -- one seed ----------------------------------------------------------------------


def _one_seed(
    endpoints: Endpoints,
    setup: Setup,
    seed: int,
    feature_set: str,
    publisher: Publisher,
    *,
    say: Callable[[str], None],
) -> dict[str, Any]:
    data = setup.data
    train_rows, test_rows = data.split(seed=seed, test_fraction=TEST_FRACTION)
    with LabelsPartyClient(endpoints.labels_url, endpoints.labels_admin_token) as advertiser:
        dataset = advertiser.create_dataset(
            name=f"{data.name} experiment {setup.method} seed {seed}", task=data.task,
            label_domain=data.label_domain, epsilon_budget=setup.epsilon,
        )  # fmt: skip
        advertiser.upload_labels(dataset["id"], parquet_bytes(data.labels_table(train_rows)))
        client = advertiser.create_client(name=f"experiment seed {seed}", role="client")
        advertiser.create_grant(dataset["id"], client_id=client["id"])
    say(f"seed {seed}: dataset {dataset['id']} (ε budget {setup.epsilon:g}), "
        f"{train_rows.size} training labels; release with {setup.method}")  # fmt: skip
    received = publisher.receive({
        "feature_set_id": feature_set, "labels_party_url": endpoints.labels_url,
        "token": client["token"], "dataset_id": dataset["id"],
        "release": {"mechanism": setup.mechanism(), "epsilon": setup.epsilon,
                    "idempotency_key": f"experiment-{dataset['id']}"},
    })  # fmt: skip
    job = publisher.train(
        {"feature_set_id": feature_set, "labels_id": received["id"], **setup.training(seed)},
        say=say,
    )
    predictions = publisher.predict(job["model_id"], data.features_table(test_rows))
    test_mse = float(np.mean((predictions - data.labels[test_rows]) ** 2))
    truth = dict(zip(data.example_id[train_rows], data.labels[train_rows], strict=True))
    mechanism_mse = noisy_label_mse(endpoints, client["token"], received["release_id"], truth)
    with LabelsPartyClient(endpoints.labels_url, endpoints.labels_admin_token) as advertiser:
        budget = advertiser.get_budget(dataset["id"])
    spent = float(budget["epsilon_spent"])
    say(f"seed {seed}: test MSE {test_mse:,.1f}; mechanism MSE {mechanism_mse:,.1f}; "
        f"ε spent {spent:g}")  # fmt: skip
    return {"seed": seed, "mechanism_mse": mechanism_mse, "mse": test_mse,
            "epsilon_spent": spent, "dataset_id": dataset["id"],
            "release_id": received["release_id"]}  # fmt: skip


def _non_private_seed(
    setup: Setup, seed: int, workdir: Path, *, say: Callable[[str], None]
) -> dict[str, Any]:
    data = setup.data
    train_rows, test_rows = data.split(seed=seed, test_fraction=TEST_FRACTION)
    say(f"seed {seed}: training on the {train_rows.size} true labels, outside the services")
    test_mse = non_private_baseline(data, train_rows, test_rows, setup.training(seed), workdir)
    say(f"seed {seed}: test MSE {test_mse:,.1f}")
    return {"seed": seed, "mechanism_mse": 0.0, "mse": test_mse, "epsilon_spent": 0.0}


def experiment(
    setup: Setup,
    workdir: Path,
    *,
    endpoints: Endpoints | None,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Run ``setup`` (through ``endpoints``, or local services started here)."""
    started = time.perf_counter()
    data = setup.data
    say(f"dataset {data.name}: {data.description}; {len(data)} examples; method "
        f"{setup.method}, ε = {setup.epsilon:g}, {setup.seeds} seed(s)")  # fmt: skip
    per_seed: list[dict[str, Any]] = []
    if not setup.private:
        per_seed = [_non_private_seed(setup, s, workdir, say=say) for s in range(setup.seeds)]
    else:

        def play(endpoints: Endpoints) -> None:
            publisher = Publisher(endpoints.features_url, endpoints.features_token)
            try:
                roles = {"numeric": data.numeric, "categorical": data.categorical}
                feature_set = publisher.upload_features(
                    data.features_table(), roles, name=f"{data.name} experiment features"
                )
                for seed in range(setup.seeds):
                    per_seed.append(_one_seed(endpoints, setup, seed, feature_set, publisher,
                                              say=say))  # fmt: skip
            finally:
                publisher.close()

        if endpoints is not None:
            play(endpoints)
        else:
            with local_services(workdir, say=say) as local:
                play(local)
    mse = np.array([r["mse"] for r in per_seed])
    mechanism = np.array([r["mechanism_mse"] for r in per_seed])
    return {
        "dataset": data.name,
        "method": setup.method,
        "epsilon": setup.epsilon if setup.private else "inf",
        "seeds": setup.seeds,
        "examples": len(data),
        "epochs": setup.epochs,
        "mechanism_mse": float(mechanism.mean()),
        "test": {"mse": float(mse.mean()), "mse_std": float(mse.std())},
        "epsilon_spent": float(sum(r["epsilon_spent"] for r in per_seed)),
        "seconds": round(time.perf_counter() - started, 3),
        "per_seed": per_seed,
    }


# -- command -----------------------------------------------------------------------


def _epsilon(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "experiment",
        help="run one dataset × method × ε over seeds through both services; report MSEs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dataset", metavar="NAME",
                   help=f"a shipped dataset: {', '.join(sorted(LOADERS))} "
                        "(or give --labels and --features)")  # fmt: skip
    p.add_argument("--method", required=True, metavar="METHOD",
                   help=f"one of: {', '.join(METHODS)}")  # fmt: skip
    p.add_argument("--epsilon", type=_epsilon, metavar="E",
                   help="ε of each release (> 0; 'inf': non-private); required unless "
                        "--method non-private")  # fmt: skip
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="seeds 0..N-1: split, dataset, release and training each (default 1)",
    )
    p.add_argument("--epochs", type=int, default=20, help="training epochs (default 20)")
    p.add_argument("--batch-size", type=int, default=512, help="default 512")
    p.add_argument("--learning-rate", type=float, default=3e-3, help="default 3e-3")
    p.add_argument("--mesh", type=int, help="unbiased: the LP's output grid (service default)")
    p.add_argument(
        "--max-examples",
        type=int,
        metavar="N",
        help="use at most N examples, chosen by a fixed seeded permutation of the "
        "rows, before the split (public configuration; for quick runs)",
    )
    p.add_argument(
        "--labels",
        type=Path,
        metavar="FILE",
        help="your own labels: CSV/Parquet with example_id, label",
    )
    p.add_argument(
        "--features",
        type=Path,
        metavar="FILE",
        help="your own features: CSV/Parquet with example_id and feature columns",
    )
    p.add_argument("--task", default="regression", help="with --labels: regression (default)")
    p.add_argument(
        "--domain",
        metavar="JSON",
        help='with --labels: the public label domain, e.g. \'{"min": 0, "max": 100}\'',
    )
    p.add_argument("--categorical", default="", metavar="COLS",
                   help="with --labels: comma-separated feature columns to treat as categorical "
                        "(string and boolean columns always are)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print only the result object on stdout")
    p.add_argument("--labels-party", metavar="URL", help="use a running labels party")
    p.add_argument("--labels-token", metavar="TOKEN", help="its admin token")
    p.add_argument("--features-party", metavar="URL", help="use a running features party")
    p.add_argument("--features-token", metavar="TOKEN", help="its admin token")
    p.set_defaults(handler=run)


def setup_from(args: argparse.Namespace) -> Setup:
    """Check the arguments (``ValueError`` on bad input) and load the data."""
    if args.method not in METHODS:
        raise ValueError(f"unknown method {args.method!r}; known: {', '.join(METHODS)}")
    epsilon = args.epsilon
    if epsilon is None:
        if args.method != "non-private":
            raise ValueError("--epsilon is required (a number > 0, or inf)")
        epsilon = math.inf
    if math.isnan(epsilon) or epsilon <= 0:
        raise ValueError(f"--epsilon must be > 0 (or inf), not {epsilon:g}")
    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, not {args.seeds}")
    if args.epochs < 1:
        raise ValueError(f"--epochs must be at least 1, not {args.epochs}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, not {args.batch_size}")
    if not args.learning_rate > 0:
        raise ValueError(f"--learning-rate must be > 0, not {args.learning_rate:g}")
    if args.max_examples is not None and args.max_examples < 10:
        raise ValueError(f"--max-examples must be at least 10, not {args.max_examples}")
    if args.mesh is not None and args.mesh < 2:
        raise ValueError(f"--mesh must be at least 2, not {args.mesh}")
    own = [args.labels, args.features, args.domain]
    if args.dataset is not None:
        if any(own):
            raise ValueError("give --dataset, or --labels, --features and --domain, not both")
        if args.dataset not in LOADERS:
            raise ValueError(f"unknown dataset {args.dataset!r}; known: "
                             f"{', '.join(sorted(LOADERS))}")  # fmt: skip
        data = load(args.dataset)
    elif all(own):
        categorical = [c.strip() for c in args.categorical.split(",") if c.strip()]
        domain = parse_domain(args.domain)
        data = load_user_data(
            args.labels, args.features, task=args.task, domain=domain, categorical=categorical
        )
    else:
        raise ValueError("give --dataset NAME, or --labels FILE --features FILE --domain JSON")
    if args.max_examples is not None:
        data = subsample(data, args.max_examples)
    return Setup(data=data, method=args.method, epsilon=epsilon, seeds=args.seeds,
                 epochs=args.epochs, batch_size=args.batch_size,
                 learning_rate=args.learning_rate, mesh=args.mesh)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    try:
        endpoints = endpoints_from(args.labels_party, args.labels_token,
                                   args.features_party, args.features_token)  # fmt: skip
    except RunError as exc:
        raise ValueError(str(exc)) from None
    setup = setup_from(args)
    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="labeldp-experiment-") as tmp:
        try:
            result = experiment(setup, Path(tmp), endpoints=endpoints, say=say)
        except (httpx.HTTPError, OSError) as exc:
            raise ExperimentError(f"{type(exc).__name__}: {exc}") from exc
    if args.json:
        print(json.dumps(result))
    else:
        eps = result["epsilon"]
        print(f"{result['dataset']}  {result['method']}  ε = {eps}  seeds = {result['seeds']}")
        print(f"  mechanism MSE  {result['mechanism_mse']:,.1f}")
        print(f"  test MSE       {result['test']['mse']:,.1f} ± {result['test']['mse_std']:,.1f}")
        print(f"  ε spent        {result['epsilon_spent']:g}")
        print(f"  seconds        {result['seconds']:.1f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``labeldp experiment`` on its own, with the CLI's error mapping (for tests)."""
    from feature_party.client import LabelsPartyError
    from labeldp.processes import ServiceStartError

    parser = argparse.ArgumentParser(prog="labeldp")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["experiment", *(argv or [])])
    try:
        result: int = args.handler(args)
    except ValueError as exc:
        print(f"labeldp: error: {exc}", file=sys.stderr)
        return 2
    except (RunError, LabelsPartyError, ServiceStartError) as exc:
        print(f"labeldp: error: {exc}", file=sys.stderr)
        return 1
    return result
