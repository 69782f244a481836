"""Node power against a real nats-server (issue 13): the simulated executor, telemetry and the
gateway together. Suspend shows asleep in ``GET /v1/nodes``; wake goes waking → awake after the
boot time; a busy node refuses to suspend; a run for an asleep node is not lost; the placer's
nodewatch does not take an asleep node's silence for a failure."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import pytest

from libs.bus import Bus, ServiceConfig, serve
from libs.clock import Clock
from proto import subjects
from proto.events import Preempted, Started
from proto.nodes import ExecutorReport, TelemetrySample
from proto.views import NodeView
from services.placer.power import send_power_commands
from services.telemetry.service import main as telemetry_main
from tests.services.test_executor import FACTOR, T4, Harness, _start
from tests.services.test_gateway import gateway, until
from tests.services.test_placer_power import _Watch

BOOT_S = 1500.0  # Mosaic seconds: 1.5 wall seconds at FACTOR
INTERVAL_S = 0.2  # wall seconds between reports
NODE = T4.id


class Stack:
    def __init__(self, bus: Bus, h: Harness, base: str, http: aiohttp.ClientSession) -> None:
        self.bus, self.h, self.base, self.http = bus, h, base, http
        self.reports: list[ExecutorReport] = []
        self.samples: list[TelemetrySample] = []

    async def view(self) -> NodeView | None:
        async with self.http.get(f"{self.base}/v1/nodes") as r:
            views = msgspec.json.decode(await r.read(), type=dict[str, list[NodeView]])["nodes"]
        return next((v for v in views if v.spec.id == NODE), None)

    async def power_is(self, state: str) -> NodeView:
        async def check() -> NodeView | None:
            v = await self.view()
            return v if v is not None and v.power.state == state else None

        return await until(check, f"{NODE} shown {state}")

    async def command(self, action: str) -> None:
        suspend, wake = ([NODE], []) if action == "suspend" else ([], [NODE])
        await send_power_commands(self.bus, suspend, wake, time.time(), "test")


async def _telemetry(nats_url: str) -> tuple[asyncio.Task[int], asyncio.Event]:
    stop = asyncio.Event()
    args = argparse.Namespace(
        backend="sim",
        node_spec=[msgspec.json.encode(T4).decode()],
        node_id=None,
        interval_s=INTERVAL_S,
        seed=0,
        hot=[],
    )
    task = asyncio.create_task(
        serve(
            "telemetry",
            telemetry_main,
            ServiceConfig(nats_url=nats_url, log_format="json", log_level="warning"),
            args=args,
            stop=stop,
            install_signals=False,
            clock=Clock(epoch=time.time(), factor=FACTOR),
        )
    )
    return task, stop


@pytest.fixture
async def stack(nats_url: str, tmp_path: Path, http: aiohttp.ClientSession) -> AsyncIterator[Stack]:
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    h = Harness(bus)
    await h.collect()
    ex_task, ex_stop = await _start(
        nats_url, "sim", tmp_path, report_interval=INTERVAL_S, boot_s=BOOT_S
    )
    tel_task, tel_stop = await _telemetry(nats_url)
    async with gateway(nats_url) as base:
        s = Stack(bus, h, base, http)

        async def on_report(r: ExecutorReport) -> None:
            s.reports.append(r)

        async def on_sample(t: TelemetrySample) -> None:
            s.samples.append(t)

        await bus.subscribe(subjects.executor_report(NODE), ExecutorReport, on_report)
        await bus.subscribe(subjects.telemetry(NODE), TelemetrySample, on_sample)
        await s.power_is("awake")
        s.executor_stop = ex_stop  # type: ignore[attr-defined]
        yield s
    for stop in (ex_stop, tel_stop):
        stop.set()
    assert await asyncio.wait_for(ex_task, 15) == 0
    assert await asyncio.wait_for(tel_task, 15) == 0
    await bus.close()


async def test_suspend_shows_asleep_and_wake_boots_for_the_boot_time(stack: Stack) -> None:
    await stack.command("suspend")
    asleep = await stack.power_is("asleep")
    assert asleep.power.refused is None

    async def asleep_sample() -> bool:
        return any(t.asleep and all(g.power_w == 0 for g in t.gpus) for t in stack.samples)

    await until(asleep_sample, "telemetry flags the asleep node's samples")
    await stack.command("wake")
    waking = await stack.power_is("waking")
    assert waking.power.ready_at == pytest.approx(waking.power.since + BOOT_S)
    t0 = time.monotonic()
    awake = await stack.power_is("awake")
    assert time.monotonic() - t0 > 0.5 * BOOT_S / FACTOR  # it took the boot time
    assert awake.power.since == pytest.approx(waking.power.ready_at)


async def test_suspend_of_a_busy_node_is_refused(stack: Stack) -> None:
    await stack.h.run("busy", runtime_s=60_000)
    await stack.h.wait("busy", 1)
    await stack.command("suspend")

    async def refused() -> NodeView | None:
        v = await stack.view()
        return v if v is not None and v.power.refused is not None else None

    v = await until(refused, "the refusal in the node's power state")
    assert v.power.state == "awake"
    assert v.power.refused.action == "suspend"
    assert v.power.refused.reason == "busy: busy"  # names what runs


async def test_a_run_for_an_asleep_node_is_preempted_not_lost(stack: Stack) -> None:
    await stack.command("suspend")
    await stack.power_is("asleep")
    await stack.h.run("late", runtime_s=100)
    (ev,) = await stack.h.wait("late", 1)
    assert isinstance(ev, Preempted) and ev.attempt == 1  # queued again by the placer
    assert "asleep" in ev.reason
    await stack.command("wake")
    await stack.power_is("awake")
    await stack.h.run("late", runtime_s=100)  # the same attempt again (a redelivery)
    await asyncio.sleep(0.5)
    assert not any(isinstance(e, Started) for e in stack.h.of("late"))  # tombstoned
    await stack.h.run("late", runtime_s=100, attempt=2)  # the requeued attempt runs
    events = await stack.h.wait("late", 3)
    assert isinstance(events[1], Started) and events[1].attempt == 2


async def test_nodewatch_does_not_mark_a_silent_asleep_node_down(stack: Stack) -> None:
    watch = _Watch()
    watch.nodes = {NODE: T4}
    watch.clock = Clock(epoch=time.time(), factor=FACTOR)

    async def on_report(r: ExecutorReport) -> None:
        await watch._on_report(r)

    await stack.bus.subscribe(subjects.executor_report(NODE), ExecutorReport, on_report)
    await stack.command("suspend")
    await stack.power_is("asleep")
    await until(lambda: _async(watch.node_power.state(NODE) == "asleep"), "placer fold")
    stack.executor_stop.set()  # type: ignore[attr-defined]  # the node goes silent
    await asyncio.sleep(6 * INTERVAL_S)  # twice the down threshold
    assert watch.reconciler.reports > 0
    assert NODE not in watch.down_nodes()


async def _async(value: bool) -> bool:
    return value
