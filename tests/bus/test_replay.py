"""wait_caught_up with poison messages in the stream: dead letters do not hold a replay up."""

from __future__ import annotations

import asyncio

from libs.bus import Bus
from libs.bus.replay import wait_caught_up
from proto import subjects
from proto.events import Completed, LifecycleEvent, Started


async def test_replay_catches_up_past_garbage_and_a_poison_message(bus: Bus) -> None:
    seen: list[str] = []

    async def handler(ev: LifecycleEvent) -> None:
        if ev.job_id == "poison":
            raise RuntimeError("always")
        seen.append(ev.job_id)

    await bus.publish("lifecycle.a", Started(job_id="a", time=1.0))
    await bus.js.publish("lifecycle.x", b"[" * 100_000)
    await bus.publish("lifecycle.poison", Completed(job_id="poison", time=2.0))
    await bus.publish("lifecycle.b", Completed(job_id="b", time=3.0))
    consumer = await bus.consume(
        subjects.STREAM_LIFECYCLE,
        "lifecycle.>",
        LifecycleEvent,
        handler,
        durable="replay",
        max_deliver=2,
        retry_delay_s=0.01,
    )
    assert await wait_caught_up(bus, consumer, subjects.STREAM_LIFECYCLE, timeout_s=20)
    assert seen == ["a", "b"]


async def test_replay_gives_up_at_once_when_the_loop_is_gone(bus: Bus) -> None:
    async def handler(ev: LifecycleEvent) -> None:
        return None

    await bus.publish("lifecycle.a", Started(job_id="a", time=1.0))
    consumer = await bus.consume(
        subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, handler, deliver_all=False
    )
    consumer.task.cancel()
    # it would poll for an hour; gone, the loop is reported at once (10 s is only a guard)
    waiting = wait_caught_up(bus, consumer, subjects.STREAM_LIFECYCLE, timeout_s=3600)
    assert not await asyncio.wait_for(waiting, 10)
