"""CI smoke test of docker-compose.yml without Docker.

The exact ``command`` of label-api, feature-api and feature-worker runs as a plain
process (``labeldp.processes``) with the environment the container would get — the
image's ``ENV`` and the compose ``environment`` — except what only makes sense
inside compose: the database URL points at a fresh database of the machine's
Postgres instead of the ``*-db`` service, each named volume is a directory under
``tmp_path``, ``--port`` is a free port (on 127.0.0.1 rather than 0.0.0.0), and the
``.env`` secrets are fresh random ones. Then each API's compose health check runs
against it, and ``labeldp demo --quick`` plays both parties against the services.
Services start the way compose starts them: the two APIs side by side, the worker
once the features API (which it ``depends_on``) is healthy.

Postgres: ``LABELDP_TEST_POSTGRES_URL``'s server (default
``postgresql+psycopg://postgres@127.0.0.1:5432``, trust auth); the test is skipped,
with the reason, only when it is unreachable. Its two databases
(``labeldp_smoke_labels_<random>``, ``labeldp_smoke_features_<random>``) are dropped
afterwards.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import URL, make_url

from feature_party.orm import Job
from label_party.models import Release
from labeldp.demo import default_plan
from labeldp.processes import ServiceProcess, free_port
from tests.deploy.deployfiles import (
    COMPOSE,
    environment,
    image_env,
    interpolate,
    load_compose,
    option,
    variables_in,
    volume_mounts,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

POSTGRES = make_url(
    os.environ.get("LABELDP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432")
)
#: The compose services the smoke test runs, and the database services they use.
SERVICES = ("label-api", "label-worker", "feature-api", "feature-worker")
DATABASES = ("label-db", "feature-db")
#: Seconds: a service to become healthy; the whole demo.
HEALTHY_TIMEOUT, DEMO_TIMEOUT = 180.0, 900.0


def _connect(url: URL, dbname: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or "postgres",
        password=url.password,
        dbname=dbname,
        autocommit=True,
        connect_timeout=3,
    )


@pytest.fixture
def compose() -> dict[str, Any]:
    return load_compose(COMPOSE)


@pytest.fixture
def local_databases(compose: dict[str, Any]) -> Iterator[dict[str, str]]:
    """A fresh local database for each compose Postgres service: service → URL."""
    suffix = secrets.token_hex(4)
    names = {}
    for service in DATABASES:
        compose_db = environment(compose["services"][service])["POSTGRES_DB"]
        assert compose_db and compose_db.startswith("labeldp_"), compose_db
        names[service] = compose_db.replace("labeldp_", "labeldp_smoke_", 1) + f"_{suffix}"
    try:
        admin = _connect(POSTGRES, "postgres")
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL at {POSTGRES.host}:{POSTGRES.port or 5432} is unreachable: {exc}")
    created: list[str] = []
    try:
        for name in names.values():
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            created.append(name)
        yield {
            service: POSTGRES.set(drivername="postgresql+psycopg", database=name).render_as_string(
                hide_password=False
            )
            for service, name in names.items()
        }
    finally:
        for name in created:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.close()


def start_waves(compose: dict[str, Any]) -> list[list[str]]:
    """SERVICES in the waves compose starts them in: a service starts once the
    services it depends on are up, independent ones side by side."""
    waves: list[list[str]] = []
    placed: set[str] = set()
    while len(placed) < len(SERVICES):
        wave = [
            name
            for name in SERVICES
            if name not in placed
            and all(
                dep in placed or dep not in SERVICES
                for dep in compose["services"][name].get("depends_on") or {}
            )
        ]
        assert wave, f"a dependency cycle among {SERVICES}"
        waves.append(wave)
        placed.update(wave)
    return waves


@contextlib.contextmanager
def running_in_waves(waves: list[list[ServiceProcess]], timeout: float) -> Iterator[None]:
    """Like ``labeldp.processes.running``, but each wave starts at once and is healthy
    before the next one starts; all stop (last first) on the way out."""
    with contextlib.ExitStack() as stack:
        for wave in waves:
            for process in wave:
                stack.callback(process.stop)
                process.start()
            for process in wave:
                if process.port is not None:
                    process.wait_healthy(timeout)
        yield


def as_local_process(
    name: str,
    service: dict[str, Any],
    *,
    secrets_: dict[str, str],
    databases: dict[str, str],
    volumes_dir: Path,
    logs: Path,
) -> tuple[ServiceProcess, dict[str, str]]:
    """The compose service as a ``ServiceProcess``, and the environment it gets."""
    command: list[str] = list(service["command"])
    assert command[0] == "labeldp", f"{name}: {command}"
    env: dict[str, str] = interpolate({**image_env(service), **environment(service)}, secrets_)
    # The database: the compose Postgres service → the local database standing for it.
    db_host = make_url(env["LABELDP_DATABASE_URL"]).host
    assert db_host in databases, f"{name}: database host {db_host}"
    env["LABELDP_DATABASE_URL"] = databases[db_host]
    # Named volumes → directories (shared by the services that share the volume).
    for target, volume in volume_mounts(service).items():
        for key, value in env.items():
            if value == target or value.startswith(target.rstrip("/") + "/"):
                env[key] = str(volumes_dir / volume) + value[len(target.rstrip("/")) :]
    assert not any("$" in v for v in env.values()), env
    port: int | None = None
    if option(command, "--port") is not None:
        port = free_port()
        command[command.index("--port") + 1] = str(port)
    if option(command, "--host") is not None:
        command[command.index("--host") + 1] = "127.0.0.1"
    process = ServiceProcess(name, command[1:], env, logs / f"{name}.log", port=port)
    return process, env


def healthcheck(service: dict[str, Any], port: int) -> subprocess.CompletedProcess[str]:
    """The service's compose health check, run here against ``port``."""
    test = list(service["healthcheck"]["test"])
    assert test[0] == "CMD" and test[1] == "python", test
    compose_port = option(service["command"], "--port")
    args = [a.replace(f"127.0.0.1:{compose_port}/", f"127.0.0.1:{port}/") for a in test[2:]]
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, check=False
    )


def watch(
    demo: subprocess.Popen[bytes], services: dict[str, ServiceProcess], timeout: float
) -> str | None:
    """Wait for ``demo`` to exit; why to give up early (a service died, which would
    leave the demo waiting for a job forever; too slow), or ``None``."""
    deadline = time.monotonic() + timeout
    while demo.poll() is None:
        dead = [n for n, p in services.items() if p.process and p.process.poll() is not None]
        if dead:
            return f"{', '.join(dead)} exited during the demo"
        if time.monotonic() > deadline:
            return f"demo --quick ran past {timeout:.0f} s"
        time.sleep(0.5)
    return None


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"({path} missing)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def test_compose_services_run_the_demo_as_local_processes(
    compose: dict[str, Any],
    local_databases: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = time.monotonic()
    # Exactly the LABELDP_* variables compose sets reach the processes, none of ours.
    for key in [k for k in os.environ if k.upper().startswith("LABELDP_")]:
        monkeypatch.delenv(key)
    secrets_ = {name: secrets.token_urlsafe(32) for name in variables_in(compose)}
    logs = tmp_path / "logs"
    processes: dict[str, ServiceProcess] = {}
    envs: dict[str, dict[str, str]] = {}
    waves = start_waves(compose)
    assert waves == [["label-api", "feature-api"], ["label-worker", "feature-worker"]], waves
    for name in [name for wave in waves for name in wave]:
        processes[name], envs[name] = as_local_process(
            name,
            compose["services"][name],
            secrets_=secrets_,
            databases=local_databases,
            volumes_dir=tmp_path / "volumes",
            logs=logs,
        )
    # The API and the worker of each party share its database and data volume.
    for party in ("label", "feature"):
        api, worker = envs[f"{party}-api"], envs[f"{party}-worker"]
        for key in ("LABELDP_DATA_DIR", "LABELDP_DATABASE_URL"):
            assert api[key] == worker[key], (party, key)
        assert "LABELDP_ADMIN_TOKEN" not in worker, party  # it starts without one

    def diagnostics() -> str:
        return "\n".join(f"--- {n} log:\n{tail(p.log_path)}" for n, p in processes.items())

    labels, features = processes["label-api"], processes["feature-api"]
    output = tmp_path / "demo"
    with running_in_waves([[processes[n] for n in wave] for wave in waves], HEALTHY_TIMEOUT):
        for name in ("label-api", "feature-api"):
            port = processes[name].port
            assert port is not None
            check = healthcheck(compose["services"][name], port)
            assert check.returncode == 0, f"{name} health check: {check.stderr}\n{diagnostics()}"
        nobody = healthcheck(compose["services"]["label-api"], free_port())
        assert nobody.returncode != 0, "the health check passes with nothing listening"

        demo_log = tmp_path / "demo.log"
        command = [sys.executable, "-m", "labeldp", "demo", "--quick",
                   "--labels-party", labels.url,
                   "--labels-token", envs["label-api"]["LABELDP_ADMIN_TOKEN"],
                   "--features-party", features.url,
                   "--features-token", envs["feature-api"]["LABELDP_ADMIN_TOKEN"],
                   "--output", str(output)]  # fmt: skip
        with demo_log.open("wb") as log:
            demo = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            try:
                problem = watch(demo, processes, DEMO_TIMEOUT)
            finally:
                if demo.poll() is None:
                    demo.kill()
                demo.wait()
        assert problem is None, f"{problem}\n{tail(demo_log, 80)}\n{diagnostics()}"
        stdout = demo_log.read_text(errors="replace")
        assert demo.returncode == 0, (
            f"demo exited {demo.returncode}\n{tail(demo_log, 80)}\n{diagnostics()}"
        )

    assert "audit verification: ok=True" in stdout, stdout[-2000:]
    report = output / "report.md"
    assert report.is_file(), f"no report in {output}"
    assert "Audit chain verified: **True**" in report.read_text()
    assert "laplace-clipped" in report.read_text()  # not taken for the unbiased Laplace
    # The services kept their state in the local Postgres databases, not in SQLite:
    # one release per mechanism of the plan, each trained by the worker.
    releases = len(default_plan(quick=True, epsilon=1.0).mechanisms)
    counts = {
        "label-db": sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(Release.__tablename__)
        ),
        "feature-db": sql.SQL(
            "SELECT count(*) FROM {} WHERE status = 'succeeded' AND worker_id IS NOT NULL"
        ).format(sql.Identifier(Job.__tablename__)),
    }
    for service, query in counts.items():
        with _connect(POSTGRES, str(make_url(local_databases[service]).database)) as conn:
            row = conn.execute(query).fetchone()
        assert row is not None and row[0] == releases, f"{service}: {row} rows, not {releases}"
    assert not [*tmp_path.rglob("*.sqlite3"), *tmp_path.rglob("*.db")], "a service used SQLite"
    print(f"smoke test: {time.monotonic() - started:.0f} s")
