"""Fixtures of the features-party tests: settings in a temp dir, the app on
SQLite, a fake labels party on loopback, a synthetic "real-ish" data set."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import URL, create_engine, make_url, text
from sqlalchemy.exc import OperationalError

from feature_party.app import create_app
from feature_party.config import Settings
from feature_party.db import Database
from feature_party.feature_sets import service as feature_sets_service
from feature_party.jobs.schemas import JobCreate
from feature_party.jobs.status import Status
from feature_party.orm import Job, ReceivedLabels
from tests.feature_party.fake_labels_party import FakeLabelsParty, serve, serve_app

ADMIN = "fp-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


@dataclass
class Synthetic:
    """Criteo-like shape, small: numerics, categoricals, a true label and a
    noisy (Laplace, ε = 1 on a range of ~8) label for each example."""

    features: pa.Table
    true: np.ndarray
    noisy: np.ndarray


def synthetic(n: int, seed: int = 0, *, classes: int | None = None) -> Synthetic:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    city = rng.integers(0, 20, size=n)
    device = rng.choice(["ios", "android", "web"], size=n)
    city_effect = np.linspace(-1.5, 1.5, 20)[city]
    device_effect = np.select([device == "ios", device == "android"], [1.0, -0.5], 0.0)
    score = 1.5 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2] * x[:, 3] + city_effect + device_effect
    if classes is None:
        true = score + rng.normal(scale=0.3, size=n)
        noisy = true + rng.laplace(scale=8.0 / 1.0 / 2, size=n)
    else:
        true = np.digitize(score, np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1]))
        eps = 2.0
        p = classes / (np.exp(eps) + classes - 1)
        flip = rng.random(n) < p
        noisy = np.where(flip, rng.integers(0, classes, size=n), true)
    table = pa.table(
        {
            "example_id": [f"ex{i}" for i in range(n)],
            **{f"x{j}": x[:, j] for j in range(4)},
            "city": [f"c{c}" for c in city],
            "device": device,
        }
    )
    return Synthetic(table, true.astype(np.float64), noisy.astype(np.float64))


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "data_dir": tmp_path / "fp-data",
        "admin_token": ADMIN,
        "client_retries": 2,
        "client_backoff_seconds": 0.01,
        "client_timeout_seconds": 5.0,
        "heartbeat_seconds": 0.2,
        "job_lease_seconds": 3.0,
        "poll_seconds": 0.1,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """Service settings on SQLite, and on the session's Postgres database."""
    if request.param == "postgres":
        return make_settings(tmp_path, database_url=request.getfixturevalue("postgres_url"))
    return make_settings(tmp_path)


@contextmanager
def running_service(settings: Settings) -> Iterator[httpx.Client]:
    """The features-party app under uvicorn on loopback, and a client for it."""
    with serve_app(create_app(settings)) as url, httpx.Client(base_url=url, timeout=60) as c:
        yield c


@pytest.fixture
def client(settings: Settings) -> Iterator[httpx.Client]:
    with running_service(settings) as c:
        yield c


@pytest.fixture
def labels_party() -> Iterator[FakeLabelsParty]:
    with serve(FakeLabelsParty()) as fake:
        yield fake


def csv_bytes(table: pa.Table) -> bytes:
    import io

    import pyarrow.csv as pacsv

    buf = io.BytesIO()
    pacsv.write_csv(table, buf)
    return buf.getvalue()


def seed_inputs(database: Database, settings: Settings, n: int = 500) -> tuple[str, str]:
    """A stored feature set and a received release for it, without HTTP."""
    data = synthetic(n, seed=7)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upload = settings.data_dir / "seed.csv"
    upload.write_bytes(csv_bytes(data.features))
    labels_rel = Path("received") / f"seed-{uuid.uuid4().hex}.parquet"
    (settings.data_dir / "received").mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"example_id": data.features.column("example_id"), "label": data.noisy}),
        settings.data_dir / labels_rel,
    )
    with database.session() as session:
        fs = feature_sets_service.create(
            session, settings, upload=upload, filename="seed.csv", schema=None
        )
        labels = ReceivedLabels(
            id=uuid.uuid4().hex,
            feature_set_id=fs.id,
            labels_party_url="http://lp",
            dataset_id="ds",
            release_id="rel",
            manifest={"mechanism": {"name": "laplace"}},
            sha256="0" * 64,
            path=str(labels_rel),
            num_labels=n,
            matched=n,
            unmatched=0,
        )
        session.add(labels)
    return fs.id, labels.id


def add_jobs(
    database: Database, fs_id: str, labels_id: str, count: int, **config: object
) -> list[str]:
    ids = []
    with database.session() as session:
        for _ in range(count):
            body = JobCreate(feature_set_id=fs_id, labels_id=labels_id, **config)  # type: ignore[arg-type]
            job_id = uuid.uuid4().hex
            ids.append(job_id)
            session.add(
                Job(
                    id=job_id,
                    status=Status.QUEUED,
                    feature_set_id=fs_id,
                    labels_id=labels_id,
                    config=body.training().model_dump(mode="json"),
                    attempts=0,
                    gpus=body.training().gpus,
                )
            )
    return ids


def _admin_url(url: str) -> URL:
    return make_url(url).set(database="postgres")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database per test session on LABELDP_TEST_POSTGRES_URL's server."""
    yield from _fresh_postgres()


@pytest.fixture
def fresh_postgres_url() -> Iterator[str]:
    """A database of the test's own, for one that changes its schema."""
    yield from _fresh_postgres()


def _fresh_postgres() -> Iterator[str]:
    base = os.environ.get(
        "LABELDP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    name = f"labeldp_fp_{uuid.uuid4().hex[:10]}"
    try:
        admin = create_engine(_admin_url(base), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        pytest.skip(f"PostgreSQL unreachable at {make_url(base).render_as_string()}: {exc}")
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
