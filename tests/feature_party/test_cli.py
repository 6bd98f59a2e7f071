"""The command line: one worker per SQLite database; the progress bar; client bodies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from feature_party.cli import progress_line
from tests.feature_party.conftest import ADMIN


def test_progress_line() -> None:
    job = {
        "status": "running",
        "progress": {
            "epoch": 2,
            "epochs": 4,
            "step": 5,
            "steps_per_epoch": 10,
            "loss": 0.25,
            "eta_seconds": 75.0,
        },
    }
    line = progress_line(job, width=20)
    assert line.startswith("[#######-------------]  37.5%")
    assert "epoch 2/4 step 5/10" in line and "loss 0.25" in line and "ETA 1:15" in line
    assert "100.0%" in progress_line({"status": "succeeded", "progress": None})


def test_a_client_command_without_the_admin_token_says_which_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LABELDP_ADMIN_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "labeldp", "feature-party", "jobs", "get", "some-job"],
        env={**env, "LABELDP_MODE": "production"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "LABELDP_ADMIN_TOKEN is not set" in done.stderr
    assert "authenticates to the features party" in done.stderr


def test_serve_checks_its_admin_token_before_it_touches_the_database(tmp_path: Path) -> None:
    """It migrated (created) the database, then refused the token: a misconfigured
    container still upgraded a shared schema (helper-73)."""
    from labeldp.cli import main

    env = {"LABELDP_DATA_DIR": str(tmp_path / "fp"), "LABELDP_ADMIN_TOKEN": "short"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        patch.delenv("LABELDP_DATABASE_URL", raising=False)
        assert main(["feature-party", "serve", "--port", "1"]) == 2
    assert not (tmp_path / "fp" / "feature-party.db").exists()


def test_a_client_command_ignores_the_service_s_settings_and_never_prints_the_token() -> None:
    """A worker-only setting out of range failed every client command with pydantic's
    dump of all settings, the admin token's first characters included."""
    env = {**os.environ, "LABELDP_ADMIN_TOKEN": ADMIN, "LABELDP_HEARTBEAT_SECONDS": "100"}
    done = subprocess.run(
        [sys.executable, "-m", "labeldp", "feature-party", "jobs", "get", "some-job",
         "--url", "http://127.0.0.1:9"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # Nothing answered: the service's failure, not the command's (exit status 1).
    assert done.returncode == 1 and "cannot reach http://127.0.0.1:9" in done.stderr
    assert ADMIN[:8] not in done.stderr + done.stdout
    # A URL no request can go to is the command's to change (it was 1, "try later").
    done = subprocess.run(
        [sys.executable, "-m", "labeldp", "feature-party", "jobs", "get", "some-job",
         "--url", "notaurl"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "give http://… or https://…" in done.stderr, done.stderr


def test_multistage_options_are_checked_before_any_request(tmp_path: Path) -> None:
    env = {**os.environ, "LABELDP_ADMIN_TOKEN": ADMIN, "LABELDP_LABELS_PARTY_TOKEN": "t" * 32}
    base = [sys.executable, "-m", "labeldp", "feature-party", "multistage", "start",
            "--url", "http://127.0.0.1:9", "--feature-set", "f", "--labels-party-url",
            "http://127.0.0.1:9", "--dataset", "d"]  # fmt: skip
    cases = [
        (["--epsilon", "nan"], "--epsilon: expected a number such as 1 or 0.5, got 'nan'"),
        (["--epsilon", "1", "--temperature", "inf"], "--temperature must be a finite number"),
        (["--epsilon", "1", "--training", "[1]"], "--training must be a JSON object"),
    ]
    for extra, message in cases:
        done = subprocess.run([*base, *extra], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr


def test_labels_receive_sends_the_api_s_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mechanism parameters go beside ``name`` (DESIGN.md §6), as the API reads them;
    a free fetch carries no release options."""
    import argparse

    from feature_party.cli_client import receive_body
    from shared.cli_errors import CommandError

    monkeypatch.setenv("LABELDP_LABELS_PARTY_TOKEN", "lp-token")
    where = {"feature_set": "fs", "labels_party_url": "http://lp", "dataset": "ds"}
    new = {"mechanism": "rr-on-bins", "params": '{"mesh": 50}', "epsilon": 1.0,
           "prior_epsilon": 0.1, "parts": "a, b", "idempotency_key": "k"}  # fmt: skip
    base = {**where, "release": None, **new}
    body = receive_body(argparse.Namespace(**base))
    assert body["release"] == {"mechanism": {"name": "rr-on-bins", "mesh": 50}, "epsilon": 1.0,
                               "prior_epsilon": 0.1, "parts": ["a", "b"],
                               "idempotency_key": "k"}  # fmt: skip
    assert body["token"] == "lp-token" and "release_id" not in body
    with pytest.raises(CommandError, match="the name is --mechanism"):
        receive_body(argparse.Namespace(**{**base, "params": '{"name": "rr"}'}))
    free = {**where, "release": "r1", **dict.fromkeys(new)}
    assert receive_body(argparse.Namespace(**free))["release_id"] == "r1"
    with pytest.raises(CommandError, match="finite"):
        receive_body(argparse.Namespace(**{**base, "epsilon": float("nan")}))


@pytest.mark.parametrize(
    ("party", "lease", "heartbeat"),
    [
        ("feature-party", "LABELDP_JOB_LEASE_SECONDS", "LABELDP_HEARTBEAT_SECONDS"),
        ("label-party", "LABELDP_WORKER_LEASE_SECONDS", "LABELDP_WORKER_HEARTBEAT_SECONDS"),
    ],
)
def test_a_worker_whose_heartbeat_cannot_keep_its_lease_does_not_start(
    tmp_path: Path, party: str, lease: str, heartbeat: str
) -> None:
    """A heartbeat of 30 s on an 8 s lease: every run bounced between two workers
    until it failed (a labels-party training, its ε spent). One line, exit 2."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABELDP_")}
    env |= {"LABELDP_DATA_DIR": str(tmp_path), lease: "8", heartbeat: "30"}
    done = subprocess.run([sys.executable, "-m", "labeldp", party, "worker"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"{heartbeat} (30) must be at most half of {lease} (8)" in done.stderr
    assert "Traceback" not in done.stderr
    assert not any(tmp_path.iterdir())  # refused before touching anything


def test_python_m_feature_party_prints_usage_lines_that_run() -> None:
    """Its usage lines said ``python -m feature_party feature-party serve …``, a
    command that fails (invalid choice)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for args in (["--help"], ["jobs", "get", "--help"]):
        usage = subprocess.run(
            [sys.executable, "-m", "feature_party", *args],
            capture_output=True, text=True, check=True, env=env,
        ).stdout.splitlines()[0]  # fmt: skip
        assert usage.startswith(" ".join(["usage: python -m feature_party", *args[:-1]]))
        assert "feature-party" not in usage, usage
