"""``labeldp``: one command line for both parties, the demo and the tools.

Each party registers its own subcommands (``label_party.cli``,
``feature_party.cli``); this module only assembles them. An error prints one line
to stderr; the exit status says whose it is (:data:`EXIT_STATUSES`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

import httpx

from feature_party import cli as feature_cli
from feature_party.client import LabelsPartyError, LabelsPartyHTTPError
from label_party import cli as label_cli
from labeldp import demo, experiment
from labeldp.datasets import DatasetUnavailableError
from labeldp.processes import ServiceStartError
from shared.cli_errors import CommandError, detail_text
from shared.migrations import SchemaError
from shared.startup import StartupError
from shared.worker_loop import WorkerBusyError

#: Options whose value is a secret token. ``secrets.token_urlsafe`` (which the
#: docs suggest for admin tokens) starts one token in 64 with ``-``, which
#: argparse would take for an option; :func:`attach_token_values` keeps it a value.
TOKEN_OPTIONS = frozenset({"--token", "--labels-token", "--features-token"})

#: What a mistyped command's next option looks like (``--token --url …``): such a
#: word stays an option, so the missing token is reported, not swallowed.
_LONG_OPTION = re.compile(r"--[a-z][a-z-]*")

#: The exit statuses, as ``labeldp --help`` states them.
EXIT_STATUSES = """exit status:
  0    done
  1    failed, and may work as it is later: a service did not answer, failed (5xx)
       or was busy (429); a run, job or training failed or was cancelled; an audit
       chain did not verify
  2    the command must change: a bad argument, or a request a service refused as
       asked (another 4xx; the message gives its code and detail)
  130  interrupted"""

#: Failures of a run (a service down, a step refused): one line, exit status 1.
RUNTIME_ERRORS = (
    demo.DemoError,
    LabelsPartyError,
    ServiceStartError,
    SchemaError,
    DatasetUnavailableError,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labeldp",
        description="Label differential privacy between a labels party and a features party.",
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    label_cli.register(commands)
    feature_cli.register(commands)
    demo.register(commands)
    experiment.register(commands)
    return parser


def attach_token_values(argv: Sequence[str]) -> list[str]:
    """``--token VALUE`` → ``--token=VALUE`` for the :data:`TOKEN_OPTIONS`, so a
    token beginning with ``-`` parses as the value it is."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        word, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if word in TOKEN_OPTIONS and value is not None and not _LONG_OPTION.fullmatch(value):
            out.append(f"{word}={value}")
            i += 2
        else:
            out.append(word)
            i += 1
    return out


def _shown(exc: Exception) -> str:
    """The error's message, except pyarrow's: a parse error quotes the offending
    cell, which may be a label (DESIGN.md §3.1). Readers name their file instead."""
    if type(exc).__module__.startswith("pyarrow"):
        return "a file could not be read as a table (its parser's message is withheld)"
    return str(exc)


def _with_detail(exc: Exception) -> str:
    """A refusal with its detail (the rows at fault, by number and reason: the labels
    party never puts a value there), as ``labeldp label-party`` commands show it."""
    if isinstance(exc, LabelsPartyHTTPError) and exc.detail:
        return f"{exc} {detail_text(exc.detail)}"
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(attach_token_values(sys.argv[1:] if argv is None else argv))
    try:
        result: int = args.handler(args)
    except CommandError as exc:
        print(f"labeldp: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except (WorkerBusyError, StartupError, ValueError) as exc:
        print(f"labeldp: error: {_shown(exc)}", file=sys.stderr)
        return 2
    except RUNTIME_ERRORS as exc:
        print(f"labeldp: error: {_with_detail(exc)}", file=sys.stderr)
        return 1
    except httpx.InvalidURL as exc:
        print(f"labeldp: error: not a URL: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("labeldp: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``| head``): say nothing more, and keep Python's
        # exit-time flush of stdout from raising again (the Python docs' recipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return result


if __name__ == "__main__":
    sys.exit(main())
