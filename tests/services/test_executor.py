"""The executor against a real nats-server: run, OOM, kill, checkpoint, duplicates, reports,
local mode (as an unprivileged user, with a clean environment)."""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
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
from proto.nodes import ExecutorReport, NodeSpec
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
        share: float = 1.0,
    ) -> None:
        n = share if share < 1 else len(gpus)
        spec = JobSpec(id=job_id, gpu_mem_gb=mem_gb, command=command, gpus=n)
        alloc = Allocation(
            job_id=job_id,
            node=node,
            gpu_indices=gpus,
            gpu_share=share,
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
    nats_url: str, mode: str, tmp_path: Path, **flags: object
) -> tuple[asyncio.Task[int], asyncio.Event]:
    stop = asyncio.Event()
    args = argparse.Namespace(
        mode=mode,
        node_spec=[msgspec.json.encode(T4).decode()],
        log_dir=str(tmp_path / "logs"),
        **flags,
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


async def test_silent_stop_of_a_superseded_attempt_publishes_nothing(sim: Harness) -> None:
    """The placer requeued attempt 1 while this node ran it unseen: a silent, attempt-scoped
    kill stops it with no event (its end was published as the requeue); a silent kill naming
    another attempt leaves the running one alone."""
    await sim.run("s", runtime_s=36000)
    await sim.wait("s", 1)
    kill = subjects.node_command("t4-0", "kill")
    await sim.bus.publish(kill, KillCommand(job_id="s", reason="x", attempt=2, silent=True))
    await sim.bus.publish(kill, KillCommand(job_id="s", reason="x", attempt=1, silent=True))
    await sim.run("after", runtime_s=100)  # commands are handled in order: s is stopped by now
    await sim.wait("after", 2)
    await sim.run("s", runtime_s=100, attempt=2)  # the requeued attempt runs and ends the job
    events = await sim.wait("s", 3)
    assert [type(e) for e in events] == [Started, Started, Completed]
    assert [e.attempt for e in events if isinstance(e, Started)] == [1, 2]


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


async def test_a_newer_attempt_supersedes_the_running_one(sim: Harness) -> None:
    """The placer gave attempt 1 up (requeued it) while it still ran here: attempt 2 runs and
    the job still ends once; a late copy of attempt 1's run is ignored."""
    await sim.run("n", runtime_s=60_000)
    await sim.wait("n", 1)
    await sim.run("n", runtime_s=300, attempt=2)
    events = await sim.wait("n", 3)
    await sim.run("n", runtime_s=300, attempt=1)
    await asyncio.sleep(0.5)
    assert [type(e) for e in sim.of("n")] == [Started, Started, Completed]
    assert [e.attempt for e in events[:2] if isinstance(e, Started)] == [1, 2]


async def test_run_for_another_node_is_dead_lettered(sim: Harness) -> None:
    await sim.run("wrong", runtime_s=10, node="a100-0")
    await sim.run("right", runtime_s=10)
    await sim.wait("right", 2)
    assert sim.of("wrong") == []
    info = await sim.bus.js.stream_info(subjects.STREAM_DLQ)
    assert info.state.messages == 1


@pytest.fixture
def work_root() -> Iterator[Path]:
    """Jobs' working directories, outside pytest's tmp_path (private to root, so a job run as
    nobody could not reach a directory under it)."""
    root = Path(tempfile.mkdtemp(prefix="mosaic-test-jobs-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


async def test_local_mode_sets_cuda_visible_devices(
    nats_url: str, tmp_path: Path, work_root: Path
) -> None:
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    h = Harness(bus)
    await h.collect()
    task, stop = await _start(nats_url, "local", tmp_path, work_root=str(work_root))
    try:
        ok = 'printf %s "$CUDA_VISIBLE_DEVICES" > "$HOME/env.txt"'
        await h.run("loc", runtime_s=1, command=ok, gpus=(1, 3))
        _, completed = await h.wait("loc", 2)
        assert isinstance(completed, Completed)
        assert (work_root / "loc-1" / "env.txt").read_text() == "1,3"

        await h.run("bad", runtime_s=1, command="echo 'dataset missing'; exit 3")
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


SHARE_VARS = (
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "MOSAIC_GPU_SHARE",
    "MOSAIC_GPU_MEMORY_LIMIT_GB",
    "MOSAIC_GPU_MEMORY_FRACTION",
    "PYTORCH_CUDA_ALLOC_CONF",
)


async def test_local_mode_passes_the_gpu_share_to_the_job(
    nats_url: str, tmp_path: Path, work_root: Path
) -> None:
    """A fractional job learns its share: the MPS thread percentage and memory limit, the
    Mosaic variables and the allocator hint; a whole-GPU job gets no MPS limits."""
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    h = Harness(bus)
    await h.collect()
    task, stop = await _start(nats_url, "local", tmp_path, work_root=str(work_root))
    dump = " ".join(f'echo "{v}=${{{v}-unset}}" >> "$HOME/env.txt";' for v in SHARE_VARS)
    try:
        await h.run("half", runtime_s=1, command=dump, share=0.35, mem_gb=4)
        await h.run("whole", runtime_s=1, command=dump, mem_gb=16)
        for jid in ("half", "whole"):
            _, done = await h.wait(jid, 2)
            assert isinstance(done, Completed), done
        env = {
            jid: dict(
                line.split("=", 1)
                for line in (work_root / f"{jid}-1" / "env.txt").read_text().splitlines()
            )
            for jid in ("half", "whole")
        }
        assert env["half"] == {
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "35",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
            "MOSAIC_GPU_SHARE": "0.35",
            "MOSAIC_GPU_MEMORY_LIMIT_GB": "4.0",
            "MOSAIC_GPU_MEMORY_FRACTION": "0.25",
            "PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.8,expandable_segments:True",
        }
        assert env["whole"] == {
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "unset",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "unset",
            "MOSAIC_GPU_SHARE": "1.0",
            "MOSAIC_GPU_MEMORY_LIMIT_GB": "16.0",
            "MOSAIC_GPU_MEMORY_FRACTION": "1.0",
            "PYTORCH_CUDA_ALLOC_CONF": "unset",
        }
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0
        await bus.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_command_runs_as_nobody_without_the_executor_environment(
    nats_url: str, tmp_path: Path, work_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_X", "s3cret")
    monkeypatch.setenv("MOSAIC_NATS_CREDS", "/etc/mosaic/executor.creds")
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    h = Harness(bus)
    await h.collect()
    task, stop = await _start(nats_url, "local", tmp_path, work_root=str(work_root))
    try:
        who = (
            'id -u > "$HOME/uid"; id -G > "$HOME/groups"; pwd > "$HOME/cwd"; '
            'echo "${SECRET_X-unset} ${MOSAIC_NATS_CREDS-unset} $PATH" > "$HOME/env"; '
            "echo to-the-log"
        )
        await h.run("who", runtime_s=1, command=who)
        _, completed = await h.wait("who", 2)
        assert isinstance(completed, Completed), completed
        home = work_root / "who-1"
        nobody = pwd.getpwnam("nobody")
        assert int((home / "uid").read_text()) == nobody.pw_uid
        assert (home / "groups").read_text().split() == [str(nobody.pw_gid)]
        assert (home / "cwd").read_text().strip() == str(home)
        assert (home / "env").read_text().split() == ["unset", "unset", "/usr/bin:/bin"]
        assert home.stat().st_uid == nobody.pw_uid
        assert (tmp_path / "logs" / "who-1.log").read_text() == "to-the-log\n"
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0
        await bus.close()


async def _watching_reports(nats_url: str) -> tuple[Bus, Harness, list[ExecutorReport]]:
    """A bus, a lifecycle harness and the list every report of node t4-0 is appended to."""
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    h = Harness(bus)
    await h.collect()
    reports: list[ExecutorReport] = []

    async def on_report(r: ExecutorReport) -> None:
        reports.append(r)

    await bus.subscribe(subjects.executor_report("t4-0"), ExecutorReport, on_report)
    return bus, h, reports


async def test_reports_list_what_runs(nats_url: str, tmp_path: Path) -> None:
    bus, h, reports = await _watching_reports(nats_url)
    task, stop = await _start(nats_url, "sim", tmp_path, report_interval=0.3)
    try:
        await _until(lambda: len(reports) >= 1)
        assert reports[0].running == () and reports[0].node == "t4-0"
        await h.run("r1", runtime_s=3000)
        await h.run("r2", runtime_s=20_000)
        await h.wait("r1", 1)
        await h.wait("r2", 1)
        both = {("r1", 1), ("r2", 1)}
        await _until(lambda: {(a.job_id, a.attempt) for a in reports[-1].running} == both)
        await h.wait("r1", 2)  # r1 completed: the next report has only r2
        await _until(lambda: [a.job_id for a in reports[-1].running] == ["r2"])
        n = len(reports)
        await _until(lambda: len(reports) >= n + 2)  # periodic, not only on changes
        assert len({r.boot_id for r in reports}) == 1
        assert all(r.interval_s == 0.3 for r in reports)
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0
        await bus.close()


async def _until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


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


async def test_an_attempt_stays_reported_until_its_end_is_published(
    nats_url: str, tmp_path: Path
) -> None:
    """While the terminal event cannot be published (the stream is gone, e.g. electing a
    leader), the attempt is still reported: the placer must not requeue a job that finished."""
    bus, h, reports = await _watching_reports(nats_url)
    task, stop = await _start(nats_url, "sim", tmp_path, report_interval=0.2)
    try:
        await h.run("e1", runtime_s=500)  # half a wall second
        await h.wait("e1", 1)
        await bus.js.delete_stream(subjects.STREAM_LIFECYCLE)  # Completed cannot go out now
        await asyncio.sleep(1.5)  # it has ended; its event is being retried
        n = len(reports)
        await _until(lambda: len(reports) >= n + 3)
        assert all([a.job_id for a in r.running] == ["e1"] for r in reports[n:])
        await bus.ensure_topology()  # the stream is back: the event goes out, the report empties
        await _until(lambda: reports[-1].running == (), timeout_s=20)
        last = await bus.js.get_last_msg(subjects.STREAM_LIFECYCLE, subjects.lifecycle("e1"))
        assert b'"completed"' in last.data
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0
        await bus.close()
