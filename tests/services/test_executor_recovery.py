"""No crash loses a job: an executor killed with -9 and started again on the same state
directory re-adopts what it ran (a real nats-server, the executor as a real subprocess)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import pytest

from libs.bus import Bus
from libs.clock import Clock
from proto import subjects
from proto.commands import RunCommand
from proto.events import Completed, Failed, Started
from proto.jobs import JobSpec
from proto.ledger import Allocation
from proto.nodes import ExecutorReport
from services.executor.journal import Entry, Journal
from services.executor.local import LOST, WRAPPER, LocalRunner, RunAs
from tests.services.test_executor import T4, Harness

ROOT = Path(__file__).resolve().parents[2]
FACTOR = 1000.0  # 1 Mosaic second = 1 wall millisecond


class Node:
    """One node's executor process (restartable) and everything it publishes."""

    def __init__(self, bus: Bus, nats_url: str, tmp_path: Path, mode: str) -> None:
        self.bus = bus
        self.h = Harness(bus)
        self.nats_url = nats_url
        self.tmp_path = tmp_path
        self.mode = mode
        self.clock = Clock(epoch=time.time(), factor=FACTOR)
        self.state_dir = tmp_path / "state"
        self.work_root = Path(tempfile.mkdtemp(prefix="mosaic-test-jobs-"))
        self.work_root.chmod(0o711)  # reachable by the job's user, unlike pytest's tmp_path
        self.reports: list[ExecutorReport] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    async def listen(self) -> None:
        await self.h.collect()

        async def on_report(r: ExecutorReport) -> None:
            self.reports.append(r)

        await self.bus.subscribe(subjects.executor_report(T4.id), ExecutorReport, on_report)

    async def start(self) -> str:
        """Start an executor process; return its boot id once its first report is out."""
        seen = {r.boot_id for r in self.reports}
        self.starts += 1
        env = {
            **os.environ,
            **self.clock.env(),
            "MOSAIC_NATS_URL": self.nats_url,
            "MOSAIC_LOG_FORMAT": "json",
        }
        argv = [sys.executable, "-m", "services.executor", "--mode", self.mode]
        argv += ["--node-spec", msgspec.json.encode(T4).decode(), "--report-interval", "0.5"]
        argv += ["--state-dir", str(self.state_dir), "--work-root", str(self.work_root)]
        argv += ["--log-dir", str(self.tmp_path / "logs")]
        with open(self.tmp_path / f"executor-{self.starts}.log", "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=out)
        await until(lambda: any(r.boot_id not in seen for r in self.reports), 60)
        return next(r.boot_id for r in self.reports if r.boot_id not in seen)

    def crash(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL: no clean-up of any kind
        self.proc.wait(10)

    def stop_executor(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            assert self.proc.wait(30) == 0

    def stop(self) -> None:
        """Stop the executor, then any job process of this test still running (jobs outlive
        executors by design): only wrappers whose command line names this test's state dir."""
        self.stop_executor()
        for pid in {a.pid for r in self.reports for a in r.running if a.pid}:
            with contextlib.suppress(OSError):
                if str(self.state_dir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.killpg(pid, signal.SIGKILL)
        shutil.rmtree(self.work_root, ignore_errors=True)

    def latest(self, boot_id: str) -> ExecutorReport:
        return [r for r in self.reports if r.boot_id == boot_id][-1]

    def running(self, boot_id: str) -> set[str]:
        return {a.job_id for a in self.latest(boot_id).running}

    def pid(self, boot_id: str, job_id: str) -> int:
        (pid,) = [a.pid for a in self.latest(boot_id).running if a.job_id == job_id]
        assert pid is not None
        return pid


async def until(cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def kinds(h: Harness, job_id: str) -> list[str]:
    return [type(e).__name__ for e in h.of(job_id)]


async def _node(nats_url: str, tmp_path: Path, mode: str) -> AsyncIterator[Node]:
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    node = Node(bus, nats_url, tmp_path, mode)
    await node.listen()
    try:
        yield node
    finally:
        node.stop()
        await bus.close()


@pytest.fixture
async def sim_node(nats_url: str, tmp_path: Path) -> AsyncIterator[Node]:
    async for node in _node(nats_url, tmp_path, "sim"):
        yield node


@pytest.fixture
async def local_node(nats_url: str, tmp_path: Path) -> AsyncIterator[Node]:
    async for node in _node(nats_url, tmp_path, "local"):
        yield node


# sigterm in make test-all (test time): kill -9 is the harder case
@pytest.mark.parametrize("how", ["kill -9", pytest.param("sigterm", marks=pytest.mark.slow)])
async def test_sim_job_survives_a_restart_and_completes_once_on_time(
    sim_node: Node, how: str
) -> None:
    n = sim_node
    first = await n.start()
    await n.h.run("s1", runtime_s=8000)  # 8 wall s: time for the next executor to start
    (started,) = await n.h.wait("s1", 1)
    assert isinstance(started, Started)
    await until(lambda: n.running(first) == {"s1"})
    if how == "kill -9":
        n.crash()
    else:
        n.stop_executor()  # a clean stop leaves the job to the next executor on the state dir
    second = await n.start()
    back_at = n.clock.now()
    assert second != first
    await until(lambda: n.running(second) == {"s1"})  # re-adopted, reported under the new boot
    _, completed = await n.h.wait("s1", 2, timeout_s=30)
    await asyncio.sleep(1.0)
    assert kinds(n.h, "s1") == ["Started", "Completed"]  # one Started, exactly one Completed
    assert isinstance(completed, Completed)
    # resumed for the time it had left, not run again from the start (that would end about
    # 8000 after the new executor came back)
    assert completed.runtime_s >= 8000 * 0.99
    assert completed.time < max(started.time + 8000, back_at) + 2500
    await until(lambda: n.running(second) == set())
    assert list(n.state_dir.rglob("*.json")) == []  # forgotten once the event is out


@pytest.mark.parametrize("how", ["kill -9", "sigterm"])
async def test_local_job_survives_a_restart_and_its_exit_code_is_reported(
    local_node: Node, how: str
) -> None:
    n = local_node
    first = await n.start()
    gate = 'while [ ! -e "$HOME/go" ]; do sleep 0.1; done; exit 3'  # ends when the test says
    await n.h.run("l1", runtime_s=1, command=gate)
    await n.h.wait("l1", 1)
    await until(lambda: n.running(first) == {"l1"})
    pid = n.pid(first, "l1")
    if how == "kill -9":
        n.crash()
    else:
        n.stop_executor()
    os.kill(pid, 0)  # the job's process outlived the executor
    second = await n.start()
    await until(lambda: n.running(second) == {"l1"})
    assert n.pid(second, "l1") == pid
    (n.work_root / "l1-1" / "go").touch()
    _, failed = await n.h.wait("l1", 2, timeout_s=30)
    await asyncio.sleep(0.5)
    assert kinds(n.h, "l1") == ["Started", "Failed"]
    assert isinstance(failed, Failed) and failed.reason == "exit code 3"


async def test_a_job_killed_while_the_executor_is_down_is_reported_lost(
    local_node: Node,
) -> None:
    n = local_node
    first = await n.start()
    await n.h.run("gone", runtime_s=1, command="sleep 60")
    await n.h.wait("gone", 1)
    await until(lambda: n.running(first) == {"gone"})
    pid = n.pid(first, "gone")
    n.crash()
    os.killpg(pid, signal.SIGKILL)  # the wrapper and the job, before anyone wrote a status
    await n.start()
    _, failed = await n.h.wait("gone", 2, timeout_s=30)
    assert isinstance(failed, Failed) and failed.reason == LOST


async def test_redelivered_run_of_a_journaled_attempt_starts_no_second_process(
    local_node: Node,
) -> None:
    n = local_node
    await n.start()
    await n.h.run("once", runtime_s=1, command='echo run >> "$HOME/runs"; sleep 3')
    await n.h.wait("once", 1)
    n.crash()
    second = await n.start()
    await n.h.run("once", runtime_s=1, command='echo run >> "$HOME/runs"; sleep 3')  # again
    _, completed = await n.h.wait("once", 2, timeout_s=30)
    assert isinstance(completed, Completed)
    await asyncio.sleep(0.5)
    assert kinds(n.h, "once") == ["Started", "Completed"]
    assert (n.work_root / "once-1" / "runs").read_text() == "run\n"
    await until(lambda: n.running(second) == set())


async def test_a_run_redelivered_after_its_attempt_ended_and_a_restart_is_ignored(
    sim_node: Node,
) -> None:
    """The ack of a run command lost in a crash after the attempt had already ended: the
    redelivered command finds the attempt's tombstone and runs nothing a second time."""
    n = sim_node
    first = await n.start()
    await n.h.run("t1", runtime_s=300)
    await n.h.wait("t1", 2)
    await until(lambda: n.running(first) == set())
    n.crash()
    second = await n.start()
    # the same attempt again (a long one: were it run, the node would report it running;
    # its events would not show it, having the same message ids as the first run's)
    await n.h.run("t1", runtime_s=600_000)
    await n.h.run("t2", runtime_s=300)  # handled after it, in order
    await n.h.wait("t2", 2)
    await until(lambda: n.running(second) == set())  # t2's end reported too
    assert kinds(n.h, "t1") == ["Started", "Completed"]
    assert not any(a.job_id == "t1" for r in n.reports if r.boot_id == second for a in r.running)
    assert Journal(n.state_dir / T4.id).is_done("t1", 1)


async def test_events_journaled_before_a_crash_are_published_on_restart(
    sim_node: Node,
) -> None:
    """A crash between journaling a terminal event and publishing it: the restart publishes
    it (once: JetStream drops a repeat of the same message id) and forgets the attempt."""
    n = sim_node
    first = await n.start()
    await n.h.run("p1", runtime_s=600_000)
    await n.h.wait("p1", 1)
    await until(lambda: n.running(first) == {"p1"})
    n.crash()
    journal = Journal(n.state_dir / T4.id)
    (entry,) = journal.load()[0]
    ended = Failed(job_id="p1", time=entry.started_at + 5, node=T4.id, reason="test: ended")
    journal.put(msgspec.structs.replace(entry, pending=(ended,)))
    second = await n.start()
    _, failed = await n.h.wait("p1", 2, timeout_s=30)
    assert failed == ended
    assert n.running(second) == set()
    assert journal.load() == ([], [])


async def test_an_attempt_accepted_but_not_started_before_a_crash_is_started(
    local_node: Node,
) -> None:
    """The journal has the attempt (its run command was taken) but no Started went out and no
    process was found: the restart starts it, once."""
    n = local_node
    journal = Journal(n.state_dir / T4.id)
    cmd = _cmd("late", command='echo ran > "$HOME/out"')
    journal.put(Entry(node=T4.id, cmd=cmd, started_at=n.clock.now(), boot_id="gone"))
    await n.start()
    started, completed = await n.h.wait("late", 2, timeout_s=30)
    assert isinstance(started, Started) and isinstance(completed, Completed)
    assert (n.work_root / "late-1" / "out").read_text() == "ran\n"


async def test_a_wrapper_whose_pid_missed_the_journal_is_found_by_its_command_line(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "state")
    rc = journal.rc_path("w", 1)
    wrapper = subprocess.Popen(
        [sys.executable, "-I", str(WRAPPER), "--rc-file", str(rc), "--", "sleep 1; exit 4"],
        start_new_session=True,
    )
    try:
        cmdline = Path(f"/proc/{wrapper.pid}/cmdline")
        await until(lambda: str(rc).encode() in cmdline.read_bytes(), 10)  # exec is done
        runner = LocalRunner(tmp_path / "logs", tmp_path / "work", RunAs.resolve(None))
        entry = Entry(node=T4.id, cmd=_cmd("w"), started_at=0.0, boot_id="b", started_sent=True)
        adopted = runner.adopt(entry, rc)
        assert adopted.launch is not None and adopted.launch.pid == wrapper.pid
        outcome = await runner.wait(adopted, T4)  # polled: not this runner's child
        assert outcome.reason == "exit code 4"
    finally:
        wrapper.kill()
        wrapper.wait()


def test_journal_round_trip_and_an_unreadable_entry_is_set_aside(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    entry = Entry(node="t4-0", cmd=_cmd("a/../b"), started_at=12.5, boot_id="b1")
    journal.put(entry)
    (path,) = (tmp_path / "j").glob("*.json")
    assert path.parent == tmp_path / "j"  # the job id cannot escape the directory
    (tmp_path / "j" / "junk-1.json").write_text("{not json")
    entries, bad = journal.load()
    assert entries == [entry]
    assert [p.name for p, _ in bad] == ["junk-1.json"]
    assert journal.load() == ([entry], [])  # renamed *.bad: reported once
    journal.remove("a/../b", 1)
    assert journal.load() == ([], [])


def _cmd(job_id: str, command: str | None = None) -> RunCommand:
    alloc = Allocation(
        job_id=job_id,
        node="t4-0",
        gpu_indices=(0,),
        gpu_share=1.0,
        gpu_mem_gb=8,
        host_mem_gb=8,
        cpus=2,
        time=0.0,
        spec=JobSpec(id=job_id, command=command),
    )
    return RunCommand(allocation=alloc, runtime_s=10)
