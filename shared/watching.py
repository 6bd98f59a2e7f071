"""``watch`` commands: the hint, said once, that queued work has no worker, and
riding out a service that stops answering for a while."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TypeVar

from shared.cli_errors import ServiceFailedError

T = TypeVar("T")

#: How long ``watch`` keeps asking a service that does not answer (a restart, a
#: failover) before it gives up; the work goes on either way.
OUTAGE_SECONDS = 120.0

#: ``watch`` says once that nothing has picked the work up after this long.
QUEUED_HINT_SECONDS = 30.0


class QueuedHint:
    """Says ``message`` once, on stderr, when the watched work is still ``queued``
    :data:`QUEUED_HINT_SECONDS` after the watch began: a queue that no worker
    reads looked the same as a slow one, and ``watch`` waited in silence."""

    def __init__(self, message: str) -> None:
        self.message, self.started, self.said = message, time.monotonic(), False

    def saw(self, status: str) -> None:
        waited = time.monotonic() - self.started
        if status == "queued" and not self.said and waited >= QUEUED_HINT_SECONDS:
            print(self.message, file=sys.stderr, flush=True)
            self.said = True


class Outage:
    """Asks again while a service that has answered stops answering (unreachable,
    5xx, 429), for up to :data:`OUTAGE_SECONDS` in a row, saying so once on stderr: ``watch``
    gave up on a restart of a few seconds while the job trained on (helper-71)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None
        #: Only a service that has answered is waited for: a wrong URL is not an outage.
        self.answered = False

    def ask(self, fetch: Callable[[], T], interval: float) -> T:
        while True:
            try:
                answer = fetch()
            except ServiceFailedError as exc:
                if not self.answered:
                    raise
                now = time.monotonic()
                if self.since is None:
                    self.since = now
                    note = f"{exc}; asking again for up to {OUTAGE_SECONDS:g} s"
                    print(f"{note} ({self.what} goes on meanwhile)", file=sys.stderr, flush=True)
                elif now - self.since > OUTAGE_SECONDS:
                    raise
                time.sleep(max(interval, 1.0))
                continue
            self.since, self.answered = None, True
            return answer
