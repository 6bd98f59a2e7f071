"""``labeldp feature-party …``: the service, the worker, and job commands.

``feature_party.cli.register(commands)`` adds the ``feature-party`` command to
the ``labeldp`` parser; ``python -m feature_party`` runs the same commands alone.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from feature_party.config import get_settings


class CommandError(Exception):
    """A command-line input the user must fix."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fp = commands.add_parser("feature-party", help="the features party: service, worker, jobs")
    sub = fp.add_subparsers(dest="feature_party_command", required=True, metavar="ACTION")

    serve = sub.add_parser("serve", help="run the HTTP service (migrates the database first)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8002)
    serve.set_defaults(handler=run_serve)

    worker = sub.add_parser("worker", help="run a training worker (any number, any machine)")
    worker.add_argument("--once", action="store_true", help="exit when the queue is empty")
    worker.add_argument("--id", dest="worker_id", help="worker id (default host:pid:random)")
    worker.set_defaults(handler=run_worker)

    jobs = sub.add_parser("jobs", help="inspect training jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    for name, help_ in (
        ("get", "print a job as JSON"),
        ("watch", "show a progress bar until done"),
    ):
        p = jobs_sub.add_parser(name, help=help_)
        p.add_argument("job_id")
        p.add_argument(
            "--url",
            default=os.environ.get("LABELDP_FEATURE_PARTY_URL", "http://127.0.0.1:8002"),
            help="service URL (env LABELDP_FEATURE_PARTY_URL)",
        )
        p.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
        p.set_defaults(handler=run_jobs_get if name == "get" else run_jobs_watch)


def _token() -> str:
    settings = get_settings()
    try:
        return settings.require_admin_token()
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from feature_party.app import create_app

    try:
        app = create_app()
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", ws="none")
    return 0


def run_worker(args: argparse.Namespace) -> int:
    from feature_party.db import Database, migrate
    from feature_party.jobs.worker import Worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    url = settings.resolved_database_url
    with ExitStack() as stack:
        if url.startswith("sqlite"):
            stack.enter_context(_single_sqlite_worker(settings.data_dir))
        database = Database(url)
        stack.callback(database.dispose)
        migrate(database.engine)
        worker = Worker(database, settings, worker_id=args.worker_id)
        worker.install_signal_handlers()
        worker.run(once=args.once)
    return 0


@contextmanager
def _single_sqlite_worker(data_dir: Path) -> Iterator[None]:
    """SQLite serializes every write: allow one worker per database (the lock is
    the OS's, so a killed worker releases it)."""
    with (data_dir / "worker.lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CommandError(
                "another worker already serves this SQLite database; "
                "use Postgres (LABELDP_DATABASE_URL) for several workers"
            ) from None
        yield


def _get_job(url: str, job_id: str) -> dict[str, Any]:
    try:
        response = httpx.get(
            f"{url.rstrip('/')}/v1/jobs/{job_id}",
            headers={"Authorization": f"Bearer {_token()}"},
            timeout=30,
        )
    except httpx.TransportError as exc:
        raise CommandError(f"cannot reach {url}: {exc}") from None
    body: dict[str, Any] = response.json()
    if response.status_code != 200:
        raise CommandError(f"{body.get('error')}: {body.get('message')}")
    return body


def run_jobs_get(args: argparse.Namespace) -> int:
    print(json.dumps(_get_job(args.url, args.job_id), indent=2))
    return 0


def progress_line(job: dict[str, Any], width: int = 30) -> str:
    """``[#####-----] epoch 3/10 step 12/40 loss 0.1234 ETA 0:42  running``."""
    p = job.get("progress") or {}
    epochs, steps = p.get("epochs") or 0, p.get("steps_per_epoch") or 0
    done = 0.0
    if epochs and steps:
        done = ((p.get("epoch", 1) - 1) * steps + p.get("step", 0)) / (epochs * steps)
    if job["status"] == "succeeded":
        done = 1.0
    bar = "#" * int(done * width) + "-" * (width - int(done * width))
    parts = [f"[{bar}] {done * 100:5.1f}%"]
    if p:
        parts.append(f"epoch {p.get('epoch')}/{epochs} step {p.get('step')}/{steps}")
        if p.get("loss") is not None:
            parts.append(f"loss {p['loss']:.4g}")
        if p.get("eta_seconds") is not None and job["status"] == "running":
            eta = int(p["eta_seconds"])
            parts.append(f"ETA {eta // 60}:{eta % 60:02d}")
    parts.append(job["status"])
    return "  ".join(parts)


def run_jobs_watch(args: argparse.Namespace) -> int:
    tty = sys.stdout.isatty()
    last = ""
    while True:
        job = _get_job(args.url, args.job_id)
        line = progress_line(job)
        if line != last:
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
            last = line
        if job["status"] in {"succeeded", "failed", "cancelled"}:
            if tty:
                print()
            if job["status"] == "failed":
                print(f"error: {job.get('error')}", file=sys.stderr)
            elif job.get("model_id"):
                print(f"model {job['model_id']}")
            return 0 if job["status"] == "succeeded" else 1
        time.sleep(args.interval)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m feature_party")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register(commands)
    args = parser.parse_args(["feature-party", *(sys.argv[1:] if argv is None else argv)])
    try:
        result: int = args.handler(args)
    except CommandError as exc:
        print(f"labeldp: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return result
