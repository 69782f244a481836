"""The stepped clock's barrier over a real nats-server (``libs.bus.steps``)."""

from __future__ import annotations

import asyncio

import pytest

from libs.bus import Bus
from libs.bus.steps import StepController, StepParticipant, StepTimeout, follow_steps
from libs.clock import SteppedClock
from proto.clock import Step


async def _bus(nats_url: str, name: str) -> Bus:
    return await Bus.connect(nats_url, name)


async def test_the_barrier_waits_for_every_participant(nats_url: str) -> None:
    ctl_bus, a_bus, b_bus = [await _bus(nats_url, n) for n in ("ctl", "a", "b")]
    clock_a, clock_b = SteppedClock(epoch=0.0), SteppedClock(epoch=0.0)
    slow_done = asyncio.Event()
    seen: list[tuple[str, float]] = []

    async def quick(step: Step) -> None:
        seen.append(("a", clock_a.now()))

    async def slow(step: Step) -> None:
        if step.round == 0:
            await asyncio.sleep(0.5)  # draining work takes a while
            slow_done.set()
        seen.append(("b", clock_b.now()))

    a = StepParticipant(a_bus, clock_a, "a")
    b = StepParticipant(b_bus, clock_b, "b")
    for p in (a, b):
        await p.start()
    tasks = [asyncio.create_task(a.serve(quick)), asyncio.create_task(b.serve(slow))]
    ctl = StepController(ctl_bus, ["a", "b"], timeout_s=10)
    await ctl.start()
    try:
        step = await ctl.step(100.0)
        assert slow_done.is_set()  # the step returned only after the slow one drained
        assert step.seq == 1 and clock_a.now() == clock_b.now() == 100.0
        assert ("a", 100.0) in seen and ("b", 100.0) in seen
        await ctl.step(250.0)
        assert clock_a.now() == clock_b.now() == 250.0
    finally:
        for t in tasks:
            t.cancel()
        for bus in (ctl_bus, a_bus, b_bus):
            await bus.close()


async def test_a_busy_round_is_probed_again_until_quiet(nats_url: str) -> None:
    """A participant that did work in a round (its count moved) makes the controller probe
    once more: the step ends only after a round in which nothing happened."""
    ctl_bus, a_bus = await _bus(nats_url, "ctl"), await _bus(nats_url, "a")
    a = StepParticipant(a_bus, SteppedClock(epoch=0.0), "a")
    rounds: list[int] = []

    async def work(step: Step) -> None:
        rounds.append(step.round)
        if step.round < 2:
            a.count()  # something came in during rounds 0 and 1

    await a.start()
    task = asyncio.create_task(a.serve(work))
    ctl = StepController(ctl_bus, ["a"], timeout_s=10)
    await ctl.start()
    try:
        done = await ctl.step(5.0)
        assert rounds == [0, 1, 2] and done.round == 2  # counts of rounds 1 and 2 agree: quiet
    finally:
        task.cancel()
        await ctl_bus.close()
        await a_bus.close()


async def test_a_missing_participant_times_out_by_name(nats_url: str) -> None:
    ctl_bus = await _bus(nats_url, "ctl")
    ctl = StepController(ctl_bus, ["ghost"], timeout_s=0.6)
    await ctl.start()
    try:
        with pytest.raises(StepTimeout, match="ghost"):
            await ctl.step(1.0)
    finally:
        await ctl_bus.close()


async def test_a_follower_clock_moves_with_the_steps(nats_url: str) -> None:
    ctl_bus, f_bus = await _bus(nats_url, "ctl"), await _bus(nats_url, "f")
    clock = SteppedClock(epoch=0.0)
    await follow_steps(f_bus, clock)
    a = StepParticipant(f_bus, clock, "f")  # the same process also acks
    await a.start()

    async def nothing(step: Step) -> None:
        return None

    task = asyncio.create_task(a.serve(nothing))
    ctl = StepController(ctl_bus, ["f"], timeout_s=10)
    await ctl.start()
    sleeper = asyncio.create_task(clock.sleep(30))
    try:
        await ctl.step(10.0)
        assert not sleeper.done()
        await ctl.step(40.0)
        await asyncio.wait_for(sleeper, 2)
        assert clock.now() == 40.0
    finally:
        task.cancel()
        await ctl_bus.close()
        await f_bus.close()
