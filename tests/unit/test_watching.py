"""``watch`` rides out a service that stops answering for a while (a restart), and
gives up once the outage outlasts its patience."""

from __future__ import annotations

import pytest

from shared import watching
from shared.cli_errors import ServiceFailedError
from shared.watching import Outage


def test_a_watch_asks_again_through_a_short_outage(capsys: pytest.CaptureFixture[str]) -> None:
    """It gave up at the first connection refused while the job trained on (helper-71)."""
    answers: list[object] = [5, ServiceFailedError("cannot reach x"), ServiceFailedError("503"), 7]

    def fetch() -> int:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, int)
        return answer

    outage = Outage("the job")
    assert outage.ask(fetch, interval=0.0) == 5
    assert outage.ask(fetch, interval=0.0) == 7
    err = capsys.readouterr().err
    assert err.count("asking again") == 1 and "the job goes on" in err


def test_a_watch_gives_up_once_the_outage_outlasts_its_patience(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watching, "OUTAGE_SECONDS", 0.0)
    outage = Outage("the job")
    assert outage.ask(lambda: 1, interval=0.0) == 1

    def fetch() -> int:
        raise ServiceFailedError("cannot reach x")

    with pytest.raises(ServiceFailedError, match="cannot reach x"):
        outage.ask(fetch, interval=0.0)


def test_a_service_that_never_answered_is_not_waited_for() -> None:
    """A wrong URL waited the whole outage, "the job goes on meanwhile" (helper-74)."""

    def fetch() -> int:
        raise ServiceFailedError("cannot reach x")

    with pytest.raises(ServiceFailedError):
        Outage("the job").ask(fetch, interval=0.0)
