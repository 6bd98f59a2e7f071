"""``labeldp``: one command line for both parties, the demo and the tools.

Each party registers its own subcommands (``label_party.cli``,
``feature_party.cli``); this module only assembles them. Errors a user can fix
print one line to stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from feature_party import cli as feature_cli
from feature_party.client import LabelsPartyError
from label_party import cli as label_cli
from labeldp import demo, experiment
from labeldp.processes import ServiceStartError

#: Failures of a run (a service down, a step refused): one line, exit status 1.
RUNTIME_ERRORS = (demo.DemoError, LabelsPartyError, ServiceStartError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labeldp",
        description="Label differential privacy between a labels party and a features party.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    label_cli.register(commands)
    feature_cli.register(commands)
    demo.register(commands)
    experiment.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.handler(args)
    except (label_cli.CommandError, feature_cli.CommandError, ValueError) as exc:
        print(f"labeldp: error: {exc}", file=sys.stderr)
        return 2
    except RUNTIME_ERRORS as exc:
        print(f"labeldp: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("labeldp: interrupted", file=sys.stderr)
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
