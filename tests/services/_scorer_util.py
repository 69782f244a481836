"""Helpers shared by the scorer and placer tests: run a service in-process, publish lifecycle
events the way the gateway does, read the lifecycle stream back, poll with a deadline."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.js import api

from libs.bus import Bus, ServiceConfig, serve
from libs.clock import Clock
from proto import subjects
from proto.events import LifecycleEvent, Submitted
from proto.jobs import JobSpec
from proto.nodes import NodeSpec


async def poll(
    check: Callable[[], Awaitable[Any]], *, timeout_s: float = 15.0, every_s: float = 0.05
) -> Any:
    """Call ``check`` until it returns something truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s} s (last value: {last!r})")


@dataclass
class InProcess:
    """A service running in this event loop through the real runtime shell (``serve``)."""

    task: asyncio.Task[int]
    stop: asyncio.Event

    async def close(self) -> int:
        self.stop.set()
        try:
            return await asyncio.wait_for(self.task, timeout=15)
        except TimeoutError:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            return -1


def start_in_process(
    name: str, main: Any, url: str, *, clock: Clock | None = None, **args: Any
) -> InProcess:
    """``main`` served in this event loop with ``args`` as its command line (``clock``: the
    service's clock, e.g. a ``SteppedClock``; default the environment's)."""
    stop = asyncio.Event()
    cfg = ServiceConfig(nats_url=url, log_format="json", log_level="warning")
    namespace = argparse.Namespace(**args)
    task = asyncio.create_task(
        serve(name, main, cfg, args=namespace, stop=stop, install_signals=False, clock=clock)
    )
    return InProcess(task, stop)


async def connect(url: str, name: str = "test") -> Bus:
    bus = await Bus.connect(url, name)
    await bus.ensure_topology()
    return bus


async def put_nodes(bus: Bus, nodes: list[NodeSpec]) -> None:
    kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    for n in nodes:
        await kv.put(n.id, n)


async def submit(bus: Bus, spec: JobSpec, now: float | None = None) -> None:
    """What the gateway does for a valid submission (the lifecycle half the services read)."""
    now = time.time() if now is None else now
    spec = msgspec.structs.replace(spec, submit_time=spec.submit_time or now)
    await bus.publish(subjects.SUBJECT_SUBMIT, spec, msg_id=spec.id)
    ev = Submitted(job_id=spec.id, time=now, spec=spec)
    await bus.publish(subjects.lifecycle(spec.id), ev, msg_id=f"submitted-{spec.id}")


async def lifecycle_events(bus: Bus) -> list[LifecycleEvent]:
    """Every event in the LIFECYCLE stream, in stream order."""
    info = await bus.js.stream_info(subjects.STREAM_LIFECYCLE)
    last = info.state.last_seq
    out: list[LifecycleEvent] = []
    if last == 0:
        return out
    cfg = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL, inactive_threshold=30.0)
    sub = await bus.js.pull_subscribe(
        f"{subjects.LIFECYCLE_PREFIX}.>", stream=subjects.STREAM_LIFECYCLE, config=cfg
    )
    decoder = msgspec.json.Decoder(LifecycleEvent)
    try:
        while True:
            msgs = await sub.fetch(256, timeout=2.0)
            for m in msgs:
                out.append(decoder.decode(m.data))
                await m.ack()
                if m.metadata.sequence.stream >= last:
                    return out
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def by_job(events: list[LifecycleEvent]) -> dict[str, list[LifecycleEvent]]:
    out: dict[str, list[LifecycleEvent]] = {}
    for ev in events:
        out.setdefault(ev.job_id, []).append(ev)
    return out
