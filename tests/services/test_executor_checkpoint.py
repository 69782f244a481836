"""Checkpoint-preemption at the executor (issue 14), on a real nats-server: a simulated
checkpoint costs its time while the job keeps its GPUs; a local job gets its own signal and
grace, keeps the progress it reported, and is stopped with SIGTERM/SIGKILL when it overstays;
commands that are no checkpoint of this attempt change nothing; unsound ones are dead letters."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libs.bus import Bus
from proto import subjects
from proto.events import Checkpointed, Preempted, Started
from proto.jobs import JobSpec
from services.executor import local as local_module
from tests.runtime._jobs import checkpoint, progress_record, run, until
from tests.services.test_executor import _start, _watching_reports, work_root  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
PYTHON = shutil.which(
    "python3", path="/usr/bin:/bin"
)  # the jobs' interpreter (see test_example_job)
COST_S = 2000.0  # 2 wall seconds at the tests' factor 1000


@pytest.fixture
async def sim(nats_url: str, tmp_path: Path) -> AsyncIterator[tuple[Bus, object, list]]:
    bus, h, reports = await _watching_reports(nats_url)
    task, stop = await _start(
        nats_url, "sim", tmp_path, report_interval=0.2, checkpoint_cost_s=COST_S
    )
    yield bus, h, reports
    stop.set()
    assert await asyncio.wait_for(task, 15) == 0
    await bus.close()


async def test_a_simulated_checkpoint_takes_its_cost_holding_the_gpus(sim) -> None:
    bus, h, reports = sim
    await run(bus, JobSpec(id="c1"), runtime_s=100_000)
    (started,) = await h.wait("c1", 1)
    await asyncio.sleep(0.3)
    asked = time.monotonic()
    await checkpoint(bus, "c1", "defrag")
    await asyncio.sleep(1.0)  # half-way through the cost: no event yet, still running here
    assert len(h.of("c1")) == 1
    assert [a.job_id for a in reports[-1].running] == ["c1"]
    _, checkpointed, preempted = await h.wait("c1", 3, timeout_s=10)
    assert time.monotonic() - asked >= COST_S / 1000
    assert isinstance(checkpointed, Checkpointed) and isinstance(preempted, Preempted)
    held_s = checkpointed.time - started.time
    assert held_s >= COST_S
    # progress counts the run up to the request, not the cost (the job saved where it was)
    assert 0 < checkpointed.progress * 100_000 <= held_s - COST_S + 200
    assert "estimated from elapsed time (simulated)" in checkpointed.reason
    assert preempted.attempt == 1 and preempted.time == checkpointed.time
    await until(lambda: reports[-1].running == ())


async def test_a_command_may_set_the_cost_and_name_the_attempt(sim) -> None:
    bus, h, _ = sim
    await run(bus, JobSpec(id="c2"), runtime_s=100_000)
    (started,) = await h.wait("c2", 1)
    await checkpoint(bus, "c2", "late", attempt=7)  # another attempt's: ignored
    await checkpoint(bus, "nobody-runs-this", "x")  # no such job here: ignored
    await checkpoint(bus, "c2", "thermal", attempt=1, cost_s=100.0, shrink_to=2)
    _, checkpointed, preempted = await h.wait("c2", 3, timeout_s=5)
    assert checkpointed.reason.startswith("thermal") and preempted.reason == "thermal"
    assert preempted.resize_gpus == 2  # a shrink: the Preempted names the size it waits at
    assert checkpointed.time - started.time < COST_S  # its own cost, not the executor's
    await asyncio.sleep(0.3)
    assert len(h.of("c2")) == 3 and h.of("nobody-runs-this") == []


async def test_unsound_checkpoint_commands_and_signals_are_dead_lettered(sim) -> None:
    bus, h, _ = sim
    await run(bus, JobSpec(id="c3"), runtime_s=1_000)
    await h.wait("c3", 1)
    await checkpoint(bus, "c3", "x", cost_s=-5.0)
    await checkpoint(bus, "c3", "x", shrink_to=-1)
    await checkpoint(bus, "c3", "x", attempt=0)
    _, completed = await h.wait("c3", 2, timeout_s=10)  # ran on, untouched
    assert type(completed).__name__ == "Completed"
    msg = await bus.js.get_last_msg(subjects.STREAM_DLQ, "dlq.>")
    assert b"attempt: must be >= 1" in msg.data
    await run(bus, JobSpec(id="c4", checkpoint_signal="SIGKILL"))  # a run with no such signal
    await asyncio.sleep(0.5)
    assert h.of("c4") == []  # never started: a job it could not checkpoint
    msg = await bus.js.get_last_msg(subjects.STREAM_DLQ, "dlq.>")
    assert b"allocation.spec.checkpoint_signal: must be one of" in msg.data
    info = await bus.js.stream_info(subjects.STREAM_DLQ)
    assert info.state.messages == 4


@pytest.fixture
async def local(nats_url: str, tmp_path: Path, work_root: Path):  # noqa: F811
    if PYTHON is None:
        pytest.skip("no python3 in /usr/bin:/bin for jobs")
    bus, h, reports = await _watching_reports(nats_url)
    task, stop = await _start(nats_url, "local", tmp_path, work_root=str(work_root))
    yield bus, h, reports
    stop.set()
    assert await asyncio.wait_for(task, 15) == 0
    await bus.close()


# a job on libs.runtime that reports progress each step and saves (a file) on its signal
RUNTIME_JOB = """python3 -c '
import sys, time; sys.path.insert(0, "{root}")
import libs.runtime as runtime
n = [0]
rt = runtime.start(save=lambda: open("saved", "w").write(str(n[0])))
while True:
    time.sleep(0.02); n[0] += 1; rt.progress(n[0] / 1000); rt.step(samples=1)
'"""


async def test_a_job_gets_the_signal_it_asked_for(local, work_root: Path) -> None:  # noqa: F811
    bus, h, _ = local
    spec = JobSpec(id="u2", command=RUNTIME_JOB.format(root=ROOT), checkpoint_signal="SIGUSR2")
    await run(bus, spec)
    await h.wait("u2", 1)
    await until(lambda: (progress_record(work_root, "u2", 1) or {}).get("steps", 0) >= 3)
    await checkpoint(bus, "u2", "defrag")
    _, checkpointed, preempted = await h.wait("u2", 3, timeout_s=20)
    saved = int((work_root / "u2-1" / "saved").read_text())
    assert isinstance(checkpointed, Checkpointed)
    assert checkpointed.progress == pytest.approx(saved / 1000)
    assert "progress reported by the job" in checkpointed.reason
    assert "grace" not in checkpointed.reason  # it exited by itself, in time
    assert isinstance(preempted, Preempted)


async def test_a_job_that_overstays_its_grace_is_stopped_and_still_preempted(
    local,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It neither handles its signal nor SIGTERM: after its grace SIGTERM, after the kill
    grace SIGKILL; the events come all the same, with the elapsed-time estimate."""
    monkeypatch.setattr(local_module, "KILL_GRACE_S", 1.0)  # 10 wall seconds in production
    bus, h, reports = local
    ignore_term = "signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    stubborn = f"python3 -c 'import signal, time; {ignore_term}; time.sleep(120)'"
    spec = JobSpec(id="st", command=stubborn, checkpoint_grace_s=0.5)
    await run(bus, spec, runtime_s=60_000.0)  # a wall minute
    (started,) = await h.wait("st", 1)
    assert isinstance(started, Started)
    await until(lambda: any(a.pid for r in reports[-1:] for a in r.running))
    pid = next(a.pid for a in reports[-1].running if a.pid)
    await asyncio.sleep(0.5)
    asked = time.monotonic()
    await checkpoint(bus, "st", "defrag")
    _, checkpointed, preempted = await h.wait("st", 3, timeout_s=20)
    assert time.monotonic() - asked >= 1.4  # the grace, then the kill grace
    assert isinstance(checkpointed, Checkpointed) and isinstance(preempted, Preempted)
    assert "estimated from elapsed time (the job reported none)" in checkpointed.reason
    assert "stopped with SIGTERM/SIGKILL" in checkpointed.reason
    assert 0 < checkpointed.progress < 0.999
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole group is gone
