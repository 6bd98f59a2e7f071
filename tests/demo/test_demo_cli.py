"""``labeldp demo`` as a newcomer meets it: failures are one clear line, and Ctrl-C
leaves no service behind."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from labeldp.processes import ServiceProcess, free_port, running


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_unreachable_services_fail_with_one_line(tmp_path: Path) -> None:
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    proc = subprocess.run(
        [sys.executable, "-m", "labeldp", "demo", "--quick", "--output", str(tmp_path),
         "--labels-party", dead, "--labels-token", "t" * 20,
         "--features-party", dead, "--features-token", "t" * 20],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("labeldp: error:")]
    assert len(errors) == 1, proc.stderr
    assert not (tmp_path / "report.md").exists()


def test_a_party_down_or_refusing_its_token_is_found_before_anything_is_created(
    tmp_path: Path,
) -> None:
    """The demo created a dataset at the labels party, then found the features party
    down; both parties are now checked first."""
    port, token = free_port(), secrets.token_urlsafe(24)
    env = {"LABELDP_DATA_DIR": str(tmp_path / "lp"), "LABELDP_ADMIN_TOKEN": token}
    labels = ServiceProcess("labels party", ["label-party", "serve", "--port", str(port)], env,
                            tmp_path / "lp.log", port=port)  # fmt: skip

    def demo(labels_token: str, features: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "labeldp", "demo", "--quick", "--output", str(tmp_path),
             "--labels-party", labels.url, "--labels-token", labels_token,
             "--features-party", features, "--features-token", "t" * 20],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    with running(labels):
        down = demo(token, "http://127.0.0.1:9")
        assert down.returncode == 1
        assert "the features party at http://127.0.0.1:9 does not answer" in down.stderr
        refused = demo("wrong-" + token, "http://127.0.0.1:9")
        assert refused.returncode == 2  # the command must change (`labeldp --help`)
        assert f"the labels party at {labels.url} answered 401: its token was refused" in (
            refused.stderr
        )
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{labels.url}/v1/datasets", headers=auth).json() == []


def test_half_given_endpoints_are_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "labeldp", "demo", "--labels-party", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "give both" in proc.stderr


@pytest.mark.parametrize("epsilon", ["nan", "inf", "0"])
def test_a_bad_epsilon_is_refused_before_anything_starts(tmp_path: Path, epsilon: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "labeldp", "demo", "--epsilon", epsilon, "--output", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    # "nan" and "inf" are no numbers as JSON spells them; 0 is one, and not > 0.
    refused = "expected a number" if epsilon in ("nan", "inf") else "must be a finite number > 0"
    assert refused in proc.stderr and "--epsilon" in proc.stderr, proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "labeldp", "demo", "--quick", "--output", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    ports: list[int] = []
    deadline = time.monotonic() + 240
    for line in proc.stdout:
        found = re.findall(r"\(:(\d+)\)", line)
        if found:
            ports = [int(p) for p in found]
        if "publisher: feature set" in line or time.monotonic() > deadline:
            break  # both services are up and the story is under way
    assert len(ports) == 2, "the demo did not say where its services listen"
    assert all(_listening(p) for p in ports)
    # What Ctrl-C in a terminal sends, repeated as an impatient user would: pyarrow
    # briefly installs its own SIGINT handler during some reads and loses a signal
    # that arrives then (the operation completes), so one press can go unheard.
    deadline = time.monotonic() + 60
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            os.killpg(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.5)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0
    time.sleep(0.5)
    assert not any(_listening(p) for p in ports)


def test_an_unwritable_output_is_refused_before_the_demo_runs() -> None:
    """Before, the demo ran for a minute and a half, then died in a traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "labeldp", "demo", "--quick", "--output", "/proc/labeldp-demo"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--output /proc/labeldp-demo: cannot write there" in proc.stderr
    assert "Traceback" not in proc.stderr and "starting" not in proc.stdout


def test_an_experiment_on_a_dataset_not_fetched_says_so_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "labeldp", "experiment", "--dataset", "fashion-mnist",
         "--method", "rr", "--epsilon", "1"],
        env={**os.environ, "LABELDP_DATASETS_DIR": str(tmp_path / "empty")},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("labeldp: error:") and "fetch-datasets" in proc.stderr
