"""A service that stops while an LP-MST driver is inside a step: the run reads
``interrupted`` at once and resumes, instead of reading ``running`` until stale."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from sqlalchemy import select

from feature_party.config import Settings
from feature_party.db import Database, migrate
from feature_party.jobs.repository import JobRepository
from feature_party.multistage import service
from feature_party.multistage.driver import Driver, _Superseded
from feature_party.multistage.schemas import MultistageCreate, MultistageResume, RunStatus
from feature_party.orm import Job, MultistageRun
from shared.errors import ServiceError
from tests.feature_party.conftest import add_jobs, seed_inputs
from tests.feature_party.fake_labels_party import TOKEN, FakeLabelsParty, tcp_server

RESUME = MultistageResume(token="t")


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
        resumed = service.prepare_resume(session, run_id, RESUME, active=False)
        assert resumed.status == RunStatus.RUNNING
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


def _interrupted_run(database: Database, settings: Settings) -> tuple[str, str]:
    """(run id, received labels id) of a run stopped before its driver ran a step,
    on a feature set with a received release."""
    feature_set_id, labels_id = seed_inputs(database, settings)
    body = MultistageCreate.model_validate(
        {"feature_set_id": feature_set_id, "labels_party_url": "http://127.0.0.1:9",
         "token": "t", "dataset_id": "d", "epsilon": 1.0}
    )  # fmt: skip
    with database.session() as session:
        run = service.create(session, body)
        run.status = RunStatus.INTERRUPTED
        return run.id, labels_id


def test_a_stage_whose_job_was_cancelled_while_stopped_trains_again_on_resume(
    settings: Settings,
) -> None:
    """Before, the resumed driver waited on the cancelled job, failed the run, and
    only a second resume trained the stage."""
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    run_id, labels_id = _interrupted_run(database, settings)
    with database.session() as session:
        run = session.get(MultistageRun, run_id)
        assert run is not None
        [cancelled] = add_jobs(database, run.feature_set_id, labels_id, 1, epochs=1)
    with database.session() as session:
        assert JobRepository(session).cancel(cancelled)
        run = session.get(MultistageRun, run_id)
        assert run is not None
        run.state = {"partition_plan_id": "p", "stages": [
            {"stage": 1, "part": "lpmst-1", "num_examples": 200, "job_id": cancelled},
            {"stage": 2, "part": "lpmst-2", "num_examples": 300}]}  # fmt: skip
    with database.session() as session:
        service.prepare_resume(session, run_id, RESUME, active=False)
    with database.session() as session:
        run = session.get(MultistageRun, run_id)
        assert run is not None
        first = run.state["stages"][0]
        assert "job_id" not in first and first["failed_jobs"] == [cancelled]
    database.dispose()


def test_a_resume_may_correct_the_training_and_is_checked_first(settings: Settings) -> None:
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    run_id, _ = _interrupted_run(database, settings)
    cnn = MultistageResume.model_validate({"token": "t", "training": {"architecture": "cnn"}})
    with database.session() as session, pytest.raises(ServiceError, match="cnn"):
        service.prepare_resume(session, run_id, cnn, active=False)
    fixed = MultistageResume.model_validate({"token": "t", "training": {"epochs": 2}})
    with database.session() as session:
        service.prepare_resume(session, run_id, fixed, active=False)
    with database.session() as session:
        run = session.get(MultistageRun, run_id)
        assert run is not None and run.status == RunStatus.RUNNING
        assert run.config["training"]["epochs"] == 2
        assert run.config["training"]["task"] == "classification"
    database.dispose()


@pytest.mark.postgres
def test_two_services_resuming_one_run_at_once_start_one_driver(settings: Settings) -> None:
    """Two replicas on one database: the second resume waits on the first's row lock
    and then finds the run running (409). Before, both read it interrupted and
    launched a driver each (on SQLite, whose reads lock nothing, until a locked
    read took the write lock)."""
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    run_id, _ = _interrupted_run(database, settings)
    first_resumed = threading.Event()
    outcomes: dict[str, object] = {}

    def first() -> None:
        with database.session() as session:
            service.prepare_resume(session, run_id, RESUME, active=False)
            first_resumed.set()
            time.sleep(0.5)  # the other replica's resume arrives before this commits
        outcomes["first"] = "resumed"

    def second() -> None:
        first_resumed.wait(10)
        try:
            with database.session() as session:
                service.prepare_resume(session, run_id, RESUME, active=False)
            outcomes["second"] = "resumed"
        except ServiceError as exc:
            outcomes["second"] = exc.code

    threads = [threading.Thread(target=f) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes == {"first": "resumed", "second": "run_not_resumable"}
    database.dispose()


def test_a_cancel_during_a_drivers_last_write_is_not_lost(settings: Settings) -> None:
    """The driver reads its run locked, a ``DELETE`` arrives, the driver commits
    ``succeeded``. On SQLite the cancel answered 200 "cancelled" and the run still
    ended succeeded; it now waits for the driver's commit and answers 409."""
    from feature_party.multistage.driver import Driver

    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    run_id, _ = _interrupted_run(database, settings)
    with database.session() as session:
        session.get(MultistageRun, run_id).status = RunStatus.RUNNING  # type: ignore[union-attr]
    outcome: dict[str, object] = {}

    def cancel() -> None:
        try:
            with database.session() as session:
                outcome["cancel"] = service.cancel(session, run_id).status
        except ServiceError as exc:
            outcome["cancel"] = exc.code

    driver = Driver.__new__(Driver)  # only what _own reads
    driver.run_id, driver.launch = run_id, None
    with database.session() as session:
        run = driver._own(session, take_over=True)
        thread = threading.Thread(target=cancel)
        thread.start()
        thread.join(1.0)  # it waits on the lock, or (before) it had finished
        run.status = RunStatus.SUCCEEDED
    thread.join(30)
    with database.session() as session:
        final = session.get(MultistageRun, run_id)
        assert final is not None and final.status == RunStatus.SUCCEEDED
    assert outcome == {"cancel": "run_finished"}
    database.dispose()


def _driver_of_a_new_run(
    database: Database, settings: Settings, url: str, dataset_id: str, token: str
) -> tuple[Driver, str, str, str]:
    """(driver, run id, feature set id, received labels id): a driver loaded with a
    new run as its ``_run`` would load it, without running a step."""
    feature_set_id, labels_id = seed_inputs(database, settings)
    body = MultistageCreate.model_validate(
        {"feature_set_id": feature_set_id, "labels_party_url": url, "token": token,
         "dataset_id": dataset_id, "epsilon": 1.0}
    )  # fmt: skip
    with database.session() as session:
        run_id = service.create(session, body).id
    driver = Driver(database, settings, run_id, token, threading.Event())
    with database.session() as session:
        run = session.get(MultistageRun, run_id)
        assert run is not None
        driver.run, driver.config, driver.num_classes = run, dict(run.config), 2
        session.expunge(run)
    return driver, run_id, feature_set_id, labels_id


def test_a_run_cancelled_elsewhere_spends_no_further_release(
    settings: Settings, labels_party: FakeLabelsParty
) -> None:
    """A DELETE on another replica commits the cancel, but its wake reaches only that
    replica's drivers: this one checked its in-memory stop, then asked for the
    stage's release and spent its ε after the run read "cancelled"."""
    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    driver, run_id, _, _ = _driver_of_a_new_run(
        database, settings, labels_party.url, labels_party.dataset_id, TOKEN
    )
    with database.session() as session:  # the other replica's DELETE
        service.cancel(session, run_id)
    with pytest.raises(_Superseded):
        driver._release({"stages": [{"stage": 1, "part": "lpmst-1"}]}, 1)
    assert labels_party.spent == 0 and labels_party.releases == {}
    database.dispose()


def test_a_stage_s_job_commits_with_the_run_s_record_of_it(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job committed in a transaction of its own, the run's record of it in the
    next: a crash between them (here: the record fails) left a queued job no run
    listed, which a resume would submit again and a cancel would not find."""
    from feature_party.multistage import driver as driver_module

    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    driver, _, feature_set_id, labels_id = _driver_of_a_new_run(
        database, settings, "http://127.0.0.1:9", "d", "t"
    )

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the service died here")

    monkeypatch.setattr(driver_module, "utcnow", crash)  # the record's first write
    state = {"stages": [{"stage": 1, "part": "lpmst-1", "training_labels_id": labels_id}]}
    with pytest.raises(RuntimeError, match="died here"):
        driver._train(state, 1)
    with database.session() as session:
        jobs = session.scalars(select(Job).where(Job.feature_set_id == feature_set_id)).all()
        assert jobs == []
    database.dispose()


def test_a_stage_s_derived_labels_commit_with_the_run_s_record_of_them(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage's training labels (the union of its releases) committed as a
    received-labels row of their own, the run's record of them in the next
    transaction: a crash between left a row no run named, and a resume made another."""
    import pyarrow as pa

    from feature_party.multistage import driver as driver_module
    from feature_party.orm import ReceivedLabels

    database = Database(settings.resolved_database_url)
    migrate(database.engine)
    driver, run_id, _, labels_id = _driver_of_a_new_run(
        database, settings, "http://127.0.0.1:9", "d", "t"
    )
    with database.session() as session:
        before = session.scalars(select(ReceivedLabels.id)).all()

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the service died here")

    monkeypatch.setattr(driver_module, "utcnow", crash)  # the record's first write
    stages = [{"stage": 1, "received_labels_id": labels_id, "release_id": "r1"},
              {"stage": 2, "received_labels_id": labels_id, "release_id": "r2"}]  # fmt: skip
    labels = pa.table({"example_id": ["a", "b"], "label": [0.0, 1.0]})
    with pytest.raises(RuntimeError, match="died here"):
        driver._store_labels({"stages": stages}, 2, labels, 0)
    with database.session() as session:
        assert session.scalars(select(ReceivedLabels.id)).all() == before
    monkeypatch.undo()
    stage = driver._store_labels({"stages": stages}, 2, labels, 0)
    with database.session() as session:
        run = session.get(MultistageRun, run_id)
        assert run is not None
        assert run.state["stages"][1]["training_labels_id"] == stage["training_labels_id"]
        assert session.get(ReceivedLabels, stage["training_labels_id"]) is not None
    database.dispose()
