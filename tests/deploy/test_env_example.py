"""The real ``serve`` commands of docker-compose.yml refuse .env.example's tokens.

Each API service's exact command runs as a process with the environment compose
would give it from an unchanged copy of .env.example (database and data directory
moved to a temporary directory, port to a free one, so that a service that wrongly
accepts the token neither looks for the compose host nor binds a public port). It
must exit with status 2 and name ``LABELDP_ADMIN_TOKEN``, not start serving.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from labeldp.processes import free_port
from tests.deploy.deployfiles import (
    COMPOSE,
    environment,
    load_compose,
    option,
    read_env_file,
    variables_in,
)

pytestmark = pytest.mark.slow


def local_command(command: list[str]) -> list[str]:
    """``command`` on 127.0.0.1 and a free port instead of 0.0.0.0 and a fixed one."""
    port, host = option(command, "--port"), option(command, "--host")
    args = list(command)
    for flag, old, new in (("--port", port, str(free_port())), ("--host", host, "127.0.0.1")):
        if old is not None:
            args[args.index(flag) + 1] = new
    return args


def test_api_services_refuse_the_example_tokens(tmp_path: Path) -> None:
    compose = load_compose(COMPOSE)
    example = read_env_file()
    base_env = {k: v for k, v in os.environ.items() if not k.upper().startswith("LABELDP_")}
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for name, service in compose["services"].items():
            command = service.get("command") or []
            if command[:1] != ["labeldp"] or "serve" not in command:
                continue
            env = {k: v or "" for k, v in environment(service).items()}
            (variable,) = variables_in(env["LABELDP_ADMIN_TOKEN"])
            env["LABELDP_ADMIN_TOKEN"] = example[variable]
            env["LABELDP_DATA_DIR"] = str(tmp_path / name)
            env["LABELDP_DATABASE_URL"] = f"sqlite:///{tmp_path / name}.sqlite3"
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "labeldp", *local_command(command)[1:]],
                env={**base_env, **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        assert set(procs) == {"label-api", "feature-api"}
        for name, proc in procs.items():
            try:
                _, stderr = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} started with the .env.example token instead of refusing it")
            assert proc.returncode == 2, f"{name}: status {proc.returncode}: {stderr}"
            assert "LABELDP_ADMIN_TOKEN" in stderr, f"{name}: {stderr}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
