"""The pages under ``docs/`` are executable: their commands run against real services.

One labels party, one features party and one worker run as processes (SQLite in a
temporary directory, random admin tokens) for the whole module. Each page runs in
its own working directory: its ``sh`` blocks as one ``bash`` script, then its
``python`` blocks as one program (the convention is in ``docs/README.md`` and
``tests/docs/markdown.py``). Every ``labeldp …`` command a page mentions must
parse, run or not.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from labeldp.cli import build_parser
from labeldp.processes import ServiceProcess, free_port
from tests.docs.markdown import DOCS, blocks, cli_invocations, pages, python_program, shell_script

BIN = Path(sys.executable).parent
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LABELDP_")}


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("doc-services")
    lp_admin, fp_admin = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    lp_port, fp_port = free_port(), free_port()
    label_env = {"LABELDP_DATA_DIR": str(root / "labels-party"), "LABELDP_ADMIN_TOKEN": lp_admin}
    feature_env = {
        "LABELDP_DATA_DIR": str(root / "features-party"),
        "LABELDP_ADMIN_TOKEN": fp_admin,
        "LABELDP_POLL_SECONDS": "0.2",
    }
    logs = root / "logs"
    procs = [
        ServiceProcess(
            "labels party",
            ["label-party", "serve", "--port", str(lp_port)],
            label_env,
            logs / "labels-party.log",
            port=lp_port,
        ),
        ServiceProcess(
            "features party",
            ["feature-party", "serve", "--port", str(fp_port)],
            feature_env,
            logs / "features-party.log",
            port=fp_port,
        ),
        ServiceProcess("worker", ["feature-party", "worker"], feature_env, logs / "worker.log"),
    ]
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("LABELDP_")}
    try:
        with ExitStack() as stack:
            # Start all three at once (each takes seconds to import), then wait.
            for proc in procs:
                stack.callback(proc.stop)
                proc.start()
            for proc in procs:
                if proc.port is not None:
                    proc.wait_healthy(90)
            yield {
                **_clean_env(),
                "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "LP": procs[0].url,
                "LP_ADMIN": lp_admin,
                "FP": procs[1].url,
                "FP_ADMIN": fp_admin,
                "DOC_LOGS": str(logs),
            }
    finally:
        os.environ.update(saved)


def _runnable_pages() -> list[str]:
    return [p.name for p in pages() if any(b.runs for b in blocks(p))]


def _run(argv: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
    try:
        result = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False
        )
    except subprocess.TimeoutExpired as exc:  # the services' logs say what it waited on
        pytest.fail(f"{what} timed out\n--- stderr\n{_text(exc.stderr)}{_log_tails(env)}")
    if os.environ.get("DOCS_TEST_ECHO"):
        print(f"--- {what}\n{result.stdout}{result.stderr}")
    if result.returncode != 0:
        pytest.fail(
            f"{what} failed with status {result.returncode}\n--- stdout\n{result.stdout}"
            f"\n--- stderr\n{result.stderr}{_log_tails(env)}"
        )


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _log_tails(env: dict[str, str]) -> str:
    return "".join(
        f"\n--- {log.name} (tail)\n" + "\n".join(log.read_text().splitlines()[-20:])
        for log in sorted(Path(env["DOC_LOGS"]).glob("*.log"))
    )


@pytest.mark.slow
@pytest.mark.parametrize("page", _runnable_pages())
def test_page_runs(page: str, services: dict[str, str], tmp_path: Path) -> None:
    found = blocks(DOCS / page)
    script, program = shell_script(found), python_program(found)
    if script.strip() != "set -euo pipefail":
        (tmp_path / "page.sh").write_text(script)
        _run(["bash", str(tmp_path / "page.sh")], tmp_path, services, f"{page}: sh blocks")
    if program.strip():
        (tmp_path / "page.py").write_text(program)
        _run([sys.executable, str(tmp_path / "page.py")], tmp_path, services, f"{page}: python")


def test_the_walkthroughs_have_runnable_blocks() -> None:
    runnable = set(_runnable_pages())
    for page in ("walkthrough-labels-party.md", "walkthrough-features-party.md", "audit.md"):
        assert page in runnable
        langs = {b.lang for b in blocks(DOCS / page) if b.runs}
        assert "sh" in langs, page
    for page in ("walkthrough-labels-party.md", "walkthrough-features-party.md"):
        assert "python" in {b.lang for b in blocks(DOCS / page) if b.runs}, page


def test_blocks_that_do_not_run_say_why() -> None:
    for page in pages():
        for block in blocks(page):
            if block.lang in ("sh", "python"):
                assert block.runs or block.skip_reason, f"{page.name}:{block.line}"
            else:
                assert block.lang in ("text", "mermaid", "json", "console", "yaml", "ini"), (
                    f"{page.name}:{block.line}: untagged or unknown fence {block.lang!r}"
                )


def test_every_cli_command_in_the_docs_parses() -> None:
    parser = build_parser()
    seen = 0
    for page in pages():
        for line, argv in cli_invocations(page):
            if "--help" in argv or "-h" in argv:
                continue
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    parser.parse_args(argv)
            except SystemExit:
                # Prose may name a command without its options ("`labeldp mechanism
                # preview` fits …"): then the command path itself must exist.
                if any(a.startswith("-") for a in argv) or not _is_command(parser, argv):
                    pytest.fail(f"{page.name}:{line}: `labeldp {' '.join(argv)}` does not parse")
            seen += 1
    assert seen >= 10


def _is_command(parser: argparse.ArgumentParser, argv: list[str]) -> bool:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            parser.parse_args([*argv, "--help"])
        except SystemExit as exc:
            return exc.code == 0
    return False


def test_links_between_pages_resolve() -> None:
    for page in pages():
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_bash_is_available() -> None:
    assert shutil.which("bash"), "the doc test runs sh blocks with bash"


@pytest.mark.parametrize("party", ["label-party", "feature-party"])
def test_every_setting_is_in_serve_help_and_operations(party: str) -> None:
    from feature_party.config import Settings as FeatureSettings
    from label_party.config import Settings as LabelSettings
    from shared.settings_help import environment_names

    settings = LabelSettings if party == "label-party" else FeatureSettings
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([party, "serve", "--help"])
    operations = (DOCS / "operations.md").read_text()
    for name in environment_names(settings):
        assert name in operations, f"docs/operations.md omits {name}"
        if name.startswith("LABELDP_TEST_"):  # test-only: not shown to operators
            assert name not in out.getvalue(), f"{party} serve --help shows {name}"
        else:
            assert name in out.getvalue(), f"{party} serve --help omits {name}"
