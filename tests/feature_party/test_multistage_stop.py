"""A service that stops while an LP-MST driver is inside a step: the run reads
``interrupted`` at once and resumes, instead of reading ``running`` until stale."""

from __future__ import annotations

import socket
import threading
import time

from feature_party.config import Settings
from feature_party.db import Database, migrate
from feature_party.multistage import service
from feature_party.multistage.schemas import MultistageCreate, RunStatus
from feature_party.orm import MultistageRun
from tests.feature_party.conftest import seed_inputs
from tests.feature_party.fake_labels_party import tcp_server


def _hang(conn: socket.socket, stop: threading.Event) -> None:
    """Accept the request and never answer (a labels party stuck in a release)."""
    stop.wait()
    conn.close()


def _launched(database: Database, settings: Settings, drivers: service.Drivers, url: str) -> str:
    """A run against the labels party at ``url``, its driver started; its id."""
    feature_set_id, _ = seed_inputs(database, settings)
    body = MultistageCreate.model_validate(
        {"feature_set_id": feature_set_id, "labels_party_url": url, "token": "t",
         "dataset_id": "d", "epsilon": 1.0}
    )  # fmt: skip
    with database.session() as session:
        run_id = service.create(session, body).id
    drivers.launch(run_id, "t")
    return run_id


def _run_status(database: Database, run_id: str, drivers: service.Drivers) -> tuple[str, str]:
    with database.session() as session:
        read = service.get(session, run_id, active=drivers.is_active(run_id))
        return read.status, read.error or ""


def test_a_driver_stuck_in_a_step_is_marked_interrupted_and_resumes(settings: Settings) -> None:
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    drivers = service.Drivers(database, settings)
    with tcp_server(_hang) as url:
        run_id = _launched(database, settings, drivers, url)
        drivers.stop_all(timeout=0.5)
        assert drivers.is_active(run_id), "the driver should still wait on its request"
        status, error = _run_status(database, run_id, drivers)
        assert status == RunStatus.INTERRUPTED and "idempotency key" in error
    # The hanging server closed: the driver's request fails, which must not turn
    # the interruption into a failure.
    drivers.stop_all(timeout=30)
    assert not drivers.is_active(run_id)
    status, error = _run_status(database, run_id, drivers)
    assert status == RunStatus.INTERRUPTED and "resume with the token" in error
    with database.session() as session:
        assert service.prepare_resume(session, run_id, active=False).status == RunStatus.RUNNING
    database.dispose()


def test_a_driver_whose_run_was_resumed_elsewhere_writes_nothing_more(settings: Settings) -> None:
    """Stopped mid-step, marked interrupted and resumed by another service (another
    replica on the same database) while this driver's request still hangs: when it
    ends, this driver must neither mark the new owner's run interrupted nor save its
    own state over the new owner's."""
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    drivers = service.Drivers(database, settings)
    with tcp_server(_hang) as url:
        run_id = _launched(database, settings, drivers, url)
        deadline = time.monotonic() + 10
        while _driver_mark(database, run_id) is None:  # the driver took the run
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with database.session() as session:  # another service resumes it
            run = session.get(MultistageRun, run_id)
            assert run is not None
            run.state = {**run.state, "driver": "another-service"}
        drivers.stop_all(timeout=0.5)
        status, _ = _run_status(database, run_id, drivers)
        assert status == RunStatus.RUNNING  # the new owner's, not marked by this one
    drivers.stop_all(timeout=30)  # the hanging request fails; the driver ends
    assert not drivers.is_active(run_id)
    with database.session() as session:
        run = session.get(MultistageRun, run_id)
        assert run is not None
        assert (run.status, run.state["driver"]) == (RunStatus.RUNNING, "another-service")
    database.dispose()


def _driver_mark(database: Database, run_id: str) -> str | None:
    with database.session() as session:
        run = session.get(MultistageRun, run_id)
        return None if run is None else run.state.get("driver")
