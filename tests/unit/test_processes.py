"""Local service processes die with the command that started them."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

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
