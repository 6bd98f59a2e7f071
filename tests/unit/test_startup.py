"""Start-up checks: the data directory's hold when processes start at once; an
in-memory database and a misspelled ``LABELDP_*`` variable are refused."""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shared.startup import (
    KNOWN_VARIABLES,
    StartupError,
    check_variable_names,
    open_database,
    prepare_data_dir,
)


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


#: A ``LABELDP_*`` name as spelled in a file (not ``LABELDP_TEST_{name}``, a pattern).
_SPELLED = re.compile(r"LABELDP_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_{])")


def _spelled_in_sources() -> set[str]:
    root = Path(__file__).resolve().parents[2]
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.split()  # fmt: skip
    names: set[str] = set()
    for name in tracked:
        if (
            name != "shared/startup.py"
            and not name.startswith("tests/")
            and (root / name).is_file()
        ):
            names |= set(_SPELLED.findall((root / name).read_text(errors="replace")))
    return names


def test_the_known_variables_are_the_settings_and_what_the_sources_read() -> None:
    """The registry is kept by hand (neither party imports the other): a setting
    added to a party and not here would stop that party from starting; a name left
    here after its setting went would pass a typo."""
    from feature_party.config import Settings as FeaturePartySettings
    from label_party.config import WorkerSettings
    from shared.settings_help import environment_names

    settings = {*environment_names(WorkerSettings), *environment_names(FeaturePartySettings)}
    # operations.md shows this misspelling refused.
    spelled = _spelled_in_sources() - {"LABELDP_MAX_CONCURENT_REQUESTS"}
    assert settings <= KNOWN_VARIABLES
    assert spelled - KNOWN_VARIABLES == set()
    assert KNOWN_VARIABLES - spelled == set()


def test_a_misspelled_setting_is_refused_and_the_right_name_suggested() -> None:
    with pytest.raises(StartupError) as refused:
        check_variable_names({"LABELDP_MAX_CONCURENT_REQUESTS": "5", "HOME": "/root"})
    assert str(refused.value) == (
        "LABELDP_MAX_CONCURENT_REQUESTS is not a labeldp setting: did you mean "
        "LABELDP_MAX_CONCURRENT_REQUESTS?"
    )
    with pytest.raises(StartupError, match=r"labeldp_colour is not .*serve --help"):
        check_variable_names({"labeldp_colour": "blue"})  # read case-blind, checked so


def test_every_setting_of_either_party_passes() -> None:
    """One environment may serve both parties (the demo, one ``.env``)."""
    check_variable_names(dict.fromkeys(KNOWN_VARIABLES, "1") | {"labeldp_mode": "dev"})
