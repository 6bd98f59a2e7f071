"""Subcommands of the labels party: ``mechanism preview`` and ``label-party serve``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from label_party.config import Settings, WorkerSettings
from label_party.mechanisms.base import LOSSES
from label_party.mechanisms.registry import AUTO_CHOICES, MECHANISMS, MechanismSpec
from shared import strict_json
from shared.cli_errors import (
    CommandError,
    amount_argument,
    bearer,
    detail_text,
    refusal,
    unreachable,
)
from shared.protocol import AMOUNT_TEXT
from shared.settings_help import add_serve_command, settings_epilog
from shared.spending import command_key
from shared.strict_json import DuplicateKeyError
from shared.watching import Outage, QueuedHint
from shared.worker_loop import run_queue_worker

#: What ``release`` offers: every mechanism but those never released on their own
#: (``randomized-rounding``, which ``mechanism preview`` still shows).
RELEASABLE = sorted(name for name, spec in MECHANISMS.items() if spec.releasable)


def privacy_amount(text: str) -> str:
    """An argparse type for ε and δ amounts: a finite decimal number ≥ 0, sent as
    typed (the API takes decimals, so 0.1 stays exactly 0.1); a bad one is a usage
    error naming the option, before anything is sent."""
    return _amount(text, positive=False)


def positive_privacy_amount(text: str) -> str:
    """:func:`privacy_amount` > 0: what is spent (ε, a training's δ) and ε budgets."""
    return _amount(text, positive=True)


def _amount(text: str, *, positive: bool) -> str:
    if not AMOUNT_TEXT.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"expected a number such as 1 or 0.5, got {text!r}")
    value = Decimal(text.strip())
    if not value.is_finite() or value < 0 or (positive and value == 0):
        least = "> 0" if positive else "≥ 0"
        raise argparse.ArgumentTypeError(f"expected a finite number {least}, got {text!r}")
    return text.strip()


def _summary(spec: MechanismSpec) -> str:
    """A mechanism's line in ``mechanism preview --help``; ``auto``'s says what it
    can choose from, which is regression losses only."""
    if spec.name != "auto":
        return spec.summary
    by_choice: dict[str, list[str]] = {}
    for loss, (name, _) in AUTO_CHOICES.items():
        by_choice.setdefault(name, []).append(loss)
    choices = "; ".join(f"{', '.join(losses)} → {name}" for name, losses in by_choice.items())
    return f"regression only: picks by --loss and says why\n{'':<23}({choices}; refuses zero-one)"


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    party = commands.add_parser("label-party", help="the labels-party service")
    party_cmds = party.add_subparsers(dest="label_party_command", required=True, metavar="ACTION")
    epilog = settings_epilog(
        Settings,
        {"database_url": "SQLite in LABELDP_DATA_DIR",
         "admin_token": "required by serve (unless LABELDP_MODE=dev; the worker needs none)"},
    )  # fmt: skip
    add_serve_command(party_cmds, party="labels-party", port=8001, epilog=epilog, handler=run_serve)
    worker = party_cmds.add_parser(
        "worker",
        help="run a LabelDP-Pro training worker (settings as for serve)",
        description="Claim queued trainings from the service's database and train them\n"
        "(CUDA when present; LABELDP_TRAINING_DEVICE=auto|cpu|cuda). Any number of\n"
        "workers on Postgres; one on SQLite. It reads the same settings as serve\n"
        "but LABELDP_ADMIN_TOKEN, which only the API needs.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.add_argument("--once", action="store_true", help="exit when the queue is empty")
    worker.add_argument("--id", dest="worker_id", help="worker id (default host:pid:random)")
    worker.set_defaults(handler=run_worker)
    _register_client_commands(party_cmds)
    _register_training_commands(party_cmds)

    mech = commands.add_parser("mechanism", help="inspect label mechanisms without data")
    mech_cmds = mech.add_subparsers(dest="mechanism_command", required=True, metavar="ACTION")
    names = "\n".join(f"  {s.name:<20} {_summary(s)}" for s in MECHANISMS.values())
    p = mech_cmds.add_parser(
        "preview",
        help="fit a mechanism to a prior; print outputs, matrix, loss and bias",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fit a mechanism to a given prior (no data, no budget) and describe it.\n\n"
        "Mechanisms:\n" + names,
        epilog='Input file: {"values": [sorted label values], "prior": [probabilities]};\n'
        "for rr-with-prior, values are class indices and prior is the example's prior.",
    )
    p.add_argument(
        "--mechanism", required=True, choices=sorted(MECHANISMS), metavar="NAME",
        help="one of the mechanisms above",
    )  # fmt: skip
    p.add_argument("--epsilon", required=True, type=amount_argument, help="the mechanism's ε")
    p.add_argument("--loss", choices=LOSSES, help="default: squared (zero-one for classes)")
    p.add_argument("--mesh", type=int, help="output grid size for 'unbiased'")
    p.add_argument(
        "--time-limit", type=float, metavar="SECONDS",
        help="give up a fit that runs longer (the unbiased LP; default: no limit)",
    )  # fmt: skip
    p.add_argument(
        "--input",
        required=True,
        type=Path,
        metavar="FILE",
        help="JSON with values and prior ('-' reads stdin)",
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="mechanism option, e.g. clip=true (repeatable; VALUE is JSON)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run_preview)


def _parse_params(pairs: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise CommandError(f"--param expects KEY=VALUE, got {pair!r}")
        try:
            params[key] = strict_json.loads(raw)
        except DuplicateKeyError as exc:
            raise CommandError(f"--param {key}: {exc}") from None
        except json.JSONDecodeError:
            params[key] = raw
    return params


def _read_input(path: Path) -> tuple[list[float], list[float]]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CommandError(f"{path} is not UTF-8 text (a JSON file is)") from None
    try:
        data = strict_json.loads(text)
    except DuplicateKeyError as exc:
        raise CommandError(f"{path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise CommandError(f"{path} is not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict) or "values" not in data or "prior" not in data:
        raise CommandError(f'{path} must hold an object with "values" and "prior"')
    values, prior = data["values"], data["prior"]
    for key, seq in (("values", values), ("prior", prior)):
        if not isinstance(seq, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in seq
        ):
            raise CommandError(f'"{key}" in {path} must be a list of numbers')
    return values, prior


def run_preview(args: argparse.Namespace) -> int:
    from label_party.mechanisms.preview import preview  # scipy/HiGHS: only when used

    if args.time_limit is not None and not args.time_limit > 0:
        raise CommandError("--time-limit must be a positive number of seconds")
    values, prior = _read_input(args.input)
    result = preview(
        mechanism=args.mechanism,
        epsilon=args.epsilon,
        values=values,
        prior=prior,
        loss=args.loss,
        mesh=args.mesh,
        params=_parse_params(args.param),
        time_limit=args.time_limit,
    )
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"mechanism         {result['mechanism']}  (ε = {result['epsilon']:g}, "
        f"{result['loss']} loss)"
    )
    if result["selected"] != result["mechanism"]:
        print(f"selected          {result['selected']}: {result['params'].get('reason', '')}")
    loss = result["noisy_label_loss"]
    print(
        f"noisy-label loss  {loss:.6g}"
        if loss is not None
        else "noisy-label loss  undefined: an output ≤ 0 is no Poisson rate (these labels "
        "train a log-link model, whose loss is linear in the label: the bias is what counts)"
    )
    print(f"max |bias|        {result['max_abs_bias']:.6g}")
    if result["outputs"] is not None:
        outs = result["outputs"]
        shown = ", ".join(f"{o:.4g}" for o in outs[:12]) + (" …" if len(outs) > 12 else "")
        print(f"outputs ({len(outs):>4})    {shown}")
    print(f"fitted in         {result['seconds'] * 1000:.1f} ms")
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from label_party.app import create_app
    from shared.logging import configure_logging
    from shared.startup import load_settings, prepare_data_dir, serve, sole_server

    settings = load_settings(Settings)
    prepare_data_dir(settings.data_dir)
    # Before the migrations: a second server must not migrate the first one's database.
    with sole_server(settings.data_dir, "labels-party"):
        _prepared(settings)
        configure_logging(settings.log_level)
        serve(create_app(settings), args.host, args.port)
    return 0


def _prepared(settings: Settings) -> Settings:
    """The settings, their data directory writable and their database migrated: a
    problem with any is one line (``shared.startup``), before the server starts."""
    from label_party.db import connect, migrate
    from shared.startup import prepare

    url = settings.resolved_database_url
    prepare(settings.data_dir, url, lambda url: connect(url).writer_engine, migrate)
    return settings


def run_worker(args: argparse.Namespace) -> int:
    from label_party.db import connect, migrate
    from label_party.trainings.worker import Worker, resolve_device
    from shared.logging import configure_logging
    from shared.startup import load_settings

    settings = load_settings(WorkerSettings)
    try:  # before claiming anything: each claimed training has been paid for
        resolve_device(settings.training_device)
    except RuntimeError as exc:
        raise CommandError(str(exc)) from None
    _prepared(settings)
    configure_logging(settings.log_level)

    def open_worker(url: str) -> tuple[Worker, Callable[[], None]]:
        db = connect(url, connections=settings.database_connections)
        migrate(db.engine)
        return Worker(db, settings, worker_id=args.worker_id), db.dispose

    run_queue_worker(settings.resolved_database_url, settings.data_dir, open_worker, once=args.once)
    return 0


# -- client commands: the operator's side of the HTTP API ---------------------------


def _add_connection(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--url`` and ``--token``, which every client command takes."""
    p.add_argument(
        "--url",
        default=os.environ.get("LABELDP_URL", "http://127.0.0.1:8001"),
        help="the labels party's base URL (default: $LABELDP_URL, else http://127.0.0.1:8001)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("LABELDP_TOKEN"),
        help="a bearer token (default: $LABELDP_TOKEN, which keeps it out of ps and shell "
        "history): the admin's; a client's for what a client may do (releases, budget, "
        "trainings of its granted datasets); an auditor's for budget and verify-audit",
    )
    return p


def _register_client_commands(
    cmds: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return _add_connection(cmds.add_parser(name, help=help_))

    p = add("create-dataset", "create a dataset (admin)")
    p.add_argument("--name", required=True, help="a name for people (ids are generated)")
    p.add_argument(
        "--task", choices=["regression", "classification"], default="regression",
        help="what the labels are (default: regression)",
    )  # fmt: skip
    p.add_argument(
        "--domain", required=True,
        help='JSON, e.g. \'{"min": 0, "max": 100}\' or \'{"num_classes": 10}\'',
    )  # fmt: skip
    p.add_argument(
        "--epsilon-budget",
        required=True,
        type=positive_privacy_amount,
        help="the dataset's total ε",
    )
    p.add_argument(
        "--delta-budget", default="0", type=privacy_amount,
        help="the dataset's total δ (default 0: pure-DP releases only; LabelDP-Pro "
        "trainings spend δ)",
    )  # fmt: skip
    p.set_defaults(handler=_create_dataset)
    p = add(
        "list-datasets",
        "print the datasets you may see as JSON (the admin: all; a client: its granted ones)",
    )
    p.set_defaults(handler=lambda a: _print(_request(a, "GET", "/v1/datasets")))
    p = add("list-releases", "print a dataset's releases (yours, or all for the admin) as JSON")
    p.add_argument("dataset", help="the dataset's id")
    p.set_defaults(
        handler=lambda a: _print_rows(_all_pages(a, f"/v1/datasets/{a.dataset}/releases"))
    )
    p = add("upload", "upload a dataset's labels (.csv, .parquet, .jsonl)")
    p.add_argument("dataset", help="the dataset's id")
    p.add_argument(
        "file", type=Path,
        help="columns example_id and label; by its name .csv or .txt (CSV), .parquet, "
        ".jsonl, .ndjson or .json (JSON lines: one object a line)",
    )  # fmt: skip
    p.set_defaults(handler=_upload)
    p = add("release", "spend ε on a release; prints its manifest")
    p.add_argument("dataset", help="the dataset's id")
    p.add_argument(
        "--mechanism", required=True, choices=RELEASABLE, metavar="NAME",
        help=f"one of {', '.join(RELEASABLE)} (docs/choosing.md says which fits; "
        "`labeldp mechanism preview` tries one on a prior, free)",
    )  # fmt: skip
    p.add_argument(
        "--epsilon",
        required=True,
        type=positive_privacy_amount,
        help="all the ε this release spends",
    )
    p.add_argument(
        "--prior-epsilon",
        type=privacy_amount,
        help="the share of --epsilon spent on a private prior, for mechanisms that use one "
        "(default min(√(k/n), ε/2))",
    )
    p.add_argument(
        "--parts", help="comma-separated parts of the partition plan (default: every example)"
    )
    p.add_argument(
        "--idempotency-key",
        help="a retry with the same key (by the same client) returns the same release, spent "
        "once (default: a fresh key, printed on stderr before the request)",
    )
    p.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE",
        help="mechanism option, e.g. clip=true (repeatable; VALUE is JSON)",
    )  # fmt: skip
    p.set_defaults(handler=_release)
    p = add("create-client", "create a client or auditor; prints its token (shown once)")
    p.add_argument("--name", required=True, help="who it is for (kept in the audit log)")
    p.add_argument(
        "--role", choices=["client", "auditor"], default="client",
        help="client: releases and trainings of granted datasets; auditor: reads budgets "
        "and the audit log (default: client)",
    )  # fmt: skip
    p.set_defaults(handler=_create_client)
    p = add("grant", "let a client use a dataset")
    p.add_argument("dataset", help="the dataset's id")
    p.add_argument("client", help="the client's id")
    p.set_defaults(handler=_grant)
    p = add("revoke-client", "revoke a client's token (its releases stay spent)")
    p.add_argument("client", help="the client's id")
    p.set_defaults(handler=_revoke_client)
    p = add("download", "download a release's noisy labels")
    p.add_argument("release", help="the release's id")
    p.add_argument(
        "--output", type=Path, required=True, help="the file to write (-: standard output)"
    )
    p.add_argument(
        "--format", choices=["parquet", "json"], default="parquet", help="(default: parquet)"
    )
    p.set_defaults(handler=_download)
    p = add("budget", "a dataset's budget and spend (admin, its clients, auditors)")
    p.add_argument("dataset", help="the dataset's id")
    p.set_defaults(handler=_budget)
    p = add("verify-audit", "recompute the audit chain and the ledger (admin, auditors)")
    p.add_argument(
        "--anchor",
        help="a head an earlier verify-audit printed (SEQ:HASH): fail unless the chain "
        "still passes through it (keep heads outside the labels party)",
    )
    p.set_defaults(handler=_verify)


def _request(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    import httpx

    if not args.token:
        raise CommandError("a token is required (--token or LABELDP_TOKEN)")
    try:
        response = httpx.request(
            method,
            args.url.rstrip("/") + path,
            headers=bearer(args.token),
            timeout=600,
            **kwargs,
        )
    except httpx.TransportError as exc:
        raise unreachable(args.url, exc) from None
    if response.status_code >= 400:
        try:
            body = response.json()
            message = f"{body['error']}: {body['message']}"
            if body.get("detail"):
                message += f" {detail_text(body['detail'])}"
        except (ValueError, KeyError, TypeError):
            message = (
                f"{response.request.url} answered {response.status_code} without the labels "
                "party's error body (is --url the labels party?)"
            )
        raise refusal(response.status_code, message)
    return response


def _print(response: Any) -> int:
    print(json.dumps(response.json(), indent=2))
    return 0


def _create_dataset(args: argparse.Namespace) -> int:
    try:
        domain = strict_json.loads(args.domain)
    except DuplicateKeyError as exc:
        raise CommandError(f"--domain: {exc}") from None
    except json.JSONDecodeError:
        raise CommandError("--domain must be JSON") from None
    body = {
        "name": args.name,
        "task": args.task,
        "label_domain": domain,
        "epsilon_budget": args.epsilon_budget,
        "delta_budget": args.delta_budget,
    }
    return _print(_request(args, "POST", "/v1/datasets", json=body))


def _upload(args: argparse.Namespace) -> int:
    try:
        with args.file.open("rb") as fh:
            response = _request(
                args,
                "POST",
                f"/v1/datasets/{args.dataset}/labels",
                files={"file": (args.file.name, fh)},
            )
    except OSError as exc:
        raise CommandError(f"cannot read {args.file}: {exc.strerror}") from None
    return _print(response)


def _release(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {
        "mechanism": {"name": args.mechanism, **_parse_params(args.param)},
        "epsilon": args.epsilon,
    }
    if args.prior_epsilon is not None:
        body["prior_epsilon"] = args.prior_epsilon
    if args.parts is not None:
        body["parts"] = [p.strip() for p in args.parts.split(",") if p.strip()]
        if not body["parts"]:
            raise CommandError("--parts names no part (omit it to release every example)")
    body["idempotency_key"] = command_key(args.idempotency_key)
    return _print(_request(args, "POST", f"/v1/datasets/{args.dataset}/releases", json=body))


def _download(args: argparse.Namespace) -> int:
    response = _request(
        args, "GET", f"/v1/releases/{args.release}/labels", params={"format": args.format}
    )
    _write_output(args.output, response.content)
    return 0


def _write_output(path: Path, content: bytes, note: str = "") -> None:
    """Write ``content`` to ``path`` (``-``: standard output), and say so on stderr,
    where it never mixes with the bytes."""
    try:
        if str(path) == "-":
            sys.stdout.buffer.write(content)
            sys.stdout.flush()
        else:
            path.write_bytes(content)
    except OSError as exc:
        raise CommandError(f"cannot write --output {path}: {exc.strerror}") from None
    where = "standard output" if str(path) == "-" else str(path)
    print(f"wrote {len(content)} bytes to {where}{note}", file=sys.stderr)


def _create_client(args: argparse.Namespace) -> int:
    body = {"name": args.name, "role": args.role}
    return _print(_request(args, "POST", "/v1/clients", json=body))


def _grant(args: argparse.Namespace) -> int:
    body = {"client_id": args.client}
    return _print(_request(args, "POST", f"/v1/datasets/{args.dataset}/grants", json=body))


def _revoke_client(args: argparse.Namespace) -> int:
    return _print(_request(args, "DELETE", f"/v1/clients/{args.client}"))


def _budget(args: argparse.Namespace) -> int:
    return _print(_request(args, "GET", f"/v1/datasets/{args.dataset}/budget"))


def _verify(args: argparse.Namespace) -> int:
    params = {} if args.anchor is None else {"anchor": args.anchor}
    response = _request(args, "GET", "/v1/audit/verify", params=params)
    _print(response)
    return 0 if response.json()["ok"] else 1


# -- LabelDP-Pro trainings -----------------------------------------------------------

FINAL = ("succeeded", "failed", "cancelled")
QUEUED_HINT = (
    "still queued: trainings run in a labels-party worker (`labeldp label-party worker`, "
    "with the service's settings); is one running?"
)


def _register_training_commands(
    cmds: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    trainings = cmds.add_parser("trainings", help="LabelDP-Pro trainings: a model as the release")
    sub = trainings.add_subparsers(dest="trainings_command", required=True, metavar="ACTION")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return _add_connection(sub.add_parser(name, help=help_))

    p = add("create", "upload features and a spec; spends (ε, δ) now")
    p.add_argument(
        "--dataset", required=True, help="the dataset's id (its labels are the training's)"
    )
    p.add_argument(
        "--features", required=True, type=Path,
        help=".parquet, .csv or .jsonl: an example_id column and numeric feature columns",
    )  # fmt: skip
    p.add_argument(
        "--epsilon", required=True, type=positive_privacy_amount,
        help="charged to the dataset when accepted",
    )  # fmt: skip
    p.add_argument(
        "--delta", type=positive_privacy_amount,
        help="default: 1/n, n the labelled examples the features cover",
    )  # fmt: skip
    p.add_argument(
        "--denoiser", choices=["noop", "self-span", "self-conv", "alt-conv"],
        help="default: alt-conv (LabelDP-Pro); noop is plain DP-SGD",
    )  # fmt: skip
    p.add_argument(
        "--architecture", choices=["cnn", "mlp"],
        help="default: cnn (images: C·H·W numeric columns, 784 for 1,28,28); "
        "mlp for tabular features",
    )  # fmt: skip
    p.add_argument("--image-shape", help="C,H,W for the cnn (default 1,28,28)")
    p.add_argument("--epochs", type=int, help="default: 5")
    p.add_argument(
        "--batch-size", type=int, dest="expected_batch_size",
        help="expected Poisson batch size (default: min(1024, n))",
    )  # fmt: skip
    p.add_argument(
        "--spec",
        help='more spec fields, a JSON object, e.g. \'{"smoothing": 1, "alt_batch_size": 128}\' '
        "(docs/walkthrough-labels-party.md lists them)",
    )
    p.add_argument(
        "--idempotency-key",
        help="a retry with the same key spends once (default: a fresh key, printed on stderr)",
    )
    p.add_argument("--watch", action="store_true", help="follow it until it ends")
    p.set_defaults(handler=_training_create)
    p = add("list", "print a dataset's trainings (yours, or all for the admin) as JSON")
    p.add_argument("--dataset", required=True, help="the dataset's id")
    p.set_defaults(handler=_training_list)
    p = add("cancel", "cancel a queued or running training; its (ε, δ) stays spent")
    p.add_argument("training", help="the training's id")
    p.set_defaults(handler=_training_cancel)
    for name, help_ in (("get", "print a training as JSON"), ("watch", "follow until it ends")):
        p = add(name, help_)
        p.add_argument("training", help="the training's id")
        p.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
        p.set_defaults(handler=_training_get if name == "get" else _training_watch)
    p = add("download", "download a trained model's artifact")
    p.add_argument("training", help="the training's id")
    p.add_argument(
        "--output", type=Path, required=True,
        help="the file to write the model to (its SHA-256 is checked first; -: standard "
        "output)",
    )  # fmt: skip
    p.set_defaults(handler=_training_download)


def _training_spec(args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if args.spec:
        try:
            spec = strict_json.loads(args.spec)
        except DuplicateKeyError as exc:
            raise CommandError(f"--spec: {exc}") from None
        except json.JSONDecodeError:
            raise CommandError("--spec must be a JSON object") from None
        if not isinstance(spec, dict):
            raise CommandError("--spec must be a JSON object")
    options = {"epsilon": args.epsilon, "image_shape": args.image_shape}
    for key in ("delta", "denoiser", "architecture", "epochs", "expected_batch_size"):
        options[key] = getattr(args, key)
    twice = sorted(key for key, value in options.items() if value is not None and key in spec)
    if twice:  # one would silently override the other
        flags = {"expected_batch_size": "--batch-size"}
        given = ", ".join(f"{k} ({flags.get(k, '--' + k.replace('_', '-'))})" for k in twice)
        raise CommandError(f"given both as an option and in --spec: {given}; give each once")
    spec.update((key, value) for key, value in options.items() if value is not None)
    if args.image_shape:
        try:
            spec["image_shape"] = [int(v) for v in args.image_shape.split(",")]
        except ValueError:
            raise CommandError("--image-shape: C,H,W, e.g. 1,28,28") from None
    spec["idempotency_key"] = command_key(args.idempotency_key or spec.get("idempotency_key"))
    return spec


def _training_create(args: argparse.Namespace) -> int:
    if not args.features.is_file():  # before a key is announced for a request never sent
        raise CommandError(f"cannot read {args.features}: no such file")
    spec = _training_spec(args)
    try:
        with args.features.open("rb") as fh:
            response = _request(
                args,
                "POST",
                f"/v1/datasets/{args.dataset}/trainings",
                files={"file": (args.features.name, fh)},
                data={"spec": json.dumps(spec)},
            )
    except OSError as exc:
        raise CommandError(f"cannot read {args.features}: {exc.strerror}") from None
    training = response.json()
    if not args.watch:
        return _print(response)
    print(
        f"training {training['id']}: ε = {training['epsilon']}, δ = {training['delta']} "
        f"charged; {training['num_examples']} examples",
        flush=True,
    )
    args.training, args.interval = training["id"], 1.0
    return _training_watch(args)


def _training_get(args: argparse.Namespace) -> int:
    return _print(_request(args, "GET", f"/v1/trainings/{args.training}"))


def _training_list(args: argparse.Namespace) -> int:
    return _print_rows(_all_pages(args, f"/v1/datasets/{args.dataset}/trainings"))


def _print_rows(rows: list[Any]) -> int:
    print(json.dumps(rows, indent=2))
    return 0


def _all_pages(args: argparse.Namespace, path: str) -> list[Any]:
    """Every row of a paginated list, following its ``Link: rel="next"`` headers."""
    from shared.pagination import every_row

    first = _request(args, "GET", path, params={"limit": 1000})
    return every_row(first, lambda following: _request(args, "GET", following))


def _training_cancel(args: argparse.Namespace) -> int:
    return _print(_request(args, "DELETE", f"/v1/trainings/{args.training}"))


def training_line(training: dict[str, Any], width: int = 30) -> str:
    """``[#####-----]  40.0%  epoch 1/2 step 4/10 ETA 0:03  running``."""
    p = training.get("progress") or {}
    total = p.get("total_steps") or 0
    done = (
        1.0 if training["status"] == "succeeded" else (p.get("step", 0) / total if total else 0.0)
    )
    bar = "#" * int(done * width) + "-" * (width - int(done * width))
    parts = [f"[{bar}] {done * 100:5.1f}%"]
    if p:
        parts.append(f"epoch {p.get('epoch')}/{p.get('epochs')} step {p.get('step')}/{total}")
        if training["status"] == "running" and p.get("eta_seconds") is not None:
            eta = int(p["eta_seconds"])
            parts.append(f"ETA {eta // 60}:{eta % 60:02d}")
    parts.append(training["status"])
    return "  ".join(parts)


def _training_watch(args: argparse.Namespace) -> int:
    import time

    last, hint, outage = "", QueuedHint(QUEUED_HINT), Outage("the training")
    while True:
        training = outage.ask(
            lambda: _request(args, "GET", f"/v1/trainings/{args.training}").json(), args.interval
        )
        line = training_line(training)
        if line != last:
            print(line, flush=True)
            last = line
        if training["status"] in FINAL:
            break
        hint.saw(training["status"])
        time.sleep(args.interval)
    if training["status"] == "succeeded":
        accounting = training.get("accounting") or {}
        print(
            f"model {training['sha256']} (accounted ε = {accounting.get('epsilon'):.4g}, "
            f"δ = {accounting.get('delta'):.3g}, σ = {accounting.get('noise_multiplier'):.4g})"
        )
        return 0
    why = training.get("error") or (
        "cancelled by request" if training["status"] == "cancelled" else ""
    )
    print(f"{training['status']}: {why}".rstrip(": "), file=sys.stderr)
    return 1


def _training_download(args: argparse.Namespace) -> int:
    import hashlib

    response = _request(args, "GET", f"/v1/trainings/{args.training}/model")
    sha = hashlib.sha256(response.content).hexdigest()
    if sha != response.headers.get("X-Content-SHA256"):
        raise CommandError("the downloaded model does not match its SHA-256")
    _write_output(args.output, response.content, f" (sha256 {sha})")
    return 0
