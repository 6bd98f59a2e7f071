"""Pull the runnable code out of the pages under ``docs/``.

The convention (stated in ``docs/README.md``):

* every fenced block tagged ``sh`` or ``python`` runs, in page order, unless the
  line just before its opening fence is an HTML comment ``<!-- not run: reason -->``;
* a page's ``sh`` blocks run first, as one ``bash`` script with ``set -euo pipefail``
  (so shell variables set in one block are seen by the next); then its ``python``
  blocks run as one Python program, in the same working directory;
* both see ``LP``, ``LP_ADMIN`` (the labels party's URL and admin token) and ``FP``,
  ``FP_ADMIN`` (the features party's), with ``labeldp`` on ``PATH``.

Blocks of any other language (``text``, ``mermaid``, ``json``, ``console``) are
never run.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"

FENCE = re.compile(r"^(```+)\s*([\w-]*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(\S.*?)\s*-->$")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
#: How a CLI invocation starts: the bare command or the venv's copy.
COMMAND = re.compile(r"^(?:\.venv/bin/|\S*/)?labeldp$")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PUNCTUATION = ";&|()<>"


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip_reason: str | None

    @property
    def runs(self) -> bool:
        return self.lang in ("sh", "python") and self.skip_reason is None


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        fence, lang = match.groups()
        previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = NOT_RUN.match(previous)
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        if end == len(lines):
            raise ValueError(f"{path.name}:{i + 1}: unclosed code fence")
        found.append(
            Block(
                page=path.name,
                line=i + 1,
                lang=lang,
                code="\n".join(lines[i + 1 : end]) + "\n",
                skip_reason=skip.group(1) if skip else None,
            )
        )
        i = end + 1
    return found


def shell_script(page: list[Block]) -> str:
    parts = ["set -euo pipefail"]
    for block in page:
        if block.runs and block.lang == "sh":
            parts.append(f"# --- {block.page}:{block.line}\n{block.code}")
    return "\n".join(parts) + "\n"


def python_program(page: list[Block]) -> str:
    parts = []
    for block in page:
        if block.runs and block.lang == "python":
            parts.append(f"# --- {block.page}:{block.line}\n{block.code}")
    return "\n".join(parts)


def _logical_lines(code: str) -> list[str]:
    """Lines with backslash continuations joined and comments dropped."""
    out: list[str] = []
    current = ""
    for raw in code.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        out.append(current + line)
        current = ""
    if current:
        out.append(current)
    return out


def cli_invocations(path: Path) -> list[tuple[int, list[str]]]:
    """Every ``labeldp …`` command on a page — in shell blocks (run or not) and in
    inline code — as the argument list after ``labeldp``."""
    text = path.read_text()
    found: list[tuple[int, list[str]]] = []
    for block in blocks(path):
        if block.lang not in ("sh", "console"):
            continue
        for line in _logical_lines(block.code):
            line = line.removeprefix("$ ")
            found.extend((block.line, argv) for argv in _commands_in(line))
    in_fence = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for span in INLINE_CODE.findall(line):
            found.extend((number, argv) for argv in _commands_in(span))
    return found


def _commands_in(line: str) -> list[list[str]]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=PUNCTUATION)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    commands: list[list[str]] = []
    at_command = True  # the next word is in command position
    for i, token in enumerate(tokens):
        if token and all(c in PUNCTUATION for c in token):
            at_command = True
            continue
        word = token.removeprefix("$")
        if at_command and ASSIGNMENT.match(word):
            continue  # VAR=value before a command
        if not (at_command and COMMAND.match(word)):
            at_command = word in ("$", "")
            continue
        at_command = False
        argv: list[str] = []
        for arg in tokens[i + 1 :]:
            if arg and all(c in PUNCTUATION for c in arg):
                break
            argv.append(arg)
        if argv and argv[0] != "--help" and not argv[0].startswith("…"):
            commands.append(argv)
    return commands
