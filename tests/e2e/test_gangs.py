"""Multi-node gangs, live (issue 15), on a real nats-server: the real scorer, placer and two
real executors (simulated GPUs), one per 8-GPU node. A 16-GPU job gets one ledger entry with a
part on each node; both executors start their part together (neither runs before both are
ready) and end together, and the job has exactly one lifecycle; killing one part ends the whole
gang, once."""

from __future__ import annotations

import asyncio
import time

import msgspec

from libs.bus import Bus
from libs.clock import Clock
from libs.policy.inventory import NodeGroup, expand
from proto import subjects
from proto.commands import KillCommand
from proto.events import Completed, Failed, Placed, Started, is_terminal
from proto.gangs import GangSignal
from proto.jobs import JobSpec
from proto.ledger import Allocation
from services.executor.service import main as executor_main
from services.placer.service import main as placer_main
from services.scorer.service import main as scorer_main
from tests.services._scorer_util import (
    by_job,
    connect,
    lifecycle_events,
    poll,
    put_nodes,
    start_in_process,
    submit,
)

FACTOR = 200.0  # Mosaic seconds per wall second
FAST = {"tick_s": 0.5, "debounce_s": 0.02, "settle_s": 0.2, "lease_ttl_s": 2.0}
NODES = expand([NodeGroup(count=2, gpu_model="a100-80gb", gpu_count=8, host_mem_gb=256, cpus=64)])


class Signals:
    """Every gang signal of a job, with the wall time it was heard."""

    def __init__(self) -> None:
        self.heard: list[tuple[float, GangSignal]] = []

    async def start(self, bus: Bus, job: str) -> None:
        async def on(sig: GangSignal) -> None:
            self.heard.append((time.monotonic(), sig))

        await bus.subscribe(subjects.gang(job, 1), GangSignal, on)

    def first(self, node: str, state: str) -> float | None:
        return next((t for t, s in self.heard if s.node == node and s.state == state), None)

    def all_said(self, state: str, nodes: list[str]):
        """A check for ``poll``: every node of ``nodes`` said ``state``."""

        async def check() -> bool:
            return all(self.first(n, state) is not None for n in nodes)

        return check


async def _stack(nats_url: str, tmp_path):
    clock = Clock(epoch=time.time(), factor=FACTOR)
    bus = await connect(nats_url)
    await put_nodes(bus, NODES)
    executors = [
        start_in_process(
            "executor",
            executor_main,
            nats_url,
            clock=clock,
            mode="sim",
            node_spec=[msgspec.json.encode(n).decode()],
            log_dir=str(tmp_path / n.id),
            state_dir=str(tmp_path / f"state-{n.id}"),
            report_interval=0.5,
        )
        for n in NODES
    ]
    scorer = start_in_process("scorer", scorer_main, nats_url, clock=clock, rescore_s=1.0,
                              debounce_s=0.05)  # fmt: skip
    placer = start_in_process("placer", placer_main, nats_url, clock=clock, **FAST)
    return bus, [*executors, scorer, placer]


async def _close(services) -> None:
    for s in reversed(services):
        assert await s.close() == 0


async def _terminal(bus: Bus, job: str):
    evs = by_job(await lifecycle_events(bus)).get(job, [])
    return evs if any(is_terminal(e) for e in evs) else None


async def _ledger(bus: Bus) -> dict[str, Allocation]:
    kv = await bus.kv(subjects.KV_LEDGER, Allocation)
    return {k: e.value for k, e in (await kv.items()).items()}


async def test_a_two_node_gang_starts_together_and_ends_together(nats_url, tmp_path):
    bus, services = await _stack(nats_url, tmp_path)
    sig = Signals()
    await sig.start(bus, "gang")
    try:
        spec = JobSpec(id="gang", gpus=16, gpu_mem_gb=40, host_mem_gb=64, cpus=16,
                       est_runtime_s=400.0)  # fmt: skip
        await submit(bus, spec)
        entry = (await poll(lambda: _ledger(bus), timeout_s=20))["gang"]
        assert {p.node for p in entry.parts} == {n.id for n in NODES}  # one entry, both nodes
        assert sum(len(p.gpu_indices) for p in entry.parts) == 16
        evs = await poll(lambda: _terminal(bus, "gang"), timeout_s=30)
        await poll(sig.all_said("ended", [n.id for n in NODES]))
        await poll(lambda: _empty(bus), timeout_s=10)
    finally:
        await _close(services)
    # started together: neither part ran before the other said it was ready
    runs = {n.id: sig.first(n.id, "running") for n in NODES}
    readies = {n.id: sig.first(n.id, "ready") for n in NODES}
    assert all(runs.values()) and all(readies.values())
    assert max(readies.values()) <= min(runs.values()) + 0.25  # one heartbeat of slack
    ends = [sig.first(n.id, "ended") for n in NODES]
    assert max(ends) - min(ends) < 1.0  # ended together (the simulated run is 2 wall s)
    # one lifecycle: placed once, started once, one terminal event, from the leader's node
    assert sum(isinstance(e, Placed) for e in evs) == 1
    assert sum(isinstance(e, Started) for e in evs) == 1
    assert sum(is_terminal(e) for e in evs) == 1 and isinstance(evs[-1], Completed)
    assert evs[-1].node == entry.node
    await bus.close()


async def _empty(bus: Bus) -> bool:
    return await _ledger(bus) == {}


async def test_killing_one_part_ends_the_whole_gang_once(nats_url, tmp_path):
    bus, services = await _stack(nats_url, tmp_path)
    sig = Signals()
    await sig.start(bus, "long")
    try:
        spec = JobSpec(id="long", gpus=16, gpu_mem_gb=40, est_runtime_s=360_000.0)
        await submit(bus, spec)
        entry = (await poll(lambda: _ledger(bus), timeout_s=20))["long"]
        other = next(p.node for p in entry.parts if p.node != entry.node)  # not the leader
        await poll(sig.all_said("running", [entry.node, other]))
        await bus.publish(subjects.node_command(other, "kill"),
                          KillCommand(job_id="long", reason="operator killed a part"))  # fmt: skip
        evs = await poll(lambda: _terminal(bus, "long"), timeout_s=15)
        await poll(sig.all_said("ended", [entry.node, other]))
        await poll(lambda: _empty(bus), timeout_s=10)
        await asyncio.sleep(1.0)  # nothing more comes
        evs = by_job(await lifecycle_events(bus))["long"]
    finally:
        await _close(services)
    assert sum(is_terminal(e) for e in evs) == 1
    end = next(e for e in evs if is_terminal(e))
    assert isinstance(end, Failed) and other in end.reason and "operator killed" in end.reason
    assert sum(isinstance(e, Started) for e in evs) == 1
    await bus.close()
