"""Start-up checks of the data directory hold when processes start at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shared.startup import StartupError, open_database, prepare_data_dir


def test_processes_checking_one_data_directory_at_once_all_pass(tmp_path: Path) -> None:
    """Two workers started together failed ("not a writable directory: No such file")
    when they shared one probe file: one's unlink came before the other's."""

    def check(_: int) -> None:
        for _ in range(200):
            prepare_data_dir(tmp_path / "data")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(check, range(8)))  # re-raises a StartupError
    assert list((tmp_path / "data").iterdir()) == []  # no probe left behind


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_sqlite_database_is_refused_at_start(url: str) -> None:
    """Each connection had its own empty database: the service started, and then
    answered every request 503 (helper-73)."""
    from feature_party.db import make_engine, migrate

    with pytest.raises(StartupError, match="in-memory"):
        open_database(url, make_engine, migrate)
