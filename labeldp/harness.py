"""What ``labeldp demo`` and ``labeldp experiment`` share: the services as local
processes, the publisher's side over the features party's REST API, the referee's
measurements (noisy-label MSE against the true labels, which only the referee
knows), and the non-private baseline trained outside the services.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from feature_party.client import LabelsPartyClient
from labeldp.datasets import Dataset
from labeldp.processes import ServiceProcess, free_port, running
from shared.cli_errors import CommandError, ServiceFailedError, bearer, refusal


class RunError(RuntimeError):
    """A step of a run (demo, experiment) failed; the message says which and why."""


# -- the services ------------------------------------------------------------------


#: Where ``--labels-token``/``--features-token`` come from when not given.
TOKEN_VARIABLES = {"labels": "LABELDP_LABELS_TOKEN", "features": "LABELDP_FEATURES_TOKEN"}


@dataclass
class Endpoints:
    labels_url: str
    labels_admin_token: str
    features_url: str
    features_token: str


def endpoints_from(
    labels_url: str | None,
    labels_token: str | None,
    features_url: str | None,
    features_token: str | None,
) -> Endpoints | None:
    """Running services given on the command line, ``None`` for none (start local ones).

    A token missing from the command line comes from its variable
    (:data:`TOKEN_VARIABLES`), read only for a party whose URL is given: exported
    for runs against services, the variables must not stop a local run."""
    if labels_url:
        labels_token = labels_token or os.environ.get(TOKEN_VARIABLES["labels"])
    if features_url:
        features_token = features_token or os.environ.get(TOKEN_VARIABLES["features"])
    given = [labels_url, labels_token, features_url, features_token]
    if all(given):
        return Endpoints(str(labels_url), str(labels_token), str(features_url),
                         str(features_token))  # fmt: skip
    if any(given):
        raise CommandError("give both --labels-party and --features-party with their tokens "
                       "(--labels-token/--features-token, or $LABELDP_LABELS_TOKEN/"
                       "$LABELDP_FEATURES_TOKEN), or neither")  # fmt: skip
    return None


def check_answering(endpoints: Endpoints) -> None:
    """Both running parties answer and take their tokens — checked before a run
    creates anything at either (a dataset made, then the other party found down)."""
    parties = (
        ("labels party", endpoints.labels_url, endpoints.labels_admin_token, "/v1/datasets"),
        ("features party", endpoints.features_url, endpoints.features_token,
         "/v1/feature-sets?limit=1"),
    )  # fmt: skip
    for name, url, token, path in parties:
        try:
            answer = httpx.get(
                url.rstrip("/") + path, headers=bearer(token, f"the {name}'s token"), timeout=30
            )
        except httpx.HTTPError as exc:
            raise ServiceFailedError(f"the {name} at {url} does not answer: {exc}") from None
        if answer.status_code != 200:
            why = "its token was refused" if answer.status_code in (401, 403) else answer.text[:200]
            raise refusal(
                answer.status_code, f"the {name} at {url} answered {answer.status_code}: {why}"
            )


@contextmanager
def local_services(
    workdir: Path,
    *,
    say: Callable[[str], None],
    features_env: Mapping[str, str] | None = None,
) -> Iterator[Endpoints]:
    """Both parties and a worker as processes on free ports; stopped on exit.
    ``features_env`` adds settings for the features party and its worker (a sweep
    of many short jobs sets ``LABELDP_POLL_SECONDS`` low)."""
    label_token, feature_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    label_port, feature_port = free_port(), free_port()
    label_env = {"LABELDP_DATA_DIR": str(workdir / "labels-party"),
                 "LABELDP_ADMIN_TOKEN": label_token}  # fmt: skip
    feature_env = {"LABELDP_DATA_DIR": str(workdir / "features-party"),
                   "LABELDP_ADMIN_TOKEN": feature_token, **(features_env or {})}  # fmt: skip
    logs = workdir / "logs"
    services = [
        ServiceProcess("labels party", ["label-party", "serve", "--port", str(label_port)],
                       label_env, logs / "labels-party.log", port=label_port),
        ServiceProcess("features party", ["feature-party", "serve", "--port", str(feature_port)],
                       feature_env, logs / "features-party.log", port=feature_port),
        ServiceProcess("worker", ["feature-party", "worker"], feature_env, logs / "worker.log"),
        # Trains LabelDP-Pro / DP-SGD models next to the labels (the dp-sgd and
        # labeldp-pro methods); idle otherwise.
        ServiceProcess("labels-party worker", ["label-party", "worker"], label_env,
                       logs / "labels-party-worker.log"),
    ]  # fmt: skip
    say(f"starting the labels party (:{label_port}), the features party (:{feature_port}) "
        f"and a worker for each; logs in {logs}")  # fmt: skip
    with running(*services):
        yield Endpoints(
            labels_url=services[0].url,
            labels_admin_token=label_token,
            features_url=services[1].url,
            features_token=feature_token,
        )


# -- the publisher -------------------------------------------------------------------


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _check(response: httpx.Response, what: str) -> dict[str, Any]:
    if response.status_code >= 400:
        try:
            body = response.json()
            message = body.get("message", response.text)
        except ValueError:
            message = response.text
        raise RunError(f"{what}: HTTP {response.status_code}: {message}")
    data: dict[str, Any] = response.json()
    return data


class Publisher:
    """The features party's side, over its REST API."""

    def __init__(
        self, url: str, token: str, *, poll_seconds: float = 0.5, timeout: float = 120.0
    ) -> None:
        self.poll_seconds = poll_seconds
        self.http = httpx.Client(base_url=url, headers=bearer(token), timeout=timeout)

    def upload_features(
        self, table: pa.Table, roles: dict[str, list[str]], *, name: str = "demo features"
    ) -> str:
        response = self.http.post(
            "/v1/feature-sets",
            files={"file": ("features.parquet", parquet_bytes(table))},
            data={"schema": json.dumps(roles), "name": name},
        )
        return str(_check(response, "uploading the features")["id"])

    def receive(self, body: dict[str, Any]) -> dict[str, Any]:
        return _check(self.http.post("/v1/received-labels", json=body), "fetching a release")

    def train(self, body: dict[str, Any], *, say: Callable[[str], None]) -> dict[str, Any]:
        job = _check(self.http.post("/v1/jobs", json=body), "submitting a training job")
        last = ""
        while True:
            state = _check(self.http.get(f"/v1/jobs/{job['id']}"), "reading a job")
            progress = state.get("progress") or {}
            line = ""
            if progress:
                epoch = f"{progress.get('epoch', 0)}/{progress.get('epochs', '?')}"
                line = f"    epoch {epoch}  loss {progress.get('loss', float('nan')):.4g}"
            if line and line != last:
                say(line)
                last = line
            if state["status"] == "succeeded":
                return state
            if state["status"] in ("failed", "cancelled"):
                raise RunError(f"training job {job['id']} {state['status']}: {state.get('error')}")
            time.sleep(self.poll_seconds)

    def multistage(self, body: dict[str, Any], *, say: Callable[[str], None]) -> dict[str, Any]:
        """An LP-MST run (``POST /v1/multistage``), followed until it ends."""
        run = _check(self.http.post("/v1/multistage", json=body), "starting an LP-MST run")
        shown: set[str] = set()
        while run["status"] == "running":
            for stage in run["stages"]:
                if stage.get("model_id") and stage["part"] not in shown:
                    shown.add(stage["part"])
                    say(f"    stage {stage['stage']} ({stage['part']}): model {stage['model_id']}")
            time.sleep(0.5)
            run = _check(self.http.get(f"/v1/multistage/{run['id']}"), "reading an LP-MST run")
        if run["status"] != "succeeded":
            raise RunError(f"LP-MST run {run['id']} {run['status']}: {run.get('error')}")
        return run

    def import_model(self, labels_party_url: str, token: str, training_id: str) -> str:
        """A model the labels party trained (LabelDP-Pro), into this party's registry."""
        body = {"labels_party_url": labels_party_url, "token": token, "training_id": training_id}
        return str(
            _check(self.http.post("/v1/models/import", json=body), "importing a model")["id"]
        )

    def predict(self, model_id: str, table: pa.Table) -> np.ndarray:
        response = self.http.post(
            f"/v1/models/{model_id}/predict",
            files={"file": ("rows.parquet", parquet_bytes(table))},
        )
        return np.asarray(_check(response, "predicting")["prediction"], dtype=np.float64)

    def close(self) -> None:
        self.http.close()


# -- the referee -----------------------------------------------------------------------


def released_labels(endpoints: Endpoints, token: str, release_id: str) -> pa.Table:
    """A release's ``example_id, label`` as the features party downloads it."""
    with LabelsPartyClient(endpoints.labels_url, token) as lp, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "release.parquet"
        lp.download_labels(release_id, path)
        return pq.read_table(path)


def align(ids: pa.Array | pa.ChunkedArray, example_id: np.ndarray) -> np.ndarray:
    """Row positions in ``example_id`` of each id in ``ids`` (a columnar join, not
    a Python dict per row: releases have millions of labels)."""
    positions = pc.index_in(pc.cast(ids, pa.string()), value_set=pa.array(example_id))
    if positions.null_count:
        raise RunError(f"{positions.null_count} released example_id(s) are not in the dataset")
    return np.asarray(positions.to_numpy(zero_copy_only=False), dtype=np.int64)


def noisy_label_mse(
    endpoints: Endpoints, token: str, release_id: str, truth: Mapping[str, float]
) -> float:
    """The referee's view: how far the released labels are from the true ones."""
    table = released_labels(endpoints, token, release_id)
    ids = table.column("example_id").to_pylist()
    noisy = table.column("label").to_numpy()
    true = np.array([truth[i] for i in ids])
    return float(np.mean((noisy - true) ** 2))


def non_private_predictions(
    data: Dataset,
    train_rows: np.ndarray,
    test_rows: np.ndarray,
    training: Mapping[str, Any],
    workdir: Path,
) -> np.ndarray:
    """Test-row predictions of the model trained on the true labels, outside the
    services (class indices for classification)."""
    from feature_party.training.artifact import Predictor
    from feature_party.training.config import TrainingConfig
    from feature_party.training.data import ColumnRoles
    from feature_party.training.dataset import load_training_data
    from feature_party.training.loop import train

    features_path, labels_path = workdir / "baseline-features.parquet", workdir / "baseline.parquet"
    pq.write_table(data.features_table(train_rows), features_path)
    pq.write_table(data.labels_table(train_rows), labels_path)
    config = TrainingConfig(**training, device="cpu")
    roles = ColumnRoles(numeric=tuple(data.numeric), categorical=tuple(data.categorical))
    prepared = load_training_data(features_path=features_path, labels_path=labels_path,
                                  roles=roles, config=config, manifest={})  # fmt: skip
    import torch

    result = train(prepared, config, device=torch.device("cpu"))
    predictor = Predictor(result.model, prepared.preprocessing, prepared.loss, config.task)
    return np.asarray(predictor.predict(data.features_table(test_rows)), dtype=np.float64)


def non_private_baseline(
    data: Dataset,
    train_rows: np.ndarray,
    test_rows: np.ndarray,
    training: Mapping[str, Any],
    workdir: Path,
) -> float:
    """Test MSE of the same model trained on the true labels, outside the services."""
    predictions = non_private_predictions(data, train_rows, test_rows, training, workdir)
    return float(np.mean((predictions - data.labels[test_rows]) ** 2))


def add_service_options(p: argparse.ArgumentParser) -> None:
    """``--labels-party``/``--features-party`` and their admin tokens. A token is
    best given by its variable: a command line shows in ``ps`` and shell history."""
    for party, variable in TOKEN_VARIABLES.items():
        p.add_argument(f"--{party}-party", metavar="URL", help=f"use a running {party} party")
        p.add_argument(
            f"--{party}-token",
            metavar="TOKEN",
            help=f"its admin token (default: ${variable}, which keeps it out of ps)",
        )
