"""The placer on a real NATS server, with the real scorer and a stand-in executor: jobs are
placed without ever over-allocating a node, impossible jobs fail with the reason, cancels work,
a standby takes over, and a SIGKILLed placer loses nothing and places nothing twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import msgspec
import pytest

from libs.bus import Bus
from libs.clock import Clock
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from libs.policy.inventory import NodeGroup, demo_cluster, expand
from proto import subjects
from proto.decisions import Decision
from proto.events import Cancelled, Completed, Failed, Placed, Queued, is_terminal
from proto.jobs import CancelRequest, JobSpec
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from services.placer.service import Placer, PlacerSettings
from services.placer.service import main as placer_main
from services.scorer.service import main as scorer_main
from tests.services._placer_checks import LedgerChecker
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = {"tick_s": 0.5, "debounce_s": 0.02, "settle_s": 0.2, "lease_ttl_s": 2.0}


def small_cluster() -> list[NodeSpec]:
    """Two 4-GPU nodes: a V100 and a T4, so jobs wait and flow in waves."""
    return expand(
        [
            NodeGroup(count=1, gpu_model="v100-32gb", gpu_count=4, host_mem_gb=128, cpus=32),
            NodeGroup(count=1, gpu_model="t4", gpu_count=4, host_mem_gb=64, cpus=32),
        ]
    )


async def _all_terminal(bus: Bus, jobs: set[str]) -> dict:
    per = by_job(await lifecycle_events(bus))
    done = {j for j in jobs if any(is_terminal(e) for e in per.get(j, []))}
    return per if done == jobs else {}


async def _ledger_empty(bus: Bus) -> bool:
    kv = await bus.kv(subjects.KV_LEDGER, Allocation)
    return await kv.items() == {}


async def _decisions(bus: Bus) -> list[Decision]:
    info = await bus.js.stream_info(subjects.STREAM_DECISIONS)
    out = []
    for seq in range(1, info.state.last_seq + 1):
        m = await bus.js.get_msg(subjects.STREAM_DECISIONS, seq)
        out.append(msgspec.json.decode(m.data, type=Decision))
    return out


def _mixed_jobs(n: int) -> list[JobSpec]:
    shapes = [
        {"gpus": 1, "gpu_mem_gb": 8, "host_mem_gb": 16},
        {"gpus": 0.5, "gpu_mem_gb": 6, "host_mem_gb": 8},
        {"gpus": 2, "gpu_mem_gb": 40, "host_mem_gb": 64},  # 40 GB per GPU: A100 only
        {"gpus": 8, "gpu_mem_gb": 12, "host_mem_gb": 48},
        {"gpus": 4, "gpu_mem_gb": 24, "host_mem_gb": 100},
        {"gpus": 1, "gpu_mem_gb": 14, "host_mem_gb": 60, "constraints": ("t4",)},
    ]
    return [
        JobSpec(id=f"m-{i:03d}", priority=i % 10, tenant=f"t{i % 3}", **shapes[i % len(shapes)])
        for i in range(n)
    ]


async def test_places_every_job_and_never_overallocates(nats_url):
    nodes = demo_cluster()
    bus = await connect(nats_url)
    await put_nodes(bus, nodes)
    checker = LedgerChecker(nodes)
    await checker.start(bus)
    executor = FakeExecutor(bus, run_s=0.4)
    await executor.start()
    scorer = start_in_process("scorer", scorer_main, nats_url, rescore_s=1.0, debounce_s=0.05)
    placer = start_in_process("placer", placer_main, nats_url, **FAST)
    jobs = _mixed_jobs(90)
    try:
        for spec in jobs:
            await submit(bus, spec)
        ids = {j.id for j in jobs}
        per = await poll(lambda: _all_terminal(bus, ids), timeout_s=90, every_s=0.5)
        await poll(lambda: _ledger_empty(bus))  # every allocation freed
    finally:
        assert await placer.close() == 0
        assert await scorer.close() == 0
        await executor.close()
    assert checker.problems == []
    assert checker.changes >= 2 * len(jobs)  # every job was written and freed
    assert checker.peak > 10  # many ran at once
    specs = {j.id: j for j in jobs}
    for job, evs in per.items():
        placed = [e for e in evs if isinstance(e, Placed)]
        assert len(placed) == 1, job
        assert sum(is_terminal(e) for e in evs) == 1, job
        # the scorer's score announcements (Queued) race a 0.4 s job: one may land after its
        # end, which every read model ignores (an ended job ignores every later event); every
        # event that changes a job's state comes before its end
        changes = [e for e in evs if not isinstance(e, Queued)]
        assert isinstance(changes[-1], Completed), job
        if specs[job].gpu_mem_gb > 16:
            assert not placed[0].node.startswith("t4"), job
        if specs[job].constraints == ("t4",):
            assert placed[0].node.startswith("t4"), job
    assert executor.duplicates == 0
    places = [d for d in await _decisions(bus) if d.action == "place"]
    assert sorted(d.job_id for d in places) == sorted(ids)
    for d in places:
        assert d.node in {c.node for c in d.candidates}
        assert d.trace_id and len(d.trace_id) == 32
        assert all({"speed", "pack"} <= set(c.terms) for c in d.candidates)
    await bus.close()


async def test_job_no_node_can_hold_fails_with_the_reason(nats_url):
    bus = await connect(nats_url)
    await put_nodes(bus, small_cluster())
    executor = FakeExecutor(bus, run_s=0.2)
    await executor.start()
    scorer = start_in_process("scorer", scorer_main, nats_url, rescore_s=1.0, debounce_s=0.05)
    placer = start_in_process("placer", placer_main, nats_url, **FAST)
    try:
        await submit(bus, JobSpec(id="too-wide", gpus=8))  # nodes have 4 GPUs
        await submit(bus, JobSpec(id="too-big", gpus=1, gpu_mem_gb=40))  # 32 GB at most
        await submit(bus, JobSpec(id="fine", gpus=1))
        per = await poll(lambda: _all_terminal(bus, {"too-wide", "too-big", "fine"}), timeout_s=30)
    finally:
        assert await placer.close() == 0
        assert await scorer.close() == 0
        await executor.close()
    for job, word in (("too-wide", "GpuCount"), ("too-big", "GpuMemory")):
        failed = [e for e in per[job] if isinstance(e, Failed)]
        assert len(failed) == 1 and word in failed[0].reason, per[job]
        assert not any(isinstance(e, Placed) for e in per[job])
    assert isinstance(per["fine"][-1], Completed)
    refusals = {d.job_id: d for d in await _decisions(bus) if d.action == "refuse"}
    assert set(refusals) == {"too-wide", "too-big"}
    assert set(refusals["too-wide"].filtered) == {n.id for n in small_cluster()}
    await bus.close()


async def test_cancel_pending_and_running_jobs(nats_url):
    one = expand([NodeGroup(count=1, gpu_model="v100-32gb", gpu_count=1, host_mem_gb=64)])
    bus = await connect(nats_url)
    await put_nodes(bus, one)
    executor = FakeExecutor(bus, run_s=0.2, hold={"runner"})
    await executor.start()
    scorer = start_in_process("scorer", scorer_main, nats_url, rescore_s=1.0, debounce_s=0.05)
    placer = start_in_process("placer", placer_main, nats_url, **FAST)
    kv = await bus.kv(subjects.KV_LEDGER, Allocation)
    try:
        await submit(bus, JobSpec(id="runner", gpus=1, priority=9))
        await poll(lambda: kv.get("runner"))
        await submit(bus, JobSpec(id="waiter", gpus=1))
        await submit(bus, JobSpec(id="next", gpus=1, priority=0))
        await asyncio.sleep(0.5)  # both wait: the only GPU is busy
        assert await kv.get("waiter") is None
        await bus.publish(subjects.SUBJECT_CANCEL, CancelRequest(job_id="waiter"))
        await poll(lambda: _all_terminal(bus, {"waiter"}))
        await bus.publish(subjects.SUBJECT_CANCEL, CancelRequest(job_id="runner"))
        per = await poll(lambda: _all_terminal(bus, {"runner", "waiter", "next"}), timeout_s=30)
        await poll(lambda: _ledger_empty(bus))
    finally:
        assert await placer.close() == 0
        assert await scorer.close() == 0
        await executor.close()
    assert [type(e) for e in per["waiter"] if isinstance(e, (Placed, Cancelled))] == [Cancelled]
    runner = [type(e).__name__ for e in per["runner"]]
    assert runner.count("Placed") == 1 and runner[-1] == "Cancelled"
    assert isinstance(per["next"][-1], Completed)  # took the GPU the cancel freed
    await bus.close()


async def _placer(url: str, holder: str) -> tuple[Placer, asyncio.Task[None], asyncio.Event, Bus]:
    bus = await Bus.connect(url, "placer")
    settings = PlacerSettings(holder=holder, **FAST)
    p = Placer(bus, Clock.from_env(), get_logger(service=holder), setup_tracing("placer"), settings)
    await p.start()
    stop = asyncio.Event()
    return p, asyncio.create_task(p.run(stop)), stop, bus


async def test_standby_waits_then_takes_over(nats_url):
    nodes = small_cluster()
    bus = await connect(nats_url)
    await put_nodes(bus, nodes)
    executor = FakeExecutor(bus, run_s=0.2)
    await executor.start()
    scorer = start_in_process("scorer", scorer_main, nats_url, rescore_s=1.0, debounce_s=0.05)
    p1, t1, s1, b1 = await _placer(nats_url, "first")
    await poll(lambda: asyncio.sleep(0, p1.active))
    p2, t2, s2, b2 = await _placer(nats_url, "second")
    try:
        first = {f"a-{i}" for i in range(6)}
        for j in sorted(first):
            await submit(bus, JobSpec(id=j, gpus=1))
        await poll(lambda: _all_terminal(bus, first), timeout_s=30)
        assert p1.placed_count == len(first)
        assert p2.placed_count == 0 and not p2.active
        s1.set()  # the active stops (and hands the lease back)
        await t1
        await poll(lambda: asyncio.sleep(0, p2.active), timeout_s=10)
        second = {f"b-{i}" for i in range(6)}
        for j in sorted(second):
            await submit(bus, JobSpec(id=j, gpus=1))
        per = await poll(lambda: _all_terminal(bus, first | second), timeout_s=30)
    finally:
        s1.set()
        s2.set()
        await asyncio.gather(t1, t2)
        await b1.close()
        await b2.close()
        assert await scorer.close() == 0
        await executor.close()
    assert p2.placed_count == len(second)
    assert all(sum(isinstance(e, Placed) for e in per[j]) == 1 for j in first | second)
    await bus.close()


def _start_placer_process(url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MOSAIC_NATS_URL": url, "MOSAIC_LOG_FORMAT": "json"}
    args = [sys.executable, "-m", "services.placer", "--lease-ttl-s", "1", "--tick-s", "0.5"]
    args += ["--settle-s", "0.2", "--debounce-s", "0.02"]
    return subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


# make test-all; a SIGKILLed placer stays covered by
# tests/e2e/test_stack.py::test_placer_killed_and_restarted_loses_nothing
@pytest.mark.slow
async def test_sigkilled_placer_restarts_without_losing_or_repeating(nats_url):
    nodes = small_cluster()
    bus = await connect(nats_url)
    await put_nodes(bus, nodes)
    checker = LedgerChecker(nodes)
    await checker.start(bus)
    executor = FakeExecutor(bus, run_s=0.3)
    await executor.start()
    scorer = start_in_process("scorer", scorer_main, nats_url, rescore_s=1.0, debounce_s=0.05)
    jobs = [JobSpec(id=f"k-{i:02d}", gpus=1 + i % 2, gpu_mem_gb=8) for i in range(40)]
    ids = {j.id for j in jobs}
    proc = _start_placer_process(nats_url)
    try:
        for spec in jobs:
            await submit(bus, spec)

        async def some_done() -> bool:
            per = by_job(await lifecycle_events(bus))
            return sum(isinstance(e, Completed) for evs in per.values() for e in evs) >= 8

        await poll(some_done, timeout_s=60, every_s=0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        placed_before = sum(isinstance(e, Placed) for e in await lifecycle_events(bus))
        assert placed_before < len(ids)  # it really died mid-run
        await asyncio.sleep(0.5)  # jobs keep finishing while no placer runs
        proc = _start_placer_process(nats_url)
        per = await poll(lambda: _all_terminal(bus, ids), timeout_s=90, every_s=0.5)
        await poll(lambda: _ledger_empty(bus))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert await scorer.close() == 0
        await executor.close()
    for job in ids:
        evs = per[job]
        assert sum(isinstance(e, Placed) for e in evs) == 1, job
        assert sum(is_terminal(e) for e in evs) == 1, job
        # the scorer's score announcements (Queued) race a 0.4 s job: one may land after its
        # end, which every read model ignores (an ended job ignores every later event); every
        # event that changes a job's state comes before its end
        changes = [e for e in evs if not isinstance(e, Queued)]
        assert isinstance(changes[-1], Completed), job
    assert {r.allocation.job_id for r in executor.runs} == ids
    assert len(executor.runs) == len(ids)
    assert checker.problems == []
    await bus.close()


async def test_takeover_finishes_what_a_crashed_placer_left_half_done(nats_url):
    """A predecessor wrote the ledger and died before announcing it: the next active placer
    sends the Placed event and the run command (same message ids), and the job completes."""
    nodes = small_cluster()
    bus = await connect(nats_url)
    await put_nodes(bus, nodes)
    spec = JobSpec(id="orphan", gpus=2, submit_time=time.time())
    await submit(bus, spec)
    kv = await bus.kv(subjects.KV_LEDGER, Allocation)
    alloc = Allocation(
        job_id="orphan",
        node=nodes[0].id,
        gpu_indices=(0, 1),
        gpu_share=1.0,
        gpu_mem_gb=spec.gpu_mem_gb,
        host_mem_gb=spec.host_mem_gb,
        cpus=spec.cpus,
        time=time.time(),
        spec=spec,
    )
    await kv.create("orphan", alloc)
    executor = FakeExecutor(bus, run_s=0.2)
    await executor.start()
    scorer = start_in_process("scorer", scorer_main, nats_url, rescore_s=1.0, debounce_s=0.05)
    placer = start_in_process("placer", placer_main, nats_url, **FAST)
    try:
        per = await poll(lambda: _all_terminal(bus, {"orphan"}), timeout_s=30)
        await poll(lambda: _ledger_empty(bus))
    finally:
        assert await placer.close() == 0
        assert await scorer.close() == 0
        await executor.close()
    kinds = [type(e).__name__ for e in per["orphan"] if not isinstance(e, Queued)]
    assert kinds == ["Submitted", "Placed", "Started", "Completed"]
    assert [r.allocation.gpu_indices for r in executor.runs] == [(0, 1)]
    await bus.close()


def test_a_failed_warm_up_is_logged_and_the_placer_goes_on():
    """The placer loads the pass's compiled loops in the background at start; if that fails,
    it says so in its log (the first cycle then loads them itself)."""

    class Log:
        def __init__(self) -> None:
            self.warnings: list[tuple[str, dict]] = []

        def warning(self, event: str, **kw) -> None:
            self.warnings.append((event, kw))

    async def fail() -> None:
        raise RuntimeError("no compiler")

    async def run(log: Log) -> None:
        placer = Placer(None, Clock(epoch=time.time()), log, None)  # type: ignore[arg-type]
        task = asyncio.create_task(fail())
        task.add_done_callback(placer._warmed)
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)  # the done callback runs on the next loop step

    log = Log()
    asyncio.run(run(log))
    assert log.warnings and log.warnings[0][0] == "warm_up_failed"
    assert "no compiler" in log.warnings[0][1]["error"]
