"""The stepped clock (issue 13, part 8): time moves only when a controller steps it."""

from __future__ import annotations

import asyncio

import pytest

from libs.clock import Clock, SteppedClock


def test_env_selects_the_stepped_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOSAIC_CLOCK_MODE", "stepped")
    monkeypatch.setenv("MOSAIC_CLOCK_EPOCH", "1000")
    clock = Clock.from_env()
    assert isinstance(clock, SteppedClock) and clock.stepped
    assert clock.now() == 1000.0
    assert clock.env()["MOSAIC_CLOCK_MODE"] == "stepped"  # children share the mode
    monkeypatch.setenv("MOSAIC_CLOCK_MODE", "warp")
    with pytest.raises(ValueError, match="MOSAIC_CLOCK_MODE"):
        Clock.from_env()


def test_the_clock_follows_steps_forward_only() -> None:
    clock = SteppedClock(epoch=0.0)
    assert clock.advance(1, 10.0) and clock.now() == 10.0
    assert not clock.advance(1, 99.0)  # a repeat (the barrier re-sends) changes nothing
    assert not clock.advance(0, 5.0)
    assert clock.advance(2, 25.0) and clock.now() == 25.0 and clock.seq == 2


async def test_sleep_wakes_at_the_first_step_that_reaches_it() -> None:
    clock = SteppedClock(epoch=0.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, s: float) -> None:
        await clock.sleep(s)
        woke.append((name, clock.now()))

    tasks = [asyncio.create_task(sleeper("a", 10)), asyncio.create_task(sleeper("b", 30))]
    await asyncio.sleep(0)
    assert clock.next_deadline() == 10
    clock.advance(1, 5.0)
    await asyncio.sleep(0)
    assert woke == []
    clock.advance(2, 12.0)  # past a's deadline (10): a wakes at this step
    await asyncio.sleep(0)
    assert woke == [("a", 12.0)]
    clock.advance(3, 30.0)
    await asyncio.gather(*tasks)
    assert woke == [("a", 12.0), ("b", 30.0)]
    assert clock.next_deadline() is None


async def test_a_cancelled_sleep_leaves_no_waiter() -> None:
    clock = SteppedClock(epoch=0.0)
    task = asyncio.create_task(clock.sleep(5))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.next_deadline() is None
