"""``labeldp feature-party`` client commands: the publisher's calls to its own API.

Each command is one request to the features party (DESIGN.md §6) with its admin
token, ``LABELDP_ADMIN_TOKEN``; a labels-party token, where one is needed, comes
from ``LABELDP_LABELS_PARTY_TOKEN``, never from the command line. Answers are
printed as JSON; errors as the service's code, message and detail (exit status 2
for a refusal, 1 for a service that did not answer, failed or was busy:
:mod:`shared.cli_errors`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from feature_party.client import path_segment
from shared import strict_json
from shared.cli_errors import (
    CommandError,
    amount_argument,
    bearer,
    detail_text,
    refusal,
    unreachable,
)
from shared.pagination import every_row
from shared.spending import command_key
from shared.tokens import admin_token_problem

#: Long enough for a large upload or a release the labels party randomizes in-line.
TIMEOUT_SECONDS = 600
#: Rows a ``list`` command asks for at a time (the services' most).
PAGE_SIZE = 1000


def admin_token() -> str:
    """The features party's admin token, which its client commands present. Read
    alone: the service's other settings are not a client's to validate (and their
    errors quoted every setting's value, the token's included)."""
    token = os.environ.get("LABELDP_ADMIN_TOKEN", "").strip()
    problem = admin_token_problem(token)
    if problem:
        raise CommandError(
            f"{problem}: this command authenticates to the features party with its admin "
            "token; set LABELDP_ADMIN_TOKEN"
        )
    return token


def _send(
    method: str,
    url: str,
    path: str,
    body: Any = None,
    *,
    files: dict[str, Any] | None = None,
    data: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
) -> httpx.Response:
    """One request to the features party; its error as a :class:`CommandError`."""
    try:
        response = httpx.request(
            method,
            f"{url.rstrip('/')}{path}",
            json=body,
            files=files,
            data=data,
            params=params,
            headers=bearer(admin_token(), "LABELDP_ADMIN_TOKEN"),
            timeout=TIMEOUT_SECONDS,
        )
    except httpx.TransportError as exc:
        raise unreachable(url, exc) from None
    try:
        answer = response.json()
    except ValueError:
        raise CommandError(
            f"{url}{path} answered {response.status_code} without JSON (is it the features party?)"
        ) from None
    if response.status_code >= 400:
        # The detail names what to fix (a field, the rows at fault), as label-party shows it.
        detail = f" {detail_text(answer['detail'])}" if answer.get("detail") else ""
        message = f"{answer.get('error')}: {answer.get('message')}{detail}"
        raise refusal(response.status_code, message)
    return response


def call(
    method: str,
    url: str,
    path: str,
    body: Any = None,
    *,
    files: dict[str, Any] | None = None,
    data: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One request to the features party and its JSON object."""
    answer: dict[str, Any] = _send(method, url, path, body, files=files, data=data).json()
    return answer


def call_pages(url: str, path: str, params: dict[str, str] | None = None) -> list[Any]:
    """Every row of a paginated list, following its ``Link: rel="next"`` headers."""
    first = _send("GET", url, path, params={**(params or {}), "limit": PAGE_SIZE})
    return every_row(first, lambda following: _send("GET", url, following))


def add_list(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    path: str,
    what: str,
    filters: dict[str, str] | None = None,
) -> argparse.ArgumentParser:
    """A ``list`` action: every row of ``path`` as one JSON array, oldest first;
    ``filters`` maps each query parameter it may narrow by to its help."""
    p = actions.add_parser("list", help=f"print every {what} as JSON, oldest first")
    for name, help_ in (filters or {}).items():
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, help=help_)
    service_url(p)

    def run(args: argparse.Namespace) -> int:
        given = {name: getattr(args, name) for name in filters or {}}
        rows = call_pages(args.url, path, {k: v for k, v in given.items() if v is not None})
        print(json.dumps(rows, indent=2))
        return 0

    p.set_defaults(handler=run)
    return p


def service_url(p: argparse.ArgumentParser) -> None:
    """``--url``, the features party's, as every client command takes it; its help
    says where the admin token comes from."""
    p.epilog = (p.epilog + " " if p.epilog else "") + (
        "Authenticates to the features party with its admin token, read from "
        "$LABELDP_ADMIN_TOKEN (never from the command line)."
    )
    p.add_argument(
        "--url",
        default=os.environ.get("LABELDP_FEATURE_PARTY_URL", "http://127.0.0.1:8002"),
        help="features-party URL (default: $LABELDP_FEATURE_PARTY_URL, else http://127.0.0.1:8002)",
    )


def labels_party_token() -> str:
    token = os.environ.get("LABELDP_LABELS_PARTY_TOKEN", "")
    if not token:
        raise CommandError("set LABELDP_LABELS_PARTY_TOKEN to your labels-party client token")
    return token


def json_arg(text: str, what: str) -> dict[str, Any]:
    """A JSON object given inline or as a path to a file holding one."""
    try:
        # Text that looks like JSON is JSON; anything else names a file.
        source = text if text.lstrip()[:1] in ("{", "[", '"') else Path(text).read_text()
        value = strict_json.loads(source)  # a key named twice: a ValueError
    except (OSError, ValueError) as exc:
        raise CommandError(f"{what}: not a JSON object nor a readable JSON file: {exc}") from None
    if not isinstance(value, dict):
        raise CommandError(f"{what} must be a JSON object")
    return value


def _print(answer: dict[str, Any]) -> int:
    print(json.dumps(answer, indent=2))
    return 0


def _upload(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise CommandError(f"{path}: no such file")
    return {"file": (file.name, file.open("rb"))}


def register_feature_sets(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fs = sub.add_parser("feature-sets", help="upload and inspect feature sets")
    fs_sub = fs.add_subparsers(dest="feature_sets_command", required=True, metavar="ACTION")
    upload = fs_sub.add_parser(
        "upload",
        help="upload a CSV or Parquet file with example_id and feature columns",
        description="Upload features (example_id plus feature columns; CSV or Parquet). "
        "Column roles are inferred (numbers numeric, text categorical) unless --schema "
        "declares them. Prints the feature set, whose id the other commands take.",
    )
    upload.add_argument(
        "file",
        help="Parquet (named .parquet or .pq, or by its content) or CSV (any other name, "
        "except JSON, Excel, Avro, ORC, Feather and Arrow names, which are refused)",
    )
    upload.add_argument(
        "--schema",
        help='column roles: JSON {"numeric": [...], "categorical": [...]} or a path to it',
    )
    upload.add_argument("--name", help="a name to recognize it by")
    service_url(upload)
    upload.set_defaults(handler=run_feature_sets_upload)
    get = fs_sub.add_parser("get", help="print a feature set as JSON")
    get.add_argument(
        "feature_set_id", help="the feature set's id (`feature-sets upload` prints it)"
    )
    service_url(get)
    get.set_defaults(
        handler=lambda a: _print(
            call("GET", a.url, f"/v1/feature-sets/{path_segment(a.feature_set_id)}")
        )
    )
    add_list(fs_sub, "/v1/feature-sets", "feature set")


def run_feature_sets_upload(args: argparse.Namespace) -> int:
    data: dict[str, str] = {}
    if args.schema:
        data["schema"] = json.dumps(json_arg(args.schema, "--schema"))
    if args.name:
        data["name"] = args.name
    files = _upload(args.file)
    try:
        return _print(call("POST", args.url, "/v1/feature-sets", files=files, data=data))
    finally:
        files["file"][1].close()


def register_labels(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    labels = sub.add_parser("labels", help="receive label-DP releases from the labels party")
    labels_sub = labels.add_subparsers(dest="labels_command", required=True, metavar="ACTION")
    receive = labels_sub.add_parser(
        "receive",
        help="ask for a new release (spends ε) or fetch an existing one (free)",
        description="Receive noisy labels and join them to a feature set. With --mechanism "
        "and --epsilon the labels party makes a new release and charges its budget; "
        "with --release it hands over one already made, at no cost. The labels-party "
        "client token comes from LABELDP_LABELS_PARTY_TOKEN. If a new release was made "
        "but could not be stored here, the error names it: fetch it again with --release.",
    )
    receive.add_argument("--feature-set", required=True, help="feature set id")
    receive.add_argument("--labels-party-url", required=True, help="the labels party's base URL")
    receive.add_argument("--dataset", required=True, help="dataset id at the labels party")
    receive.add_argument("--release", help="an existing release's id (free)")
    receive.add_argument("--mechanism", help="a new release's mechanism, e.g. rr-on-bins")
    receive.add_argument("--params", help="the mechanism's parameters: a JSON object or a path")
    receive.add_argument("--epsilon", type=amount_argument, help="the new release's total ε")
    receive.add_argument(
        "--prior-epsilon", type=amount_argument, help="ε for its private prior, if any"
    )
    receive.add_argument("--parts", help="comma-separated parts of the partition plan")
    receive.add_argument(
        "--idempotency-key",
        help="reuse on a retry: the same key never spends twice (default: a fresh key, "
        "printed on stderr before the request)",
    )
    service_url(receive)
    receive.set_defaults(handler=run_labels_receive)
    get = labels_sub.add_parser("get", help="print received labels as JSON")
    get.add_argument("labels_id", help="the received labels' id (`labels receive` prints it)")
    service_url(get)
    get.set_defaults(
        handler=lambda a: _print(
            call("GET", a.url, f"/v1/received-labels/{path_segment(a.labels_id)}")
        )
    )
    add_list(
        labels_sub,
        "/v1/received-labels",
        "received release",
        {"feature_set_id": "only those joined to this feature set", "dataset_id": "only this "
         "labels-party dataset's"},
    )  # fmt: skip


def receive_body(args: argparse.Namespace) -> dict[str, Any]:
    """The ``POST /v1/received-labels`` body of ``labels receive``'s options."""
    body: dict[str, Any] = {
        "feature_set_id": args.feature_set,
        "labels_party_url": args.labels_party_url,
        "token": labels_party_token(),
        "dataset_id": args.dataset,
    }
    new = (args.mechanism, args.params, args.epsilon, args.prior_epsilon, args.parts,
           args.idempotency_key)  # fmt: skip
    if args.release is not None:
        if any(value is not None for value in new):
            raise CommandError("--release fetches a release made before: give no release options")
        return {**body, "release_id": args.release}
    if args.mechanism is None or args.epsilon is None:
        raise CommandError("give --mechanism and --epsilon (a new release) or --release")
    for name in ("epsilon", "prior_epsilon"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise CommandError(f"--{name.replace('_', '-')} must be a finite number ≥ 0")
    release: dict[str, Any] = {"mechanism": {"name": args.mechanism}, "epsilon": args.epsilon}
    if args.params:
        params = json_arg(args.params, "--params")
        if "name" in params:
            raise CommandError("--params holds the parameters only; the name is --mechanism")
        release["mechanism"].update(params)  # the API takes them beside "name"
    if args.prior_epsilon is not None:
        release["prior_epsilon"] = args.prior_epsilon
    if args.parts:
        release["parts"] = [p.strip() for p in args.parts.split(",") if p.strip()]
    release["idempotency_key"] = command_key(args.idempotency_key)
    return {**body, "release": release}


def run_labels_receive(args: argparse.Namespace) -> int:
    return _print(call("POST", args.url, "/v1/received-labels", receive_body(args)))


def add_jobs_submit(jobs_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    submit = jobs_sub.add_parser(
        "submit",
        help="queue a training job on received labels",
        description="Queue a training job: a feature set, labels received for it, and the "
        "training configuration (task, model, loss, epochs, … — the POST /v1/jobs body "
        "without the two ids). Prints the job; follow it with `jobs watch`.",
    )
    submit.add_argument("--feature-set", required=True, help="feature set id")
    submit.add_argument("--labels", required=True, help="received labels id")
    submit.add_argument(
        "--config", default="{}", help="training configuration: a JSON object or a path"
    )
    service_url(submit)
    submit.set_defaults(handler=run_jobs_submit)


def run_jobs_submit(args: argparse.Namespace) -> int:
    config = json_arg(args.config, "--config")
    for key in ("feature_set_id", "labels_id"):
        if key in config:
            raise CommandError(f"--config must not hold {key}: give it as an option")
    body = {**config, "feature_set_id": args.feature_set, "labels_id": args.labels}
    return _print(call("POST", args.url, "/v1/jobs", body))


def add_models_predict(models_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    predict = models_sub.add_parser(
        "predict",
        help="predict for the rows of a CSV or Parquet file",
        description="Send a file of feature rows (the model's columns, example_id "
        "optional) and print {example_id, prediction} as JSON, or write it with --output "
        "(.csv: one row per example; anything else: JSON).",
    )
    predict.add_argument(
        "model_id", help="the model's id (a succeeded job's model_id, or `models import`'s id)"
    )
    predict.add_argument(
        "file", help="feature rows: Parquet (.parquet, .pq or by its content), else CSV"
    )
    predict.add_argument("--output", help="write the predictions here instead of printing")
    service_url(predict)
    predict.set_defaults(handler=run_models_predict)


def run_models_predict(args: argparse.Namespace) -> int:
    files = _upload(args.file)
    try:
        answer = call(
            "POST", args.url, f"/v1/models/{path_segment(args.model_id)}/predict", files=files
        )
    finally:
        files["file"][1].close()
    if args.output is None:
        return _print(answer)
    out = Path(args.output)
    try:
        with out.open("w", newline="") as fh:
            if out.suffix.lower() == ".csv":
                writer = csv.writer(fh)
                writer.writerow(["example_id", "prediction"])
                writer.writerows(zip(answer["example_id"], answer["prediction"], strict=True))
            else:
                json.dump(answer, fh)
    except OSError as exc:
        raise CommandError(f"--output {args.output}: {exc.strerror}") from None
    print(f"{len(answer['prediction'])} predictions written to {out}", file=sys.stderr)
    return 0
