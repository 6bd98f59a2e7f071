"""``labeldp experiment``: one configuration, end to end through both services.

One dataset, one method, one ε, several seeds. For each seed the experiment

1. splits the examples 80/20 by the seed (public configuration — the split,
   the preprocessing, the label domain and clip values are fixed before any label
   is read and are never computed from the labels inside the labels party);
2. as the advertiser, declares a fresh dataset at the labels party with budget ε
   and uploads the seed's training labels;
3. as the publisher, asks for one release of the method at ε (uploading first
   whatever label-independent input the method needs, e.g. feature clusters),
   and a worker trains the model with the seed on it;
4. as the referee (who alone knows the true labels), measures the released
   labels against the true training labels and the model on the held-out true
   labels.

With ``--epsilon inf`` or ``--method non-private`` the model is trained on the
true labels outside the services (like the demo's baseline): nothing is released
and nothing is spent.

Regression datasets report MSE; classification datasets (``fashion-mnist``, ``mnist-5k``)
report accuracy. ``--json`` prints one object on stdout (progress goes to
stderr)::

  {"dataset", "method", "epsilon", "seeds", "mechanism_mse",
   "test": {"mse": mean, "mse_std": std}, "epsilon_spent", "seconds", ...}

with ``"test": {"accuracy", "accuracy_std"}`` for classification, where
``mechanism_mse`` is the noisy-label *accuracy* (the issue's name for the
mechanism column; ``mechanism_metric`` says which). Means are over the seeds,
stds the population standard deviation (0 for one seed); ``epsilon_spent`` is
the **sum** over the seeds' datasets of what each dataset's budget endpoint
reports as spent (ε × seeds when every release succeeded); ``epsilon`` is the
string ``"inf"`` for a non-private run; ``per_seed`` has each seed's numbers
and ids.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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
    add_service_options,
    align,
    check_answering,
    endpoints_from,
    local_services,
    non_private_predictions,
    parquet_bytes,
    released_labels,
)

__all__ = ["METHODS", "ExperimentError", "Method", "Services", "Setup",
           "load_user_data", "main", "register", "run"]  # fmt: skip

#: A failed step of a run (a service refused, a job failed): exit status 1.
ExperimentError = RunError

REGRESSION, CLASSIFICATION = "regression", "classification"
TEST_FRACTION = 0.2
#: Public default of ``rr-with-prior-groups``: how many feature clusters.
DEFAULT_GROUPS = 20


# -- methods -----------------------------------------------------------------------


@dataclasses.dataclass
class SeedContext:
    """Everything one seed of a private method works with: a fresh labels-party
    dataset holding the seed's training labels, and the publisher's client token."""

    services: Services
    setup: Setup
    seed: int
    train_rows: np.ndarray
    test_rows: np.ndarray
    dataset_id: str
    token: str
    feature_set: str
    say: Callable[[str], None]


@dataclasses.dataclass
class Played:
    """What a method produced for one seed: test-row predictions and, for a label
    release, its id (``None`` for a method that releases a model, e.g. DP-SGD)."""

    predictions: np.ndarray
    release_id: str | None


#: A method's whole per-seed protocol. Methods that release labels once and train
#: on them use :func:`release_and_train`; multi-stage or central methods
#: (``lp-2st``, ``dp-sgd``, ``labeldp-pro``) have their own.
SeedPlay = Callable[[SeedContext], Played]
#: Uploads a method's label-independent input (groups, priors) for one seed and
#: returns the parameters the release's ``mechanism`` object gains.
Prepare = Callable[[SeedContext], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Method:
    """One row of the report: which task, which release, which training loss."""

    name: str
    tasks: frozenset[str]
    mechanism: dict[str, Any] | None  # None: trained on the true labels
    loss: dict[str, str]  # task → training loss
    prepare: Prepare | None = None
    play: SeedPlay | None = None  # None: release_and_train

    def training_loss(self, task: str) -> str:
        return self.loss[task]

    @property
    def private(self) -> bool:
        """Whether it goes through the services (a release, or its own protocol)."""
        return self.mechanism is not None or self.play is not None


def _regression(name: str, mechanism: dict[str, Any]) -> Method:
    return Method(name, frozenset({REGRESSION}), mechanism, {REGRESSION: "squared"})


def _classification(
    name: str,
    mechanism: dict[str, Any],
    loss: str = "cross-entropy",
    prepare: Prepare | None = None,
) -> Method:
    return Method(name, frozenset({CLASSIFICATION}), mechanism, {CLASSIFICATION: loss}, prepare)


def _upload_groups(ctx: SeedContext) -> dict[str, Any]:
    """``rr-with-prior-groups``: the publisher clusters its own features (no label
    is read; Algorithm 4 of ``rr-with-prior-lp-mst-supplementary.txt``) and uploads
    the groups; the labels party then uses per-group private histograms as priors."""
    groups = ctx.services.groups(ctx.setup.data, ctx.setup.groups)
    table = pa.table({"example_id": ctx.setup.data.example_id, "group": groups})
    with LabelsPartyClient(ctx.services.endpoints.labels_url, ctx.token) as publisher:
        prior = publisher.upload_priors(ctx.dataset_id, parquet_bytes(table), kind="groups")
    ctx.say(f"seed {ctx.seed}: uploaded {ctx.setup.groups} feature clusters as prior {prior.id}")
    return {"prior_id": prior.id}


def _lp_2st(ctx: SeedContext) -> Played:
    """``lp-2st``: LP-MST with two stages (``rr-with-prior-lp-mst.txt`` Algorithm 3),
    driven by the features party (``POST /v1/multistage``): ``rr`` on a random 40%,
    then ``rr-with-prior`` on the rest with the stage-1 model's priors. Two
    releases, so no single noisy-label accuracy is reported."""
    setup, publisher = ctx.setup, ctx.services.publisher
    run = publisher.multistage(
        {"feature_set_id": ctx.feature_set, "labels_party_url": ctx.services.endpoints.labels_url,
         "token": ctx.token, "dataset_id": ctx.dataset_id, "epsilon": setup.epsilon,
         "stages": 2, "seed": ctx.seed, "training": setup.training(ctx.seed)},
        say=ctx.say,
    )  # fmt: skip
    predictions = publisher.predict(run["model_id"], setup.data.features_table(ctx.test_rows))
    return Played(predictions=predictions, release_id=None)


#: Public DP-SGD settings of the central methods (``labeldp-pro.txt`` Appendix D;
#: the values ``bench/bench_labeldp_pro.py`` uses on a CPU), and ALTCONV's own
#: (the labels party refuses them for a denoiser that does not read them).
CENTRAL_SPEC = {"optimizer": "momentum", "learning_rate": 0.3, "clip_norm": 1.0}
ALT_CONV_SPEC = {"alt_batch_size": 64, "projection_steps": 100, "projection_method": "fista",
                 "smoothing": 1.0}  # fmt: skip


def delta_for(n: int) -> float:
    """δ ≤ 1/n with at most 12 decimals (the ledger is exact to 18; a float's
    ``1/n`` has more digits than the API accepts)."""
    return math.floor(1e12 / n) / 1e12


def _central(denoiser: str) -> SeedPlay:
    """``dp-sgd`` (``noop``) and ``labeldp-pro`` (``alt-conv``): the publisher sends
    its features of the training rows to the labels party, whose worker trains by
    DP-SGD at (ε, δ = 1/n) (``POST /v1/datasets/{id}/trainings``); the model is the
    release, imported into the features party's registry to predict."""

    def play(ctx: SeedContext) -> Played:
        setup, endpoints = ctx.setup, ctx.services.endpoints
        training = setup.training(ctx.seed)
        spec = {**CENTRAL_SPEC, **(ALT_CONV_SPEC if denoiser == "alt-conv" else {}),
                "epsilon": setup.epsilon, "delta": delta_for(ctx.train_rows.size),
                "denoiser": denoiser, "epochs": setup.epochs,
                "architecture": "cnn" if training.get("architecture") == "cnn" else "mlp",
                "idempotency_key": f"experiment-{ctx.dataset_id}"}  # fmt: skip
        features = parquet_bytes(setup.data.features_table(ctx.train_rows))
        with LabelsPartyClient(endpoints.labels_url, ctx.token) as publisher:
            job = publisher.create_training(ctx.dataset_id, features, spec)
            while job["status"] in ("queued", "running"):
                time.sleep(0.5)
                job = publisher.get_training(job["id"])
        if job["status"] != "succeeded":
            raise RunError(f"training {job['id']} {job['status']}: {job.get('error')}")
        ctx.say(f"seed {ctx.seed}: {denoiser} model trained at ε = {setup.epsilon:g}")
        model = ctx.services.publisher.import_model(endpoints.labels_url, ctx.token, job["id"])
        test = setup.data.features_table(ctx.test_rows)
        return Played(predictions=ctx.services.publisher.predict(model, test), release_id=None)

    return play


METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method("non-private", frozenset({REGRESSION, CLASSIFICATION}), None,
               {REGRESSION: "squared", CLASSIFICATION: "cross-entropy"}),
        _regression("laplace", {"name": "laplace"}),
        _regression("laplace-clipped", {"name": "laplace", "clip": True}),
        _regression("staircase", {"name": "staircase"}),
        _regression("staircase-clipped", {"name": "staircase", "clip": True}),
        _regression("exponential", {"name": "exponential"}),
        _regression("rr-on-bins", {"name": "rr-on-bins", "loss": "squared"}),
        _regression("unbiased", {"name": "unbiased"}),
        _classification("rr", {"name": "rr"}),
        _classification("rr-debiased", {"name": "rr"}, loss="rr-debiased-cross-entropy"),
        _classification("rr-with-prior-groups",
                        {"name": "rr-with-prior", "prior_source": "groups"},
                        prepare=_upload_groups),
        Method("lp-2st", frozenset({CLASSIFICATION}), None, {CLASSIFICATION: "cross-entropy"},
               play=_lp_2st),
        Method("dp-sgd", frozenset({CLASSIFICATION}), None, {CLASSIFICATION: "cross-entropy"},
               play=_central("noop")),
        Method("labeldp-pro", frozenset({CLASSIFICATION}), None,
               {CLASSIFICATION: "cross-entropy"}, play=_central("alt-conv")),
    ]
}  # fmt: skip


def methods_for(task: str) -> list[str]:
    """The methods an experiment on a ``task`` dataset can run."""
    return [name for name, m in METHODS.items() if task in m.tasks]


def metric_of(task: str) -> str:
    """The test metric: MSE for regression, accuracy for classification."""
    return "accuracy" if task == CLASSIFICATION else "mse"


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
    groups: int = DEFAULT_GROUPS

    @property
    def private(self) -> bool:
        return METHODS[self.method].private and math.isfinite(self.epsilon)

    def mechanism(self) -> dict[str, Any]:
        spec = dict(METHODS[self.method].mechanism or {})
        if self.method == "unbiased" and self.mesh is not None:
            spec["mesh"] = self.mesh
        return spec

    def training(self, seed: int) -> dict[str, Any]:
        task = self.data.task
        # On the true labels (ε = ∞) a debiased loss is the plain one (RR keeps
        # every label: p = K/(e^ε + K − 1) = 0), and there is no release to read.
        loss = METHODS[self.method if self.private else "non-private"].training_loss(task)
        body = {"task": task, "loss": loss,
                "epochs": self.epochs, "batch_size": self.batch_size,
                "learning_rate": self.learning_rate, "seed": seed,
                **self.data.training}  # fmt: skip
        if task == CLASSIFICATION:
            body["num_classes"] = int(self.data.label_domain["num_classes"])
        return body


# -- the services, reused ------------------------------------------------------------


class Services:
    """One running pair of services and the publisher's session with them, reused
    across configurations (the report's sweep): each dataset's features are
    uploaded once, and its feature clusters computed once."""

    def __init__(
        self, endpoints: Endpoints, *, poll_seconds: float = 0.5, timeout: float = 120.0
    ) -> None:
        self.endpoints = endpoints
        self.publisher = Publisher(endpoints.features_url, endpoints.features_token,
                                   poll_seconds=poll_seconds, timeout=timeout)  # fmt: skip
        self._feature_sets: dict[tuple[str, int, str], str] = {}
        self._groups: dict[tuple[str, int, int], np.ndarray] = {}

    @staticmethod
    def _key(data: Dataset) -> tuple[str, int, str]:
        return (data.name, len(data), data.description)

    def feature_set(self, data: Dataset, *, say: Callable[[str], None]) -> str:
        key = self._key(data)
        if key not in self._feature_sets:
            roles = {"numeric": data.numeric, "categorical": data.categorical}
            self._feature_sets[key] = self.publisher.upload_features(
                data.features_table(), roles, name=f"{data.name} experiment features"
            )
            say(f"uploaded {len(data)} feature rows as {self._feature_sets[key]}")
        return self._feature_sets[key]

    def groups(self, data: Dataset, count: int) -> np.ndarray:
        key = (*self._key(data)[:2], count)
        if key not in self._groups:
            self._groups[key] = feature_clusters(data, count)
        return self._groups[key]

    def close(self) -> None:
        self.publisher.close()


@contextmanager
def services_for(
    endpoints: Endpoints | None,
    workdir: Path,
    *,
    say: Callable[[str], None],
    poll_seconds: float = 0.5,
    timeout: float = 120.0,
) -> Iterator[Services]:
    """:class:`Services` on ``endpoints``, or on local ones started here (whose
    worker looks for jobs every ``poll_seconds``, as the publisher polls them, and
    whose features party waits up to ``timeout`` seconds for a release: the
    unbiased randomizer's LP at large ε and k ≈ 190 takes minutes)."""
    if endpoints is not None:
        services = Services(endpoints, poll_seconds=poll_seconds, timeout=timeout)
        try:
            yield services
        finally:
            services.close()
        return
    env = {"LABELDP_POLL_SECONDS": f"{poll_seconds:g}",
           "LABELDP_CLIENT_TIMEOUT_SECONDS": f"{timeout:g}"}  # fmt: skip
    with local_services(workdir, say=say, features_env=env) as local:
        services = Services(local, poll_seconds=poll_seconds, timeout=timeout)
        try:
            yield services
        finally:
            services.close()


def feature_clusters(data: Dataset, count: int, *, seed: int = 0, rounds: int = 15) -> np.ndarray:
    """Seeded k-means (Lloyd's rounds from ``count`` distinct rows) over the numeric
    features, standardized — the publisher's own grouping, from features only."""
    x = np.column_stack([data.features.column(c).to_numpy().astype(np.float32)
                         for c in data.numeric])  # fmt: skip
    x = (x - x.mean(axis=0)) / np.maximum(x.std(axis=0), 1e-6)
    rng = np.random.default_rng(seed)
    centers = x[rng.choice(len(x), size=min(count, len(x)), replace=False)]
    assign = np.zeros(len(x), dtype=np.int64)
    for _ in range(rounds):
        distance = (centers**2).sum(axis=1)[None, :] - 2.0 * (x @ centers.T)
        assign = distance.argmin(axis=1)
        for k in range(len(centers)):
            members = x[assign == k]
            if len(members):  # an empty cluster keeps its center
                centers[k] = members.mean(axis=0)
    return assign


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


def _read_table(path: Path, option: str) -> pa.Table:
    """The file of ``--labels`` or ``--features``. Arrow's parse errors quote the
    offending cell, which may be a label (DESIGN.md §3.1), so they are replaced."""
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet", ".pq"):
        raise ValueError(f"{option} {path}: expected a .csv or .parquet file")
    try:
        return pacsv.read_csv(path) if suffix == ".csv" else pq.read_table(path)
    except OSError as exc:
        raise ValueError(f"{option} {path}: {exc.strerror or 'cannot be read'}") from None
    except pa.ArrowException:
        raise ValueError(
            f"{option} {path}: not a readable {suffix.lstrip('.')} table (check the header, "
            "the separator and that every row has as many fields)"
        ) from None


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


def _check_own_task(task: str) -> None:
    if task != "regression":
        raise ValueError(
            f"--task {task!r}: your own data (--labels) must be regression; the "
            "classification datasets run with --dataset"
        )


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
    _check_own_task(task)
    labels = _read_table(labels_path, "--labels")
    features = _read_table(features_path, "--features")
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
    try:
        values = labels.column("label").cast(pa.float64())
    except pa.ArrowException:  # its message quotes the label: never shown
        raise ValueError("--labels: every label must be a number") from None
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


def release_and_train(ctx: SeedContext) -> Played:
    """The common protocol: one release of the method at ε, one training job on it."""
    setup, publisher = ctx.setup, ctx.services.publisher
    mechanism = setup.mechanism()
    method = METHODS[setup.method]
    if method.prepare is not None:
        mechanism.update(method.prepare(ctx))
    received = publisher.receive({
        "feature_set_id": ctx.feature_set, "labels_party_url": ctx.services.endpoints.labels_url,
        "token": ctx.token, "dataset_id": ctx.dataset_id,
        "release": {"mechanism": mechanism, "epsilon": setup.epsilon,
                    "idempotency_key": f"experiment-{ctx.dataset_id}"},
    })  # fmt: skip
    job = publisher.train(
        {"feature_set_id": ctx.feature_set, "labels_id": received["id"],
         **setup.training(ctx.seed)},
        say=ctx.say,
    )  # fmt: skip
    predictions = publisher.predict(job["model_id"], setup.data.features_table(ctx.test_rows))
    return Played(predictions=predictions, release_id=str(received["release_id"]))


def score(task: str, predicted: np.ndarray, true: np.ndarray) -> float:
    """MSE (regression) or accuracy (classification) of ``predicted`` against ``true``."""
    if task == CLASSIFICATION:
        return float(np.mean(np.rint(predicted) == true))
    return float(np.mean((predicted - true) ** 2))


def _open_dataset(
    services: Services, setup: Setup, seed: int, train_rows: np.ndarray
) -> tuple[str, str, str]:
    """As the advertiser: a fresh dataset with budget ε holding the seed's training
    labels, and a client granted it → ``(dataset_id, client id, client token)``."""
    data, endpoints = setup.data, services.endpoints
    with LabelsPartyClient(endpoints.labels_url, endpoints.labels_admin_token) as advertiser:
        # δ = 1/n for the central methods (DP-SGD); the others spend no δ.
        dataset = advertiser.create_dataset(
            name=f"{data.name} experiment {setup.method} seed {seed}", task=data.task,
            label_domain=data.label_domain, epsilon_budget=setup.epsilon,
            delta_budget=delta_for(train_rows.size),
        )  # fmt: skip
        advertiser.upload_labels(dataset["id"], parquet_bytes(data.labels_table(train_rows)))
        client = advertiser.create_client(name=f"experiment seed {seed}", role="client")
        advertiser.create_grant(dataset["id"], client_id=client["id"])
    return str(dataset["id"]), str(client["id"]), str(client["token"])


def _one_seed(
    services: Services, setup: Setup, seed: int, *, say: Callable[[str], None]
) -> dict[str, Any]:
    data, metric = setup.data, metric_of(setup.data.task)
    train_rows, test_rows = data.split(seed=seed, test_fraction=TEST_FRACTION)
    # The labels go first: if the labels party refuses them, no features are left behind.
    dataset_id, client_id, token = _open_dataset(services, setup, seed, train_rows)
    try:
        feature_set = services.feature_set(data, say=say)
        say(f"seed {seed}: dataset {dataset_id} (ε budget {setup.epsilon:g}), "
            f"{train_rows.size} training labels; {setup.method}")  # fmt: skip
        ctx = SeedContext(services, setup, seed, train_rows, test_rows, dataset_id, token,
                          feature_set, say)  # fmt: skip
        played = (METHODS[setup.method].play or release_and_train)(ctx)
        mechanism: float | None = None
        if played.release_id is not None:
            release = released_labels(services.endpoints, token, played.release_id)
            rows = align(release.column("example_id"), data.example_id)
            noisy = np.asarray(release.column("label").to_numpy(), dtype=np.float64)
            mechanism = score(data.task, noisy, data.labels[rows])
    finally:  # the seed's token dies with it: nothing stays valid at the labels party
        with LabelsPartyClient(services.endpoints.labels_url,
                               services.endpoints.labels_admin_token) as advertiser:  # fmt: skip
            advertiser.delete_client(client_id)
    test = score(data.task, played.predictions, data.labels[test_rows])
    with LabelsPartyClient(services.endpoints.labels_url,
                           services.endpoints.labels_admin_token) as advertiser:  # fmt: skip
        spent = float(advertiser.get_budget(dataset_id)["epsilon_spent"])
    shown = "—" if mechanism is None else format(mechanism, ",.4g")
    say(f"seed {seed}: test {metric} {test:,.4g}; mechanism {metric} {shown}; "
        f"ε spent {spent:g}")  # fmt: skip
    return {"seed": seed, "mechanism_mse": mechanism, metric: test, "epsilon_spent": spent,
            "dataset_id": dataset_id, "release_id": played.release_id}  # fmt: skip


def _non_private_seed(
    setup: Setup, seed: int, workdir: Path, *, say: Callable[[str], None]
) -> dict[str, Any]:
    data, metric = setup.data, metric_of(setup.data.task)
    train_rows, test_rows = data.split(seed=seed, test_fraction=TEST_FRACTION)
    say(f"seed {seed}: training on the {train_rows.size} true labels, outside the services")
    predictions = non_private_predictions(data, train_rows, test_rows, setup.training(seed),
                                          workdir)  # fmt: skip
    test = score(data.task, predictions, data.labels[test_rows])
    say(f"seed {seed}: test {metric} {test:,.4g}")
    exact = 1.0 if data.task == CLASSIFICATION else 0.0  # the labels are the truth
    return {"seed": seed, "mechanism_mse": exact, metric: test, "epsilon_spent": 0.0}


def summarize(setup: Setup, per_seed: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """The ``--json`` object from the seeds' numbers."""
    metric = metric_of(setup.data.task)
    test = np.array([r[metric] for r in per_seed])
    mechanisms = [r["mechanism_mse"] for r in per_seed if r["mechanism_mse"] is not None]
    return {
        "dataset": setup.data.name,
        "task": setup.data.task,
        "method": setup.method,
        "epsilon": setup.epsilon if setup.private else "inf",
        "seeds": setup.seeds,
        "examples": len(setup.data),
        "epochs": setup.epochs,
        "mechanism_metric": metric,
        "mechanism_mse": float(np.mean(mechanisms)) if mechanisms else None,
        "mechanism_std": float(np.std(mechanisms)) if mechanisms else None,
        "test": {metric: float(test.mean()), f"{metric}_std": float(test.std())},
        "epsilon_spent": float(sum(r["epsilon_spent"] for r in per_seed)),
        "seconds": round(seconds, 3),
        "per_seed": per_seed,
    }


def experiment(
    setup: Setup,
    workdir: Path,
    *,
    endpoints: Endpoints | None = None,
    services: Services | None = None,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Run ``setup`` through ``services`` (kept open by the caller: the report's
    sweep), else through ``endpoints``, else through local services started here."""
    started = time.perf_counter()
    data = setup.data
    say(f"dataset {data.name}: {data.description}; {len(data)} examples; method "
        f"{setup.method}, ε = {setup.epsilon:g}, {setup.seeds} seed(s)")  # fmt: skip
    seeds = range(setup.seeds)
    if not setup.private:
        per_seed = [_non_private_seed(setup, s, workdir, say=say) for s in seeds]
    elif services is not None:
        per_seed = [_one_seed(services, setup, s, say=say) for s in seeds]
    else:
        with services_for(endpoints, workdir, say=say) as opened:
            per_seed = [_one_seed(opened, setup, s, say=say) for s in seeds]
    return summarize(setup, per_seed, time.perf_counter() - started)


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
        description=_plain_text(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dataset", metavar="NAME",
                   help=f"a shipped dataset: {', '.join(sorted(LOADERS))} "
                        "(or give --labels and --features)")  # fmt: skip
    p.add_argument("--method", required=True, metavar="METHOD",
                   help=f"regression: {', '.join(methods_for(REGRESSION))}; classification: "
                        f"{', '.join(methods_for(CLASSIFICATION))}")  # fmt: skip
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
    p.add_argument("--groups", type=int, default=DEFAULT_GROUPS,
                   help="rr-with-prior-groups: feature clusters the publisher forms "
                        f"(default {DEFAULT_GROUPS})")  # fmt: skip
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
    p.add_argument("--task", default="regression",
                   help="with --labels: regression (the default, and the only task for your "
                        "own data; the classification datasets run with --dataset)")  # fmt: skip
    p.add_argument(
        "--domain",
        metavar="JSON",
        help='with --labels: the public label domain, e.g. \'{"min": 0, "max": 100}\'',
    )
    p.add_argument("--categorical", default="", metavar="COLS",
                   help="with --labels: comma-separated feature columns to treat as categorical "
                        "(string and boolean columns always are)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print only the result object on stdout")
    add_service_options(p)
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
    if args.groups < 2:
        raise ValueError(f"--groups must be at least 2, not {args.groups}")
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
        _check_own_task(args.task)  # before the domain, whose form depends on it
        domain = parse_domain(args.domain)
        data = load_user_data(
            args.labels, args.features, task=args.task, domain=domain, categorical=categorical
        )
    else:
        raise ValueError("give --dataset NAME, or --labels FILE --features FILE --domain JSON")
    if data.task not in METHODS[args.method].tasks:
        raise ValueError(f"method {args.method!r} does not fit {data.task} dataset "
                         f"{data.name!r}; choose one of: "
                         f"{', '.join(methods_for(data.task))}")  # fmt: skip
    if args.max_examples is not None:
        data = subsample(data, args.max_examples)
    return Setup(data=data, method=args.method, epsilon=epsilon, seeds=args.seeds,
                 epochs=args.epochs, batch_size=args.batch_size,
                 learning_rate=args.learning_rate, mesh=args.mesh,
                 groups=args.groups)  # fmt: skip


def _plain_text(rst: str) -> str:
    """The module's reStructuredText as ``--help`` shows it: no markup."""
    for markup, plain in (("``", ""), ("**", ""), ("::\n", ":\n")):
        rst = rst.replace(markup, plain)
    return rst


def run(args: argparse.Namespace) -> int:
    endpoints = endpoints_from(args.labels_party, args.labels_token,
                               args.features_party, args.features_token)  # fmt: skip
    if endpoints is not None:
        check_answering(endpoints)
    setup = setup_from(args)
    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="labeldp-experiment-") as tmp:
        try:
            result = experiment(setup, Path(tmp), endpoints=endpoints, say=say)
        except (httpx.HTTPError, OSError) as exc:
            raise ExperimentError(f"{type(exc).__name__}: {exc}") from exc
    print(json.dumps(result) if args.json else human(result))
    return 0


def _number(value: float | str) -> str:
    return value if isinstance(value, str) else format(value, "g")


def human(result: dict[str, Any]) -> str:
    """The result for a terminal: one line per number."""
    metric = result["mechanism_metric"]
    name = "MSE" if metric == "mse" else metric
    mechanism = result["mechanism_mse"]
    mean, std = result["test"][metric], result["test"][f"{metric}_std"]
    return "\n".join([
        f"{result['dataset']}  {result['method']}  ε = {_number(result['epsilon'])} per seed  "
        f"seeds = {result['seeds']}",
        f"  {'mechanism ' + name:<19}{'—' if mechanism is None else format(mechanism, ',.4g')}",
        f"  {'test ' + name:<19}{mean:,.4g} ± {std:,.4g}",
        f"  ε spent, all seeds {result['epsilon_spent']:g}",
        f"  seconds            {result['seconds']:.1f}",
    ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """``labeldp experiment ARGV`` through the whole command line (for tests)."""
    from labeldp import cli  # it imports this module

    return cli.main(["experiment", *(argv or [])])
