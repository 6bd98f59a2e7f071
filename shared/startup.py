"""What a service or worker checks before it starts, with one line for the
operator when something is wrong (not a traceback from inside uvicorn's start-up).

Both parties' ``serve`` and ``worker`` commands call these in order: settings, data
directory, database. Each failure is a :class:`StartupError` naming the
``LABELDP_*`` variable to fix. Messages never quote a setting's value: a token or a
database password may be in it.
"""

from __future__ import annotations

import difflib
import fcntl
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

S = TypeVar("S", bound=BaseSettings)

ENV_PREFIX = "LABELDP_"

#: Every ``LABELDP_*`` variable some part of labeldp reads: both parties' settings
#: (kept here, not imported: neither party imports the other), the CLI clients'
#: (``label_party.cli``, ``feature_party.cli_client``), the harness's
#: (``labeldp.harness``, ``labeldp.datasets``) and the test suite's. A test checks
#: it against the settings classes and against every name the sources spell.
KNOWN_VARIABLES = frozenset({
    # both parties' settings
    "LABELDP_ADMIN_TOKEN", "LABELDP_DATABASE_URL", "LABELDP_DATA_DIR", "LABELDP_LOG_LEVEL",
    "LABELDP_MAX_CONCURRENT_REQUESTS", "LABELDP_MAX_JSON_BYTES", "LABELDP_MAX_UPLOAD_BYTES",
    # the labels party's
    "LABELDP_MODE", "LABELDP_CHUNK_SIZE", "LABELDP_DATABASE_CONNECTIONS",
    "LABELDP_MAX_CONCURRENT_PREVIEWS",
    "LABELDP_MAX_GRID_SIZE", "LABELDP_PREVIEW_SECONDS", "LABELDP_RELEASE_BYTES_PER_LABEL",
    "LABELDP_RELEASE_FIT_SECONDS",
    "LABELDP_TEST_CRASH_POINT", "LABELDP_TEST_SEED", "LABELDP_TRAINING_DEVICE",
    "LABELDP_TRAINING_MAX_EXAMPLE_GRADIENTS", "LABELDP_TRAINING_MAX_FEATURES_BYTES",
    "LABELDP_TRAINING_MAX_PARAMETERS", "LABELDP_TRAINING_MAX_PROJECTION_BYTES",
    "LABELDP_TRAINING_MAX_STEPS", "LABELDP_WORKER_HEARTBEAT_SECONDS",
    "LABELDP_WORKER_LEASE_SECONDS", "LABELDP_WORKER_POLL_SECONDS",
    # the features party's
    "LABELDP_CLIENT_BACKOFF_SECONDS", "LABELDP_CLIENT_RETRIES", "LABELDP_CLIENT_TIMEOUT_SECONDS",
    "LABELDP_HEARTBEAT_SECONDS", "LABELDP_JOB_LEASE_SECONDS", "LABELDP_POLL_SECONDS",
    # outside the settings classes
    "LABELDP_URL", "LABELDP_TOKEN", "LABELDP_LABELS_PARTY_TOKEN", "LABELDP_FEATURE_PARTY_URL",
    "LABELDP_LABELS_TOKEN", "LABELDP_FEATURES_TOKEN", "LABELDP_DATASETS_DIR",
    "LABELDP_TEST_POSTGRES_URL",
})  # fmt: skip


class StartupError(Exception):
    """A service cannot start; the message is one line an operator can act on."""


def settings_problems(exc: ValidationError) -> str:
    """``LABELDP_<NAME>: what is wrong; …`` for each invalid variable."""
    problems = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        loc = "_".join(str(part) for part in error["loc"])
        problems.append(f"{ENV_PREFIX}{loc.upper()}: {message}" if loc else message)
    return "; ".join(problems)


def load_settings(settings: type[S]) -> S:
    """``settings`` from the environment, after :func:`check_variable_names`."""
    check_variable_names(os.environ)
    try:
        return settings()
    except ValidationError as exc:
        raise StartupError(f"invalid settings: {settings_problems(exc)}") from None


def check_variable_names(environ: Mapping[str, str]) -> None:
    """Refuse a ``LABELDP_*`` variable no part of labeldp reads: a misspelled
    setting was silently ignored, and its default ran (helper-73). Names are
    compared upper-cased, as pydantic-settings reads them. A setting of the other
    party passes: one environment may serve both (the demo, a shared ``.env``)."""
    unknown = sorted(name for name in environ if name.upper().startswith(ENV_PREFIX)
                     and name.upper() not in KNOWN_VARIABLES)  # fmt: skip
    if unknown:
        raise StartupError("; ".join(map(_unknown_variable, unknown)))


def _unknown_variable(name: str) -> str:
    # Compared without the prefix, which every name shares and would make all alike.
    suffixes = sorted(known.removeprefix(ENV_PREFIX) for known in KNOWN_VARIABLES)
    suffix = name.upper().removeprefix(ENV_PREFIX)
    close = difflib.get_close_matches(suffix, suffixes, n=1, cutoff=0.8)
    hint = (
        f": did you mean {ENV_PREFIX}{close[0]}?" if close else " (serve --help lists the settings)"
    )
    return f"{name} is not a labeldp setting{hint}"


def write_probe(directory: Path) -> None:
    """Create and delete a file in ``directory`` (``OSError`` if it cannot). A name
    of its own: two processes starting at once (two workers) shared
    ".write-check", and one's unlink made the other's fail with ENOENT."""
    probe = directory / f".write-check-{os.getpid()}-{uuid.uuid4().hex}"
    probe.touch()
    probe.unlink()


def prepare_data_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        write_probe(path)
    except OSError as exc:
        raise StartupError(
            f"{ENV_PREFIX}DATA_DIR {path} is not a writable directory: {exc.strerror}"
        ) from None


def _shown(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(unparsable)"


def open_database(url: str, connect: Callable[[str], Engine], migrate: Callable[[Engine], None]
                  ) -> None:  # fmt: skip
    """Connect to the database and bring its schema to the newest revision."""
    try:
        engine = connect(url)
    except (ArgumentError, NoSuchModuleError, ImportError):  # ImportError: mysql:// etc.
        raise StartupError(
            f"{ENV_PREFIX}DATABASE_URL is not a database URL this service knows; use "
            "postgresql+psycopg://USER:PASSWORD@HOST:5432/DB, or leave it unset for SQLite"
        ) from None
    if engine.dialect.name == "sqlite" and engine.url.database in (None, "", ":memory:"):
        engine.dispose()
        # Each connection would have its own empty database: every request 503.
        raise StartupError(
            f"{ENV_PREFIX}DATABASE_URL is an in-memory SQLite database, which the service's "
            "connections would not share: give a file (sqlite:///PATH), or leave it unset"
        )
    try:
        migrate(engine)
    except OperationalError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0] if str(exc.orig or exc) else ""
        raise StartupError(f"cannot open the database {_shown(url)}: {reason}") from None
    finally:
        engine.dispose()


def prepare(data_dir: Path, url: str, connect: Callable[[str], Engine],
            migrate: Callable[[Engine], None]) -> None:  # fmt: skip
    """The data directory writable and the database migrated, or a :class:`StartupError`."""
    prepare_data_dir(data_dir)
    open_database(url, connect, migrate)


@contextmanager
def flocked(path: Path) -> Iterator[bool]:
    """Try to hold an exclusive lock on ``path`` for the block; yields whether it
    did. The OS's lock: a killed process releases it, so none outlives its holder."""
    with path.open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


@contextmanager
def sole_server(data_dir: Path, party: str) -> Iterator[None]:
    """Hold ``data_dir``'s server lock while the server runs: its start-up sweep sets
    aside the files no committed row references, which, under a second server on
    the same directory, are that server's releases in flight."""
    with flocked(data_dir / "server.lock") as held:
        if not held:
            raise StartupError(
                f"another {party} server already uses {ENV_PREFIX}DATA_DIR {data_dir}: run "
                "one server per data directory"
            )
        yield


def serve(app: Any, host: str, port: int, **options: Any) -> None:
    """Run ``app`` under uvicorn on ``host:port``, on a socket bound here first: a
    port in use, or an address that is not this machine's, is a :class:`StartupError`
    (one line) instead of uvicorn's log lines and its exit status 3."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                            **options)  # fmt: skip
    server = uvicorn.Server(config)
    with _listening(host, port) as sock:
        # uvicorn names the address only when it binds the socket itself.
        shown = f"[{host}]" if ":" in host else host
        logging.getLogger("uvicorn.error").info(f"listening on http://{shown}:{port}")
        try:
            server.run(sockets=[sock])
        except SystemExit as exc:  # uvicorn's exit status 3: the app did not start
            raise StartupError(
                "the service stopped while starting: the log above says why"
            ) from exc
    if not server.started:
        raise StartupError("the service stopped while starting: the log above says why")


def _listening(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` as uvicorn binds one (IPv6 for a host
    with a colon; ``SO_REUSEADDR``, so a restart need not wait out TIME_WAIT)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; another process may "
            "hold the port: stop it, or give --port (and --host) another"
        ) from None
    return sock
