"""Subcommands of the labels party: ``mechanism preview`` (and the service)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from label_party.mechanisms.base import LOSSES
from label_party.mechanisms.preview import preview
from label_party.mechanisms.registry import MECHANISMS


class CommandError(Exception):
    """A command-line input the user must fix."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mech = commands.add_parser("mechanism", help="inspect label mechanisms without data")
    mech_cmds = mech.add_subparsers(dest="mechanism_command", required=True, metavar="ACTION")
    names = "\n".join(f"  {s.name:<20} {s.summary}" for s in MECHANISMS.values())
    p = mech_cmds.add_parser(
        "preview",
        help="fit a mechanism to a prior; print outputs, matrix, loss and bias",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fit a mechanism to a given prior (no data, no budget) and describe it.\n\n"
        "Mechanisms:\n" + names,
        epilog='Input file: {"values": [sorted label values], "prior": [probabilities]};\n'
        "for rr-with-prior, values are class indices and prior is the example's prior.",
    )
    p.add_argument("--mechanism", required=True, choices=sorted(MECHANISMS), metavar="NAME")
    p.add_argument("--epsilon", required=True, type=float)
    p.add_argument("--loss", choices=LOSSES, help="default: squared (zero-one for classes)")
    p.add_argument("--mesh", type=int, help="output grid size for 'unbiased'")
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
            params[key] = json.loads(raw)
        except json.JSONDecodeError:
            params[key] = raw
    return params


def _read_input(path: Path) -> tuple[list[float], list[float]]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
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
    values, prior = _read_input(args.input)
    result = preview(
        mechanism=args.mechanism,
        epsilon=args.epsilon,
        values=values,
        prior=prior,
        loss=args.loss,
        mesh=args.mesh,
        params=_parse_params(args.param),
    )
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"mechanism         {result['mechanism']}  (ε = {result['epsilon']:g}, "
        f"{result['loss']} loss)"
    )
    print(f"noisy-label loss  {result['noisy_label_loss']:.6g}")
    print(f"max |bias|        {result['max_abs_bias']:.6g}")
    if result["outputs"] is not None:
        outs = result["outputs"]
        shown = ", ".join(f"{o:.4g}" for o in outs[:12]) + (" …" if len(outs) > 12 else "")
        print(f"outputs ({len(outs):>4})    {shown}")
    print(f"fitted in         {result['seconds'] * 1000:.1f} ms")
    return 0
