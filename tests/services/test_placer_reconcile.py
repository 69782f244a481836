"""The placer reconciles its ledger with what nodes report, on a real NATS server.

The executors' side is played by ``FakeExecutor`` (run commands in, lifecycle events out) and a
``Reporter`` that publishes real ``ExecutorReport`` messages on ``executor.<node>`` every 0.2 s
listing what the fake executor runs: a producer of the contract, not a mock of NATS. A crash is
the reporter forgetting a job (an executor restarted without it) or going silent for a node.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import msgspec
import pytest

from libs.bus import Bus
from libs.policy.inventory import NodeGroup, expand
from proto import subjects
from proto.commands import KillCommand
from proto.events import Completed, Placed, Preempted, is_terminal
from proto.jobs import JobSpec
from proto.ledger import Allocation
from proto.nodes import ExecutorReport, RunningAttempt
from services.scorer.service import main as scorer_main
from tests.services._placer_executor import FakeExecutor
from tests.services._scorer_util import (
    by_job,
    connect,
    lifecycle_events,
    poll,
    put_nodes,
    start_in_process,
    submit,
)
from tests.services.test_placer import _placer

INTERVAL_S = 0.2


class Reporter:
    """Publishes one ExecutorReport per node every ``INTERVAL_S``: the latest attempt of each job
    the executor was told to run and has not finished, minus what ``forget`` dropped."""

    def __init__(self, bus: Bus, executor: FakeExecutor, nodes: list[str]) -> None:
        self.bus = bus
        self.executor = executor
        self.nodes = nodes
        self.silent: set[str] = set()
        self.forgotten: set[tuple[str, int]] = set()
        self.stale: dict[str, tuple[str, int]] = {}  # node -> an old attempt it still runs
        self.boot = {n: uuid.uuid4().hex for n in nodes}
        self._task: asyncio.Task[None] | None = None

    def running(self, node: str) -> tuple[RunningAttempt, ...]:
        latest: dict[str, tuple[str, int]] = {}
        for cmd in self.executor.runs:
            a = cmd.allocation
            latest[a.job_id] = (a.node, a.attempt)
        listed = tuple(
            RunningAttempt(job_id=job, attempt=attempt)
            for job, (n, attempt) in latest.items()
            if n == node and job not in self.executor._done and (job, attempt) not in self.forgotten
        )
        if node in self.stale:
            job, attempt = self.stale[node]
            listed += (RunningAttempt(job_id=job, attempt=attempt),)
        return listed

    def forget(self, job: str, attempt: int, node: str) -> None:
        """The node's executor restarted and lost this attempt."""
        self.forgotten.add((job, attempt))
        self.boot[node] = uuid.uuid4().hex

    async def _loop(self) -> None:
        while True:
            for node in self.nodes:
                if node in self.silent:
                    continue
                report = ExecutorReport(
                    node=node,
                    time=0.0,
                    boot_id=self.boot[node],
                    interval_s=INTERVAL_S,
                    running=self.running(node),
                )
                await self.bus.publish(subjects.executor_report(node), report, durable=False)
            await asyncio.sleep(INTERVAL_S)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def two_nodes() -> list:
    return expand([NodeGroup(count=2, gpu_model="v100-32gb", gpu_count=1, host_mem_gb=64)])


async def _events(bus: Bus, job: str) -> list:
    return by_job(await lifecycle_events(bus)).get(job, [])


async def _ended(bus: Bus, job: str) -> list:
    evs = await _events(bus, job)
    return evs if any(is_terminal(e) for e in evs) else []


async def test_a_job_its_node_no_longer_runs_is_requeued_and_a_finished_one_never(nats_url):
    nodes = two_nodes()
    bus = await connect(nats_url)
    await put_nodes(bus, nodes)
    executor = FakeExecutor(bus, run_s=0.3, hold={"victim"})
    await executor.start()
    reporter = Reporter(bus, executor, [n.id for n in nodes])
    reporter.start()
    scorer = start_in_process("scorer", scorer_main, nats_url, rescore_s=0.5, debounce_s=0.05)
    p, task, stop, pbus = await _placer(nats_url, "solo")
    try:
        await submit(bus, JobSpec(id="victim", gpus=1, priority=9))
        first = await poll(lambda: _placed(bus, "victim", 1), timeout_s=20)
        await poll(lambda: _started(bus, "victim", 1), timeout_s=10)
        for i in range(4):  # finish normally while reports run: never requeued
            await submit(bus, JobSpec(id=f"ok-{i}", gpus=1))
        for i in range(4):
            await poll(lambda i=i: _ended(bus, f"ok-{i}"), timeout_s=30)
        await asyncio.sleep(5 * INTERVAL_S)  # reports keep listing the victim: it stays
        assert not any(isinstance(e, Preempted) for e in await _events(bus, "victim"))
        executor.hold.discard("victim")  # its next attempt may finish
        reporter.forget("victim", 1, first.node)  # the executor restarted without it
        per = await poll(lambda: _ended(bus, "victim"), timeout_s=30)
        kv = await bus.kv(subjects.KV_LEDGER, Allocation)
        await poll(lambda: _empty(kv), timeout_s=10)
    finally:
        stop.set()
        await task
        await pbus.close()
        assert await scorer.close() == 0
        await reporter.close()
        await executor.close()
    preempted = [e for e in per if isinstance(e, Preempted)]
    assert len(preempted) == 1 and preempted[0].reason == f"lost: not running on {first.node}"
    assert [e.attempt for e in per if isinstance(e, Placed)] == [1, 2]
    assert isinstance(per[-1], Completed)
    assert p.placed_count == 6  # the victim twice, each ok job once
    for i in range(4):
        evs = await _events(bus, f"ok-{i}")
        assert not any(isinstance(e, Preempted) for e in evs), evs
        assert sum(isinstance(e, Placed) for e in evs) == 1
    await bus.close()


# soak-length: make test-all; a node that goes silent and its requeued jobs stay covered by
# tests/e2e/test_reconcile_stack.py
@pytest.mark.slow
async def test_a_silent_node_is_down_its_jobs_move_and_it_comes_back(nats_url):
    nodes = two_nodes()
    bus = await connect(nats_url)
    await put_nodes(bus, nodes)
    executor = FakeExecutor(bus, run_s=0.3, hold={"x", "y"})
    await executor.start()
    reporter = Reporter(bus, executor, [n.id for n in nodes])
    reporter.start()
    scorer = start_in_process("scorer", scorer_main, nats_url, rescore_s=0.5, debounce_s=0.05)
    p, task, stop, pbus = await _placer(nats_url, "solo")
    try:
        await submit(bus, JobSpec(id="x", gpus=1))
        first = await poll(lambda: _placed(bus, "x", 1), timeout_s=20)
        other = next(n.id for n in nodes if n.id != first.node)
        reporter.silent.add(first.node)  # its executor (or the whole node) died
        second = await poll(lambda: _placed(bus, "x", 2), timeout_s=20)
        assert second.node == other  # the down node gets nothing
        assert first.node in p.reconciler.down
        preempted = [e for e in await _events(bus, "x") if isinstance(e, Preempted)]
        assert len(preempted) == 1 and f"node {first.node} down" in preempted[0].reason
        # it is back, still running the attempt the placer moved (its executor re-adopted it):
        # that attempt is stopped silently, the job ends once, from its new attempt
        reporter.stale[first.node] = ("x", 1)
        reporter.silent.clear()
        await poll(lambda: asyncio.sleep(0, not p.reconciler.down), timeout_s=10)
        stop_cmd = await poll(lambda: _kill_for(bus, first.node), timeout_s=10)
        assert (stop_cmd.job_id, stop_cmd.attempt, stop_cmd.silent) == ("x", 1, True)
        del reporter.stale[first.node]
        await submit(bus, JobSpec(id="y", gpus=1))  # the only free GPU is on the node back
        y = await poll(lambda: _placed(bus, "y", 1), timeout_s=20)
        assert y.node == first.node
    finally:
        stop.set()
        await task
        await pbus.close()
        assert await scorer.close() == 0
        await reporter.close()
        await executor.close()
    await bus.close()


async def _kill_for(bus: Bus, node: str) -> KillCommand | None:
    """The newest kill command on ``node.<node>.kill`` in the NODECMD stream, if any."""
    try:
        msg = await bus.js.get_last_msg(
            subjects.STREAM_NODECMD, subjects.node_command(node, "kill")
        )
    except Exception:
        return None
    return msgspec.json.decode(msg.data, type=KillCommand)


async def _placed(bus: Bus, job: str, attempt: int) -> Placed | None:
    for e in await _events(bus, job):
        if isinstance(e, Placed) and e.attempt == attempt:
            return e
    return None


async def _started(bus: Bus, job: str, attempt: int) -> bool:
    return any(
        getattr(e, "attempt", 0) == attempt
        for e in await _events(bus, job)
        if type(e).__name__ == "Started"
    )


async def _empty(kv) -> bool:
    return await kv.items() == {}
