"""The worker loop outlives an item whose end could not be recorded."""

from __future__ import annotations

import logging

import pytest

from shared.worker_loop import PollingWorker


class _DiskFull(PollingWorker):
    """Two items; recording the first one's end fails as a full SQLite disk does."""

    def __init__(self) -> None:
        super().__init__(worker_id="w", poll_seconds=0.01)
        self.queue, self.done = ["a", "b"], []

    def claim(self) -> str | None:
        return self.queue.pop(0) if self.queue else None

    def run_item(self, item_id: str) -> None:
        if item_id == "a":
            raise OSError(28, "database or disk is full")
        self.done.append(item_id)


def test_a_failure_to_record_an_end_does_not_stop_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It crashed the features-party worker: the item's lease runs out and it is
    claimed again, while this worker goes on with the next."""
    worker = _DiskFull()
    with caplog.at_level(logging.ERROR):
        assert worker.run(once=True) == 2
    assert worker.done == ["b"]
    assert "could not record how it ended" in caplog.text
