"""``labeldp feature-party …``: the service, the worker, jobs, LP-MST and models
(the plain client commands live in :mod:`feature_party.cli_client`).

``feature_party.cli.register(commands)`` adds the ``feature-party`` command to
the ``labeldp`` parser; ``python -m feature_party`` runs the same commands alone.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from feature_party.cli_client import (
    add_jobs_submit,
    add_list,
    add_models_predict,
    call,
    json_arg,
    labels_party_token,
    register_feature_sets,
    register_labels,
    service_url,
)
from feature_party.client import path_segment
from feature_party.config import Settings
from shared.cli_errors import CommandError, amount_argument
from shared.logging import configure_logging
from shared.settings_help import add_serve_command, settings_epilog
from shared.startup import StartupError
from shared.watching import Outage, QueuedHint
from shared.worker_loop import WorkerBusyError, run_queue_worker


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``labeldp feature-party …``."""
    fp = commands.add_parser(
        "feature-party", help="the features party: service, worker and client commands"
    )
    _add_actions(fp)


def _add_actions(fp: argparse.ArgumentParser) -> None:
    """The actions under ``fp``: ``labeldp feature-party`` or ``python -m feature_party``
    (argparse fixes each usage line's prefix as a parser is added)."""
    sub = fp.add_subparsers(dest="feature_party_command", required=True, metavar="ACTION")

    epilog = settings_epilog(
        Settings,
        {
            "database_url": "SQLite in LABELDP_DATA_DIR",
            "admin_token": "required by serve (the worker needs none)",
        },
    )
    add_serve_command(sub, party="features-party", port=8002, epilog=epilog, handler=run_serve)

    worker = sub.add_parser(
        "worker",
        help="run a training worker (one per SQLite database, any number on Postgres)",
        description="Claim queued training jobs from the service's database and run them\n"
        "(CUDA when present). Any number of workers on Postgres; one on SQLite.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.add_argument("--once", action="store_true", help="exit when the queue is empty")
    worker.add_argument("--id", dest="worker_id", help="worker id (default host:pid:random)")
    worker.set_defaults(handler=run_worker)

    jobs = sub.add_parser(
        "jobs",
        help="submit, inspect and cancel training jobs",
        description="Submit, inspect and cancel training jobs; authenticates with the "
        "features party's admin token, LABELDP_ADMIN_TOKEN.",
    )
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    handlers = {"get": run_jobs_get, "watch": run_jobs_watch, "cancel": run_jobs_cancel}
    for name, help_ in (
        ("get", "print a job as JSON"),
        ("watch", "show a progress bar until done"),
        ("cancel", "cancel a queued or running job (its worker stops at the next step)"),
    ):
        p = jobs_sub.add_parser(name, help=help_)
        p.add_argument("job_id", help="the job's id (`jobs submit` prints it)")
        service_url(p)
        p.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
        p.set_defaults(handler=handlers[name])

    add_jobs_submit(jobs_sub)
    add_list(
        jobs_sub,
        "/v1/jobs",
        "job",
        {"status": "only jobs in this status (queued, running, succeeded, failed, cancelled)",
         "feature_set_id": "only this feature set's"},
    )  # fmt: skip
    register_feature_sets(sub)
    register_labels(sub)
    _register_multistage(sub)
    _register_models(sub)


def _register_models(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = sub.add_parser("models", help="the model registry")
    models_sub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    imp = models_sub.add_parser(
        "import",
        help="import a LabelDP-Pro model trained by the labels party",
        description="Downloads the model of a succeeded labels-party training, checks its "
        "SHA-256 and registers it for prediction. The labels-party client token comes "
        "from LABELDP_LABELS_PARTY_TOKEN, never from the command line; the command "
        "authenticates to the features party with its admin token, LABELDP_ADMIN_TOKEN.",
    )
    imp.add_argument(
        "--labels-party-url", required=True,
        help="the labels party's base URL, where the training ran",
    )  # fmt: skip
    imp.add_argument("--training", required=True, help="training id at the labels party")
    service_url(imp)
    imp.set_defaults(handler=run_models_import)
    add_models_predict(models_sub)
    add_list(models_sub, "/v1/models", "model (trained here or imported)")


def run_models_import(args: argparse.Namespace) -> int:
    body = {
        "labels_party_url": args.labels_party_url,
        "token": labels_party_token(),
        "training_id": args.training,
    }
    print(json.dumps(call("POST", args.url, "/v1/models/import", body), indent=2))
    return 0


def _register_multistage(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ms = sub.add_parser(
        "multistage",
        help="LP-MST: multi-stage training with RRWithPrior across both parties",
        description="Runs LP-MST (Algorithm 3 of Ghazi et al., 'Deep Learning with Label "
        "Differential Privacy', NeurIPS 2021; docs/papers.md) through the features-party "
        "service (which needs a worker). The labels-party client token comes from "
        "LABELDP_LABELS_PARTY_TOKEN, never from the command line; the command "
        "authenticates to the features party with its admin token, LABELDP_ADMIN_TOKEN.",
    )
    ms_sub = ms.add_subparsers(dest="multistage_command", required=True, metavar="ACTION")
    start = ms_sub.add_parser(
        "start",
        help="start a run and follow it until it ends",
        description="Start an LP-MST run and follow it. Tokens come from the environment: "
        "LABELDP_LABELS_PARTY_TOKEN (the labels party's client token, held in the "
        "service's memory only) and LABELDP_ADMIN_TOKEN (the features party's).",
    )
    start.add_argument("--feature-set", required=True, help="feature set id")
    start.add_argument("--labels-party-url", required=True, help="the labels party's base URL")
    start.add_argument("--dataset", required=True, help="dataset id at the labels party")
    start.add_argument("--epsilon", type=amount_argument, required=True, help="ε per example")
    start.add_argument(
        "--stages", type=int,
        help="T, 1 to 10 (default: one per --fractions share, else 2 with a 40/60 split)",
    )  # fmt: skip
    start.add_argument("--fractions", help="comma-separated shares per stage, e.g. 0.4,0.6")
    start.add_argument("--seed", type=int, help="partition seed, ≥ 0 (default: random)")
    start.add_argument(
        "--part-prefix", help="the plan's parts are PREFIX-1 … PREFIX-T (default: lpmst)"
    )
    start.add_argument(
        "--temperature", type=float, default=1.0,
        help="prior softmax temperature, in (0, 100] (default 1)",
    )  # fmt: skip
    start.add_argument(
        "--no-filter", action="store_true", help="keep earlier labels outside the top-k*"
    )
    start.add_argument(
        "--training",
        default="{}",
        help="training configuration: a JSON object or a path to one (task is classification)",
    )
    start.add_argument("--no-watch", action="store_true", help="print the run and exit")
    service_url(start)
    start.set_defaults(handler=run_multistage_start)
    for name, help_, handler in (
        ("get", "print a run as JSON", "get"),
        ("watch", "follow a run until it ends", "watch"),
        ("resume", "resume an interrupted or failed run (token from the environment)", "resume"),
        ("cancel", "end a run for good, its stage's job too (what it spent stays spent)",
         "cancel"),
    ):  # fmt: skip
        p = ms_sub.add_parser(name, help=help_)
        p.add_argument("run_id", help="the run's id (`multistage start` prints it)")
        service_url(p)
        p.add_argument("--interval", type=float, default=2.0, help=argparse.SUPPRESS)
        if handler == "resume":
            p.add_argument(
                "--training",
                help="a corrected training configuration (JSON object or path) for the "
                "stages not yet trained, e.g. when a stage failed for its device",
            )
        p.set_defaults(handler=run_multistage, multistage_action=handler)
    add_list(ms_sub, "/v1/multistage", "LP-MST run")


def run_serve(args: argparse.Namespace) -> int:
    from feature_party.app import create_app
    from shared.startup import serve

    settings = _ready_settings(serving=True)
    try:
        app = create_app(settings)
    except ValueError as exc:  # the admin token
        raise StartupError(str(exc)) from None
    configure_logging(settings.log_level)
    serve(app, args.host, args.port, ws="none")
    return 0


def _ready_settings(*, serving: bool = False) -> Settings:
    """The settings, their data directory writable and their database migrated: a
    problem with any is one line (``shared.startup``), before anything starts. A
    server's admin token is checked first: a misconfigured one migrated a shared
    database before it refused to start (helper-73)."""
    from feature_party.db import make_engine, migrate
    from shared.startup import load_settings, prepare

    settings = load_settings(Settings)
    if serving:
        try:
            settings.require_admin_token()
        except ValueError as exc:
            raise StartupError(f"invalid settings: {exc}") from None
    prepare(settings.data_dir, settings.resolved_database_url, make_engine, migrate)
    return settings


def run_worker(args: argparse.Namespace) -> int:
    from feature_party.db import Database, migrate
    from feature_party.jobs.worker import Worker

    settings = _ready_settings()
    configure_logging(settings.log_level)

    def open_worker(url: str) -> tuple[Worker, Callable[[], None]]:
        database = Database(url)
        migrate(database.engine)
        return Worker(database, settings, worker_id=args.worker_id), database.dispose

    run_queue_worker(settings.resolved_database_url, settings.data_dir, open_worker, once=args.once)
    return 0


def _get_job(url: str, job_id: str) -> dict[str, Any]:
    return call("GET", url, f"/v1/jobs/{path_segment(job_id)}")


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
    if job.get("stalled"):
        parts.append("(stalled: its worker stopped; another takes it when one polls)")
    return "  ".join(parts)


def run_jobs_cancel(args: argparse.Namespace) -> int:
    print(json.dumps(call("DELETE", args.url, f"/v1/jobs/{path_segment(args.job_id)}"), indent=2))
    return 0


#: What ``jobs watch`` says once when no worker has taken the job for a while.
QUEUED_HINT = (
    "still queued: jobs run in a features-party worker (`labeldp feature-party worker`, "
    "with the service's settings); is one running, with the GPUs the job asks for?"
)


def run_jobs_watch(args: argparse.Namespace) -> int:
    tty = sys.stdout.isatty()
    last, hint, outage = "", QueuedHint(QUEUED_HINT), Outage("the job")
    while True:
        job = outage.ask(lambda: _get_job(args.url, args.job_id), args.interval)
        line = progress_line(job)
        if line != last:
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
            last = line
        if job["status"] in {"succeeded", "failed", "cancelled"}:
            if tty:
                print()
            if job["status"] != "succeeded":
                print(f"{job['status']}: {job.get('error') or 'by request'}", file=sys.stderr)
            elif job.get("model_id"):
                print(f"model {job['model_id']}")
            return 0 if job["status"] == "succeeded" else 1
        hint.saw(job["status"])
        time.sleep(args.interval)


def run_multistage_start(args: argparse.Namespace) -> int:
    training = {"task": "classification", "loss": "cross-entropy"}
    training.update(json_arg(args.training, "--training"))
    body: dict[str, Any] = {
        "feature_set_id": args.feature_set,
        "labels_party_url": args.labels_party_url,
        "token": labels_party_token(),
        "dataset_id": args.dataset,
        "epsilon": args.epsilon,
        "temperature": args.temperature,
        "filter_top_k": not args.no_filter,
        "training": training,
    }
    if args.fractions:
        try:
            body["fractions"] = [float(f) for f in args.fractions.split(",")]
        except ValueError:
            raise CommandError("--fractions: comma-separated numbers, e.g. 0.4,0.6") from None
    body["stages"] = args.stages if args.stages is not None else len(body.get("fractions", [2, 2]))
    for option, value in (("--epsilon", args.epsilon), ("--temperature", args.temperature)):
        if not (math.isfinite(value) and value > 0):  # JSON cannot carry nan or inf
            raise CommandError(f"{option} must be a finite number > 0, got {value}")
    if args.seed is not None:
        body["seed"] = args.seed
    if args.part_prefix is not None:
        body["part_prefix"] = args.part_prefix
    run = call("POST", args.url, "/v1/multistage", body)
    if args.no_watch:
        print(json.dumps(run, indent=2))
        return 0
    print(f"run {run['id']} (partition seed {run['config']['seed']})", flush=True)
    return _watch_run(args.url, run["id"], interval=2.0)


def run_multistage(args: argparse.Namespace) -> int:
    path = f"/v1/multistage/{path_segment(args.run_id)}"
    if args.multistage_action in ("get", "cancel"):
        method = "GET" if args.multistage_action == "get" else "DELETE"
        print(json.dumps(call(method, args.url, path), indent=2))
        return 0
    if args.multistage_action == "resume":
        body: dict[str, Any] = {"token": labels_party_token()}
        if args.training is not None:
            body["training"] = json_arg(args.training, "--training")
        call("POST", args.url, f"{path}/resume", body)
    return _watch_run(args.url, args.run_id, interval=args.interval)


def stage_line(stage: dict[str, Any], stages: int) -> str:
    """``stage 2/2 lpmst-2 (600 examples): release r1 · 1200 labels (30 filtered) · …``."""
    parts = [f"stage {stage['stage']}/{stages} {stage['part']} ({stage['num_examples']} examples)"]
    if stage.get("prior_set_id"):
        parts.append(f"priors {stage['prior_set_id'][:8]}")
    if stage.get("release_id"):
        k = stage.get("mean_k_star")
        parts.append(f"release {stage['release_id'][:8]}" + (f" (mean k* {k:.2f})" if k else ""))
    if stage.get("num_training_labels") is not None:
        parts.append(
            f"{stage['num_training_labels']} labels ({stage.get('num_filtered') or 0} filtered)"
        )
    if stage.get("job_id") and not stage.get("model_id"):
        job = {"status": stage.get("job_status") or "queued", "progress": stage.get("job_progress")}
        parts.append(progress_line(job, width=20))
    if stage.get("model_id"):
        accuracy = (stage.get("metrics") or {}).get("validation_noisy_accuracy")
        suffix = f" (noisy validation accuracy {accuracy:.3f})" if accuracy is not None else ""
        parts.append(f"model {stage['model_id'][:8]}{suffix}")
    return " · ".join(parts)


def _watch_run(url: str, run_id: str, *, interval: float) -> int:
    shown: dict[int, str] = {}
    while True:
        run = call("GET", url, f"/v1/multistage/{run_id}")
        for stage in run["stages"]:
            line = stage_line(stage, run["config"]["stages"])
            if shown.get(stage["stage"]) != line:
                print(line, flush=True)
                shown[stage["stage"]] = line
        if run["status"] != "running":
            if run["status"] == "succeeded":
                print(f"succeeded: model {run['model_id']}")
                return 0
            print(f"{run['status']}: {run.get('error')}", file=sys.stderr)
            return 1
        time.sleep(interval)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m feature_party",
        description="The features party: service, worker and client commands "
        "(the same as `labeldp feature-party`).",
    )
    _add_actions(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result: int = args.handler(args)
    except CommandError as exc:
        print(f"labeldp: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except (WorkerBusyError, StartupError, ValueError) as exc:
        print(f"labeldp: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return result
