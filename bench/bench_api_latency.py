"""API latency of the labels party under concurrent clients.

A real ``labeldp label-party serve`` process (SQLite in a temporary data
directory, and Postgres in a fresh database created for the run and dropped
after it) answers ``--clients`` concurrent closed-loop clients (default 32: each
sends its next request as soon as the previous one is answered), all holding one
client token granted every dataset:

1. ``budget``: ``GET /v1/datasets/{id}/budget``, each client on its own dataset;
2. ``releases (spread)``: small releases (``--labels`` labels per dataset), each
   client on its own dataset, so the per-dataset lock (``FOR UPDATE`` on
   Postgres) is not what is measured — what remains shared is the database's
   write lock (SQLite) and the audit chain's lock (both);
3. ``releases (one dataset)``: every client on the same dataset: the per-dataset
   lock serializes them;
4. ``budget (one dataset, after)``: budget reads on that dataset, which now has
   one ledger entry per release (the budget is composed from all of them).

Each phase runs its warm-up requests first on the same connections; they are not
counted. Latency is measured in the client (request sent → response read), in
milliseconds; throughput is measured requests over the phase's wall time. The
clients run in one asyncio loop on the same 2-core machine as the server, so
under load the numbers include some client-side scheduling delay.

Run: ``.venv/bin/python -m bench.bench_api_latency [--quick] [--databases
sqlite,postgres]``; writes ``bench/results/api_latency.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa

from bench.bench_scale import (
    label_party,
    load_average,
    machine,
    peak_mib,
    pid_of,
)
from labeldp.harness import parquet_bytes
from labeldp.processes import running

RESULTS = Path(__file__).parent / "results" / "api_latency.json"
DOMAIN = {"min": 0.0, "max": 100.0, "step": 1.0, "clip": True}
#: ε of one small release; the datasets' budgets are far above what a run spends.
RELEASE_EPSILON = 0.01

Request = Callable[[httpx.AsyncClient, int], Awaitable[httpx.Response]]


@dataclass
class Setup:
    url: str
    admin_token: str
    client_token: str
    spread: list[str]  # one dataset per client
    shared: str  # the dataset every client releases from in the contended phase


# -- the database ------------------------------------------------------------------


@contextlib.contextmanager
def fresh_postgres(server: str) -> Iterator[str]:
    """A new, empty database on ``server`` for one run, dropped afterwards."""
    import psycopg

    name = f"labeldp_bench_{secrets.token_hex(4)}"
    plain = server.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        base = (
            server
            if "+psycopg" in server
            else server.replace("postgresql://", "postgresql+psycopg://")
        )
        yield base.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- set-up (admin, not measured) -----------------------------------------------------


def _ok(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise RuntimeError(f"{response.request.url}: HTTP {response.status_code}: {response.text}")
    body: dict[str, Any] = response.json()
    return body


def _labels(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    ids = pa.array([f"ex{i}" for i in range(n)], pa.string())
    return parquet_bytes(pa.table({"example_id": ids, "label": rng.gamma(2.0, 10.0, n)}))


def _dataset(http: httpx.Client, name: str, labels: int, client_id: str) -> str:
    body = {"name": name, "task": "regression", "label_domain": DOMAIN, "epsilon_budget": 100000}
    dataset = str(_ok(http.post("/v1/datasets", json=body))["id"])
    files = {"file": ("labels.parquet", _labels(labels, len(name)))}
    _ok(http.post(f"/v1/datasets/{dataset}/labels", files=files))
    _ok(http.post(f"/v1/datasets/{dataset}/grants", json={"client_id": client_id}))
    return dataset


def set_up(url: str, admin_token: str, clients: int, labels: int) -> Setup:
    """One client token, one dataset per concurrent client, one shared dataset."""
    headers = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
        client = _ok(http.post("/v1/clients", json={"name": "bench", "role": "client"}))
        spread = [_dataset(http, f"spread {i}", labels, client["id"]) for i in range(clients)]
        shared = _dataset(http, "shared", labels, client["id"])
    return Setup(url, admin_token, str(client["token"]), spread, shared)


# -- load --------------------------------------------------------------------------


async def _client_loop(
    http: httpx.AsyncClient, index: int, count: int, request: Request, codes: Counter[int | str]
) -> list[float]:
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        try:
            response = await request(http, index)
        except httpx.TransportError as exc:
            # Counted, not fatal: e.g. the server closing an idle keep-alive
            # connection just as the client reuses it.
            codes[type(exc).__name__] += 1
            continue
        elapsed = time.perf_counter() - start
        codes[response.status_code] += 1
        if response.status_code < 400:
            latencies.append(elapsed)
    return latencies


async def _drive(
    setup: Setup, clients: int, warm: int, measured: int, request: Request
) -> tuple[list[float], Counter[int | str], float]:
    """Warm-up, then the measured requests, on the same ``clients`` connections."""
    # Idle connections are dropped by the client after 2 s, before uvicorn's 5 s
    # keep-alive timeout: otherwise a client that finished its warm-up early may
    # reuse a connection the server is closing just then (a ReadError that says
    # nothing about the service).
    limits = httpx.Limits(
        max_connections=clients, max_keepalive_connections=clients, keepalive_expiry=2.0
    )
    headers = {"Authorization": f"Bearer {setup.client_token}"}
    async with httpx.AsyncClient(
        base_url=setup.url, headers=headers, limits=limits, timeout=600
    ) as http:
        warm_codes: Counter[int | str] = Counter()
        await asyncio.gather(
            *(_client_loop(http, i, warm, request, warm_codes) for i in range(clients))
        )
        codes: Counter[int | str] = Counter()
        start = time.perf_counter()
        per_client = await asyncio.gather(
            *(_client_loop(http, i, measured, request, codes) for i in range(clients))
        )
        wall = time.perf_counter() - start
    return [x for lat in per_client for x in lat], codes, wall


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (from ``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _summary(latencies: list[float], codes: Counter[int | str], wall: float) -> dict[str, Any]:
    ms = np.asarray(latencies) * 1000
    stats: dict[str, Any] = {"requests": len(latencies), "status_codes": dict(codes)}
    stats["errors"] = sum(n for code, n in codes.items() if isinstance(code, str) or code >= 400)
    if ms.size:
        for name, q in (("p50", 50), ("p95", 95), ("p99", 99)):
            stats[f"{name}_ms"] = round(float(np.percentile(ms, q)), 2)
        stats["max_ms"] = round(float(ms.max()), 2)
        stats["mean_ms"] = round(float(ms.mean()), 2)
    stats["wall_seconds"] = round(wall, 2)
    stats["throughput_per_s"] = round(len(latencies) / wall, 1) if wall else None
    return stats


def phase(
    setup: Setup, pid: int, clients: int, warm: int, measured: int, request: Request
) -> dict[str, Any]:
    before, cpu, start = load_average(), _cpu_seconds(pid), time.perf_counter()
    own = time.process_time()
    latencies, codes, wall = asyncio.run(_drive(setup, clients, warm, measured, request))
    stats = _summary(latencies, codes, wall)
    cpu, elapsed = _cpu_seconds(pid) - cpu, time.perf_counter() - start
    # The clients share the machine: their CPU says whether they, not the
    # server, could have been the limit.
    stats["client_cores_used"] = round((time.process_time() - own) / elapsed, 2)
    stats.update(
        # The server's CPU over the whole phase (warm-up included), per request and
        # as cores: on a shared 2-core machine these say CPU-bound or starved.
        server_cpu_seconds=round(cpu, 2),
        server_cpu_ms_per_request=round(1000 * cpu / (clients * (warm + measured)), 2),
        server_cores_used=round(cpu / elapsed, 2),
        clients=clients,
        warmup_per_client=warm,
        measured_per_client=measured,
        loadavg_before=before,
        loadavg_after=load_average(),
    )
    return stats


def budget_request(datasets: list[str]) -> Request:
    def request(http: httpx.AsyncClient, index: int) -> Awaitable[httpx.Response]:
        return http.get(f"/v1/datasets/{datasets[index % len(datasets)]}/budget")

    return request


def release_request(datasets: list[str], mechanism: str) -> Request:
    body = {"mechanism": {"name": mechanism}, "epsilon": RELEASE_EPSILON}

    def request(http: httpx.AsyncClient, index: int) -> Awaitable[httpx.Response]:
        return http.post(f"/v1/datasets/{datasets[index % len(datasets)]}/releases", json=body)

    return request


# -- one database --------------------------------------------------------------------


def run_database(database_url: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """All phases against one fresh labels-party process."""
    token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="bench-api-latency-") as tmp:
        server = label_party(Path(tmp), token, database_url)
        with running(server):
            pid = pid_of(server)
            setup = set_up(server.url, token, args.clients, args.labels)
            n, b, r = args.clients, args.budget_reads, args.releases
            phases = {
                "budget": phase(setup, pid, n, b // 10, b, budget_request(setup.spread)),
                "releases_spread": phase(
                    setup, pid, n, 1, r, release_request(setup.spread, args.mechanism)
                ),
                "releases_one_dataset": phase(
                    setup, pid, n, 1, r, release_request([setup.shared], args.mechanism)
                ),
                "budget_one_dataset_after": phase(
                    setup, pid, n, b // 10, b // 2, budget_request([setup.shared])
                ),
            }
            phases["budget_one_dataset_after"]["ledger_entries"] = n * (r + 1)
            peak = peak_mib(pid)
    return {"phases": phases, "server_peak_rss_mib": peak}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 clients, few requests (CI)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--budget-reads", type=int, default=200, help="measured, per client")
    parser.add_argument("--releases", type=int, default=10, help="measured, per client")
    parser.add_argument("--labels", type=int, default=1000, help="labels per dataset")
    parser.add_argument("--mechanism", default="rr-on-bins")
    parser.add_argument("--databases", default="sqlite,postgres", help="comma-separated")
    parser.add_argument(
        "--postgres-server",
        default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
        help="where the fresh database is created (and dropped)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.budget_reads, args.releases = 4, 20, 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, Any] = {
        "machine": machine(),
        "command": " ".join(["python -m bench.bench_api_latency", *(argv or sys.argv[1:])]),
        "clients": args.clients,
        "labels_per_dataset": args.labels,
        "release": {"mechanism": args.mechanism, "epsilon": RELEASE_EPSILON},
    }
    for database in args.databases.split(","):
        if database == "sqlite":
            results["sqlite"] = run_database(None, args)
        elif database == "postgres":
            with fresh_postgres(args.postgres_server) as url:
                results["postgres"] = run_database(url, args)
        else:
            raise SystemExit(f"unknown database {database!r}: sqlite or postgres")
        print(json.dumps({database: results[database]}), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
