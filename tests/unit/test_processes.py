"""Local service processes die with the command that started them."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labeldp.processes import ServiceProcess, ServiceStartError, free_port, running

SCRIPT = """
import sys, time
from pathlib import Path
from labeldp.processes import ServiceProcess, free_port, running
port = free_port()
service = ServiceProcess("features party", ["feature-party", "serve", "--port", str(port)],
                         {"LABELDP_DATA_DIR": sys.argv[1], "LABELDP_ADMIN_TOKEN": sys.argv[2]},
                         Path(sys.argv[1]) / "log", port=port)
with running(service):
    print(service.process.pid, flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_to_the_parent_stops_its_services(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path), secrets.token_urlsafe(24)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the service outlived the command that started it"
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_services_take_no_settings_from_the_environment_they_start_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's exported LABELDP_DATABASE_URL (say, production's) reached the demo's
    services: both parties migrated that one database."""
    exported = tmp_path / "production.sqlite3"
    monkeypatch.setenv("LABELDP_DATABASE_URL", f"sqlite:///{exported}")
    monkeypatch.setenv("LABELDP_LOG_LEVEL", "not-a-level")
    port = free_port()
    env = {"LABELDP_DATA_DIR": str(tmp_path / "data"),
           "LABELDP_ADMIN_TOKEN": secrets.token_urlsafe(24)}  # fmt: skip
    service = ServiceProcess("features party", ["feature-party", "serve", "--port", str(port)],
                             env, tmp_path / "log", port=port)  # fmt: skip
    with running(service):
        pass
    assert not exported.exists()
    assert (tmp_path / "data" / "feature-party.db").exists()


def test_a_service_that_cannot_start_is_explained_in_the_error(tmp_path: Path) -> None:
    """The log named in the error was often in a temporary directory already gone."""
    port = free_port()
    env = {"LABELDP_DATA_DIR": str(tmp_path / "data"), "LABELDP_LOG_LEVEL": "verbose",
           "LABELDP_ADMIN_TOKEN": secrets.token_urlsafe(24)}  # fmt: skip
    service = ServiceProcess("features party", ["feature-party", "serve", "--port", str(port)],
                             env, tmp_path / "log", port=port)  # fmt: skip
    with pytest.raises(ServiceStartError, match="LABELDP_LOG_LEVEL"), running(service):
        pass
