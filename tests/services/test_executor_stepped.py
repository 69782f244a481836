"""The simulated executor on the stepped clock (issue 13, part 8): a job ending at t ends at the
first step at or after t, reported with time t, before the step's barrier lets go; a boot ends
at its ``ready_at`` the same way; a checkpoint's cost ends the same way (issue 14)."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from libs.bus import Bus, ServiceConfig, serve
from libs.bus.steps import StepController
from libs.clock import SteppedClock
from proto import subjects
from proto.events import Checkpointed, Completed, Preempted, Started
from proto.nodes import ExecutorReport
from services.executor.service import main
from services.placer.power import send_power_commands
from tests.runtime._jobs import checkpoint
from tests.services.test_executor import T4, Harness


@pytest.fixture
async def stepped(nats_url: str, tmp_path: Path) -> AsyncIterator[tuple[Harness, StepController]]:
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    h = Harness(bus)
    await h.collect()
    stop = asyncio.Event()
    args = argparse.Namespace(
        mode="sim",
        node_spec=[msgspec.json.encode(T4).decode()],
        log_dir=str(tmp_path / "logs"),
        report_interval=0.2,
        boot_s=300.0,
        step_name="executor",
    )
    task = asyncio.create_task(
        serve(
            "executor",
            main,
            ServiceConfig(nats_url=nats_url, log_format="json", log_level="warning"),
            args=args,
            stop=stop,
            install_signals=False,
            clock=SteppedClock(epoch=0.0),
        )
    )
    ctl = StepController(bus, ["executor"], timeout_s=10)
    await ctl.start()
    await ctl.step(0.0)  # the executor is up and acking
    yield h, ctl
    stop.set()
    assert await asyncio.wait_for(task, 15) == 0
    await bus.close()


async def test_a_sim_job_ends_at_its_time_within_the_step_that_reaches_it(
    stepped: tuple[Harness, StepController],
) -> None:
    h, ctl = stepped
    await ctl.step(10.0)
    await h.run("j", runtime_s=100.0)
    await ctl.step(10.0)  # drain at the same time: the run is handled at t=10
    started = h.of("j")
    assert len(started) == 1 and isinstance(started[0], Started) and started[0].time == 10.0
    await ctl.step(105.0)  # before its end (110): nothing
    await asyncio.sleep(0.1)
    assert len(h.of("j")) == 1
    await ctl.step(150.0)  # the first step past 110
    await h.wait("j", 2, timeout_s=2)  # published before the barrier let go (read back here)
    done = h.of("j")[1]
    assert isinstance(done, Completed)
    assert done.time == 110.0 and done.runtime_s == 100.0  # its own time, not the step's


async def test_a_boot_ends_at_ready_at_on_the_step_that_reaches_it(
    nats_url: str, stepped: tuple[Harness, StepController]
) -> None:
    h, ctl = stepped
    reports: list[ExecutorReport] = []

    async def on_report(r: ExecutorReport) -> None:
        reports.append(r)

    await h.bus.subscribe(subjects.executor_report(T4.id), ExecutorReport, on_report)
    await ctl.step(20.0)
    await send_power_commands(h.bus, [T4.id], [], 20.0, "idle")
    await ctl.step(20.0)
    await send_power_commands(h.bus, [], [T4.id], 20.0, "a job waits")
    await ctl.step(20.0)
    await ctl.step(400.0)  # boot 300 s: awake since 320

    async def awake() -> bool:
        return bool(reports) and reports[-1].power.state == "awake" and reports[-1].time == 400

    deadline = time.monotonic() + 5
    while not await awake():
        assert time.monotonic() < deadline, reports[-3:]
        await asyncio.sleep(0.05)
    assert reports[-1].power.since == 320.0
    assert any(r.power.state == "waking" and r.power.ready_at == 320.0 for r in reports)


async def test_a_checkpoint_cost_is_a_timer_the_stepped_clock_honours(
    stepped: tuple[Harness, StepController],
) -> None:
    """Asked at t=20 with a cost of 50: nothing at the step to 60, both events within the
    step that passes 70, at 70 (not the step's time), with the progress as of the request."""
    h, ctl = stepped
    await ctl.step(10.0)
    await h.run("k", runtime_s=1000.0)
    await ctl.step(10.0)
    await ctl.step(20.0)
    await checkpoint(h.bus, "k", "defrag", cost_s=50.0)
    await ctl.step(20.0)  # drain: the command is handled at t=20
    await ctl.step(60.0)
    await asyncio.sleep(0.1)
    assert [type(e) for e in h.of("k")] == [Started]
    await ctl.step(100.0)
    _, checkpointed, preempted = await h.wait("k", 3, timeout_s=2)
    assert isinstance(checkpointed, Checkpointed) and isinstance(preempted, Preempted)
    assert checkpointed.time == 70.0 and preempted.time == 70.0
    assert checkpointed.progress == pytest.approx((20.0 - 10.0) / 1000.0)
    assert preempted.attempt == 1
