"""The ``LABELDP_*`` variables a settings class reads, as ``--help`` text, the
``serve`` command both parties build on it, and the lease/heartbeat rule both
parties' settings check (:func:`check_lease`).

Generated from the class itself, so ``serve --help`` cannot drift from the code;
docs/operations.md says what each variable does (a test checks it names them all).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import Field
from pydantic_settings import BaseSettings


def environment_names(settings: type[BaseSettings]) -> list[str]:
    """``LABELDP_*`` names of the class's fields, in declaration order."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    return [(prefix + name).upper() for name in settings.model_fields]


def settings_epilog(settings: type[BaseSettings], unset: Mapping[str, str] = {}) -> str:
    """One line per variable with its default, for an ``argparse`` epilog;
    ``unset`` says, by field name, what a variable without a default means."""
    lines = ["settings (environment variables, default):"]
    fields = settings.model_fields
    for env, (name, field) in zip(environment_names(settings), fields.items(), strict=True):
        if name.startswith("test_"):
            continue  # test-only switches, refused outside LABELDP_MODE=test
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        shown = unset.get(name, "unset") if default is None else str(default)
        lines.append(f"  {env:<34} {shown}")
    lines.append("docs/operations.md says what each does.")
    return "\n".join(lines)


def tcp_port(text: str) -> int:
    """An ``argparse`` type: a TCP port number, 1–65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {port}")
    return port


def add_serve_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    *,
    party: str,
    port: int,
    epilog: str,
    handler: Callable[[argparse.Namespace], Any],
) -> None:
    """``serve --host --port`` for ``party``, with the settings as its epilog."""
    serve = commands.add_parser(
        "serve",
        help="run the HTTP API (migrates its database first; settings from LABELDP_*)",
        description=f"Run the {party} API; it migrates its database on start.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    serve.add_argument("--port", type=tcp_port, default=port, help="port (default: %(default)s)")
    serve.set_defaults(handler=handler)


#: A duration setting: positive, finite and at most a day. ``inf`` or ``1e12`` was
#: taken, and a worker then failed at run time (a timestamp out of range: every
#: claim logged an error and the job stayed queued; helper-73).
Seconds = Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)]


def check_lease(settings: BaseSettings, lease: str, heartbeat: str) -> None:
    """Refuse (``ValueError``) settings whose worker would lose its own work: a
    heartbeat (field ``heartbeat``) that renews the lease (field ``lease``) less
    than twice per lease lets one late renewal (a slow database, a long step) hand
    a healthy run to another worker, and with two workers every run bounced
    between them until it failed (a labels party's training is charged when
    accepted: its ε was spent for nothing)."""
    lease_seconds, heartbeat_seconds = getattr(settings, lease), getattr(settings, heartbeat)
    if heartbeat_seconds * 2 > lease_seconds:
        raise ValueError(
            f"LABELDP_{heartbeat.upper()} ({heartbeat_seconds:g}) must be at most half of "
            f"LABELDP_{lease.upper()} ({lease_seconds:g}): a worker renews its lease each "
            "heartbeat"
        )
