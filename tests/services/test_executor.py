"""The executor against a real nats-server: run, OOM, kill, checkpoint, duplicates, local mode."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from libs.bus import Bus, ServiceConfig, serve
from libs.clock import Clock
from proto import subjects
from proto.commands import CheckpointCommand, KillCommand, RunCommand
from proto.events import (
    Cancelled,
    Checkpointed,
    Completed,
    Failed,
    LifecycleEvent,
    Preempted,
    Started,
)
from proto.jobs import JobSpec
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from services.executor.service import main

FACTOR = 1000.0  # 1 Mosaic hour = 3.6 wall seconds
T4 = NodeSpec(
    id="t4-0",
    gpu_model="t4",
    gpu_count=4,
    gpu_mem_gb=16,
    host_mem_gb=128,
    cpus=32,
    idle_power_w=10,
    max_power_w=70,
)


class Harness:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.events: list[LifecycleEvent] = []

    async def collect(self) -> None:
        async def on_event(ev: LifecycleEvent) -> None:
            self.events.append(ev)

        await self.bus.consume(subjects.STREAM_LIFECYCLE, "lifecycle.>", LifecycleEvent, on_event)

    def of(self, job_id: str) -> list[LifecycleEvent]:
        return [e for e in self.events if e.job_id == job_id]

    async def wait(self, job_id: str, n: int, timeout_s: float = 10.0) -> list[LifecycleEvent]:
        deadline = time.monotonic() + timeout_s
        while len(self.of(job_id)) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{job_id}: wanted {n} events, got {self.of(job_id)}")
            await asyncio.sleep(0.02)
        return self.of(job_id)

    async def run(
        self,
        job_id: str,
        runtime_s: float,
        *,
        mem_gb: float = 8,
        attempt: int = 1,
        command: str | None = None,
        gpus: tuple[int, ...] = (0,),
        node: str = "t4-0",
    ) -> None:
        spec = JobSpec(id=job_id, gpu_mem_gb=mem_gb, command=command, gpus=len(gpus))
        alloc = Allocation(
            job_id=job_id,
            node=node,
            gpu_indices=gpus,
            gpu_share=1.0,
            gpu_mem_gb=mem_gb,
            host_mem_gb=8,
            cpus=2,
            time=0.0,
            attempt=attempt,
            spec=spec,
        )
        await self.bus.publish(
            subjects.node_command("t4-0", "run"),
            RunCommand(allocation=alloc, runtime_s=runtime_s),
            msg_id=f"run-{job_id}-{attempt}-{time.monotonic_ns()}",  # let duplicates through
        )


async def _start(
    nats_url: str, mode: str, tmp_path: Path
) -> tuple[asyncio.Task[int], asyncio.Event]:
    stop = asyncio.Event()
    args = argparse.Namespace(
        mode=mode, node_spec=[msgspec.json.encode(T4).decode()], log_dir=str(tmp_path / "logs")
    )
    task = asyncio.create_task(
        serve(
            "executor",
            main,
            ServiceConfig(nats_url=nats_url, log_format="json"),
            args=args,
            stop=stop,
            install_signals=False,
            clock=Clock(epoch=time.time(), factor=FACTOR),
        )
    )
    return task, stop


@pytest.fixture
async def sim(nats_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    h = Harness(bus)
    await h.collect()
    task, stop = await _start(nats_url, "sim", tmp_path)
    yield h
    stop.set()
    assert await asyncio.wait_for(task, 15) == 0
    await bus.close()


async def test_run_then_complete(sim: Harness) -> None:
    await sim.run("j1", runtime_s=600)  # 0.6 wall s
    started, completed = await sim.wait("j1", 2)
    assert isinstance(started, Started) and started.node == "t4-0" and started.attempt == 1
    assert isinstance(completed, Completed) and completed.node == "t4-0"
    assert completed.runtime_s >= 600 * 0.9
    # 1 T4 at 70 W for ~600 s ≈ 0.0117 kWh
    assert completed.energy_kwh == pytest.approx(70 * completed.runtime_s / 3.6e6)


async def test_over_memory_job_fails_with_oom(sim: Harness) -> None:
    await sim.run("big", runtime_s=3600, mem_gb=40)
    started, failed = await sim.wait("big", 2)
    assert isinstance(started, Started)
    assert isinstance(failed, Failed)
    assert failed.reason == "OOM: job needs 40 GB per GPU, t4 has 16 GB"


async def test_kill_cancels(sim: Harness) -> None:
    await sim.run("k", runtime_s=36000)
    await sim.wait("k", 1)
    await sim.bus.publish(
        subjects.node_command("t4-0", "kill"), KillCommand(job_id="k", reason="user asked")
    )
    events = await sim.wait("k", 2)
    assert isinstance(events[1], Cancelled) and events[1].reason == "user asked"
    await asyncio.sleep(0.2)
    assert len(sim.of("k")) == 2  # no Completed after the Cancelled


async def test_checkpoint_preempts_with_progress(sim: Harness) -> None:
    await sim.run("c", runtime_s=10_000)  # 10 wall s
    await sim.wait("c", 1)
    await asyncio.sleep(0.5)
    await sim.bus.publish(
        subjects.node_command("t4-0", "checkpoint"),
        CheckpointCommand(job_id="c", reason="defrag"),
    )
    _, checkpointed, preempted = await sim.wait("c", 3)
    assert isinstance(checkpointed, Checkpointed) and 0.0 < checkpointed.progress < 1.0
    assert isinstance(preempted, Preempted) and preempted.reason == "defrag"


async def test_duplicate_run_is_ignored(sim: Harness) -> None:
    await sim.run("d", runtime_s=300)
    await sim.run("d", runtime_s=300)  # same job and attempt, redelivered
    events = await sim.wait("d", 2)
    await sim.run("d", runtime_s=300)  # after it finished
    await asyncio.sleep(0.5)
    assert [type(e) for e in sim.of("d")] == [Started, Completed]
    assert events == sim.of("d")


async def test_run_for_another_node_is_dead_lettered(sim: Harness) -> None:
    await sim.run("wrong", runtime_s=10, node="a100-0")
    await sim.run("right", runtime_s=10)
    await sim.wait("right", 2)
    assert sim.of("wrong") == []
    info = await sim.bus.js.stream_info(subjects.STREAM_DLQ)
    assert info.state.messages == 1


async def test_local_mode_sets_cuda_visible_devices(nats_url: str, tmp_path: Path) -> None:
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    h = Harness(bus)
    await h.collect()
    task, stop = await _start(nats_url, "local", tmp_path)
    try:
        out = tmp_path / "env.txt"
        ok = (
            f"{sys.executable} -c \"import os; open({str(out)!r}, 'w')"
            f".write(os.environ['CUDA_VISIBLE_DEVICES'])\""
        )
        await h.run("loc", runtime_s=1, command=ok, gpus=(1, 3))
        _, completed = await h.wait("loc", 2)
        assert isinstance(completed, Completed)
        assert out.read_text() == "1,3"

        bad = f"{sys.executable} -c \"import sys; print('dataset missing'); sys.exit(3)\""
        await h.run("bad", runtime_s=1, command=bad)
        _, failed = await h.wait("bad", 2)
        assert isinstance(failed, Failed) and failed.reason == "exit code 3: dataset missing"

        await h.run("none", runtime_s=1)
        _, failed = await h.wait("none", 2)
        assert isinstance(failed, Failed) and "no command" in failed.reason

        await h.run("long", runtime_s=1, command="sleep 60")
        await h.wait("long", 1)
        await bus.publish(
            subjects.node_command("t4-0", "kill"), KillCommand(job_id="long", reason="stop")
        )
        _, cancelled = await h.wait("long", 2)
        assert isinstance(cancelled, Cancelled)
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0
        await bus.close()


def test_bad_node_spec_exits_nonzero_with_message() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "services.executor", "--mode", "sim", "--node-spec", "{nope"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 2
    assert "not valid JSON" in proc.stderr
