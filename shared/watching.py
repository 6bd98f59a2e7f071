"""``watch`` commands: the hint, said once, that queued work has no worker."""

from __future__ import annotations

import sys
import time

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
