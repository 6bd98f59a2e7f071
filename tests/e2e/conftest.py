"""Both real parties as processes on loopback, each on its own fresh database
(SQLite files, or Postgres databases ``labeldp_e2e_<random>``), and a worker."""

from __future__ import annotations

import io
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from labeldp.processes import ServiceProcess, free_port, running

POSTGRES_URL = os.environ.get(
    "LABELDP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


# -- databases -----------------------------------------------------------------------


def _pg_admin() -> Any:
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(POSTGRES_URL)
    return psycopg.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or "postgres",
        password=url.password,
        dbname="postgres",
        autocommit=True,
        connect_timeout=3,
    )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """``{"labels": url, "features": url}``: one fresh database per party."""
    if request.param == "sqlite":
        yield {
            "labels": f"sqlite:///{tmp_path / 'labels-party.sqlite3'}",
            "features": f"sqlite:///{tmp_path / 'features-party.sqlite3'}",
        }
        return
    import psycopg
    from sqlalchemy.engine import make_url

    names = {party: f"labeldp_e2e_{secrets.token_hex(5)}" for party in ("labels", "features")}
    try:
        with _pg_admin() as conn:
            for name in names.values():
                conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL unreachable at {make_url(POSTGRES_URL).host}:5432 ({exc})")
    try:
        yield {
            party: make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
            for party, name in names.items()
        }
    finally:
        with _pg_admin() as conn:
            for name in names.values():
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- the services ----------------------------------------------------------------------


@dataclass
class Services:
    labels_url: str
    labels_admin: str
    features: httpx.Client
    features_url: str
    features_token: str
    features_data: Path
    features_db: str
    logs: Path


@pytest.fixture
def services(database_urls: dict[str, str], tmp_path: Path) -> Iterator[Services]:
    labels_token, features_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    labels_port, features_port = free_port(), free_port()
    logs = tmp_path / "logs"
    labels_env = {
        "LABELDP_MODE": "production",
        "LABELDP_DATA_DIR": str(tmp_path / "labels-party"),
        "LABELDP_DATABASE_URL": database_urls["labels"],
        "LABELDP_ADMIN_TOKEN": labels_token,
    }
    features_env = {
        "LABELDP_DATA_DIR": str(tmp_path / "features-party"),
        "LABELDP_DATABASE_URL": database_urls["features"],
        "LABELDP_ADMIN_TOKEN": features_token,
        "LABELDP_POLL_SECONDS": "0.2",
        "LABELDP_HEARTBEAT_SECONDS": "0.5",
        "LABELDP_CLIENT_RETRIES": "1",
        "LABELDP_CLIENT_BACKOFF_SECONDS": "0.05",
    }
    # The worker first: it has no port to wait for, so it starts while the
    # services come up.
    processes = [
        ServiceProcess("worker", ["feature-party", "worker"], features_env, logs / "worker.log"),
        ServiceProcess("labels party", ["label-party", "serve", "--port", str(labels_port)],
                       labels_env, logs / "labels-party.log", port=labels_port),
        ServiceProcess("features party",
                       ["feature-party", "serve", "--port", str(features_port)],
                       features_env, logs / "features-party.log", port=features_port),
    ]  # fmt: skip
    with (
        running(*processes),
        httpx.Client(
            base_url=processes[2].url,
            headers={"Authorization": f"Bearer {features_token}"},
            timeout=120,
        ) as features,
    ):
        yield Services(
            labels_url=processes[1].url,
            labels_admin=labels_token,
            features=features,
            features_url=processes[2].url,
            features_token=features_token,
            features_data=tmp_path / "features-party",
            features_db=database_urls["features"],
            logs=logs,
        )


# -- helpers shared by the end-to-end tests ------------------------------------------


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def ok(response: httpx.Response, status: int) -> dict[str, Any]:
    """The JSON body, after checking the status (the body is the failure message)."""
    assert response.status_code == status, f"{response.status_code}: {response.text}"
    body: dict[str, Any] = response.json()
    return body
