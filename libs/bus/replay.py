"""Wait until a stream consumer has handled everything the stream held when we started.

Why: services that rebuild a read model by replaying a stream from the start (the placer, the
scorer) must not act before the replay is done: the placer could place a job that already ended,
the scorer re-announce jobs that already ran. The consumer's ack floor passing the stream's last
sequence (read at start) is the proof. A message the consumer dead-lettered (undecodable, or
failing ``max_deliver`` times) is terminated, which moves the ack floor like an ack: a poison
message delays the replay by its retries, it cannot hold it up for good.
"""

from __future__ import annotations

import asyncio
import time

from libs.bus.connection import Bus, Consumer


async def wait_caught_up(
    bus: Bus, consumer: Consumer, stream: str, *, timeout_s: float = 60.0, poll_s: float = 0.05
) -> bool:
    """True once every message up to the stream's current last sequence is acked by
    ``consumer``; False after ``timeout_s`` (the caller logs and goes on), or at once when the
    consumer's loop has ended (it would never catch up; its health check already says why)."""
    info = await bus.js.stream_info(stream)
    target = info.state.last_seq
    if target == 0:
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if consumer.task.done():
            return False
        ci = await consumer.sub.consumer_info()
        if ci.ack_floor is not None and (ci.ack_floor.stream_seq or 0) >= target:
            return True
        await asyncio.sleep(poll_s)
    return False
