"""shared.keyed_locks: one holder a key at a time, and no key kept once unused."""

from __future__ import annotations

import asyncio

from shared.keyed_locks import KeyedLocks


def test_one_holder_a_key_others_free_and_nothing_kept() -> None:
    async def scenario() -> list[str]:
        locks, events = KeyedLocks(), []

        async def hold(key: str, name: str, seconds: float) -> None:
            async with locks.hold(key):
                events.append(f"{name} in")
                await asyncio.sleep(seconds)
                events.append(f"{name} out")

        first = asyncio.create_task(hold("a", "a1", 0.05))
        await asyncio.sleep(0)  # a1 holds "a"
        second = asyncio.create_task(hold("a", "a2", 0))
        other = asyncio.create_task(hold("b", "b1", 0))
        cancelled = asyncio.create_task(hold("a", "a3", 0))
        await asyncio.sleep(0.01)
        assert len(locks) == 1  # "a", held and awaited; "b", done, is dropped
        cancelled.cancel()  # a waiter that gives up leaves no trace
        await asyncio.gather(first, second, other, cancelled, return_exceptions=True)
        assert len(locks) == 0
        return events

    events = asyncio.run(scenario())
    assert events.index("b1 out") < events.index("a1 out")  # another key does not wait
    assert events.index("a1 out") < events.index("a2 in")  # the same key does
    assert "a3 in" not in events
