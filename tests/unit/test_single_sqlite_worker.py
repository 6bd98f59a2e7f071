"""One worker per SQLite database, for both parties' workers (``shared.worker_loop``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

TOKEN = "worker-lock-admin-token-0123456789"


@pytest.mark.parametrize(
    ("party", "database"),
    [("feature-party", "feature-party.db"), ("label-party", "label_party.sqlite3")],
)
def test_a_second_sqlite_worker_is_refused(tmp_path: Path, party: str, database: str) -> None:
    env = {**os.environ, "LABELDP_DATA_DIR": str(tmp_path), "LABELDP_ADMIN_TOKEN": TOKEN,
           "LABELDP_TRAINING_DEVICE": "cpu"}  # fmt: skip
    env.pop("LABELDP_DATABASE_URL", None)
    command = [sys.executable, "-m", "labeldp", party, "worker"]
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / database).exists():  # migrated: the lock is held
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.1)
        second = subprocess.run([*command, "--once"], env=env, capture_output=True, text=True,
                                timeout=60)  # fmt: skip
        assert second.returncode == 2
        assert "another worker already serves this SQLite database" in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=30)
    assert first.returncode == 0
