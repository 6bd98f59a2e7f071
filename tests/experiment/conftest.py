"""One set of real services (both parties and a worker on 127.0.0.1) for every
experiment test that needs them, started once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from labeldp.harness import Endpoints, local_services


@pytest.fixture(scope="session")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    with local_services(tmp_path_factory.mktemp("services"), say=print) as running:
        yield running
