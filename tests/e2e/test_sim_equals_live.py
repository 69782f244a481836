"""Sim == live (issue 13, the acceptance test): one workload through the simulator and through the
live services on a real NATS gives the same placements, in order, and the same power decisions.

The live side runs the real gateway (jobs submitted over HTTP), placer and simulated executor
on a stepped clock (``libs.clock.SteppedClock``, ``libs.bus.steps``): the test is the controller
and steps Mosaic time to every instant the simulator's engine would handle (an arrival, a job's
end, a node's boot, the scheduler's next backfill or power check, each reported by the service
that owns it in its step ack), and every service settles each step before the next. Within a
step, the executors settle ends and boots first, the test submits that instant's arrivals, and
then the placer decides once (the step's decide phase), as the engine runs one pass per instant
after its events.

The workload (seeded): a first wave of mixed jobs (fractions to 8-GPU jobs, two 16-GPU gangs over
two nodes, priorities, two
deadlines, green jobs, half of them checkpointable) on the 10-node demo cluster, more than it
holds at once, so the priority-protection rule moves jobs (a checkpoint that costs time on both
sides, a requeue, a resume in the room held for it); a quiet hour in which idle nodes are
suspended; a second wave that wakes them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import msgspec
import pytest

from libs.bus import Bus
from libs.bus.server import free_port
from libs.bus.steps import StepController
from libs.clock import SteppedClock
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from libs.policy.config import PolicyConfig
from libs.policy.inventory import demo_cluster
from libs.policy.profiles import ProfileTable
from libs.policy.stages.boot import BOOT_RULE
from libs.policy.stages.preempt import PRIORITY_RULE
from libs.policy.stages.short_wait import SHORT_RULE
from libs.sim.baselines.mosaic import Mosaic
from libs.sim.engine import simulate
from libs.sim.trace import TraceJob
from proto import subjects
from proto.events import Completed, LifecycleEvent, Placed, is_terminal
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from proto.power import PowerCommand
from services.executor.service import main as executor_main
from services.gateway.service import main as gateway_main
from services.placer.service import Placer
from services.placer.settings import PlacerSettings
from tests.services._gateway_auth import ADMIN, admin_token_file
from tests.services._scorer_util import lifecycle_events, poll, put_nodes, start_in_process
from tests.services.test_gateway import _healthy

GANGS = (12, 85)  # the jobs of the workload that span nodes
SHAPES = ((0.25, 4.0), (0.5, 8.0), (1, 16.0), (1, 30.0), (2, 16.0), (4, 40.0), (8, 60.0))
CLASSES = ("cnn", "rnn", "transformer", "recommendation", "other")


def workload(seed: int = 7, long_every: int = 0) -> list[tuple[float, JobSpec]]:
    """(arrival time, spec) of 110 jobs: 70 over the first 1,400 s, 40 from t=9,000 s.
    ``long_every``: every such checkpointable job of the first 70 runs 6 h instead (long
    work the short-wait rule may stop for the short ones, ``stages.short_wait``)."""
    rng = random.Random(seed)
    out: list[tuple[float, JobSpec]] = []
    times = [0.0, *sorted(rng.uniform(0, 1400) for _ in range(69))]
    times += sorted(rng.uniform(9000, 9600) for _ in range(40))
    for i, t in enumerate(times):
        gpus, mem = rng.choice(SHAPES)
        if i in GANGS:  # wider than any node: two A100 nodes (issue 15)
            gpus, mem = 16, 60.0
        runtime = rng.choice((300.0, 600.0, 1200.0, 2400.0))
        t = round(t, 1)
        deadline = t + 2 * runtime if i in (5, 80) else None
        spec = JobSpec(
            id=f"w-{i:03d}",
            tenant=rng.choice(("vision", "nlp", "ads")),
            priority=rng.choice((2, 5, 5, 7, 9)),
            gpus=gpus,
            gpu_mem_gb=mem,
            host_mem_gb=8.0 * max(1.0, gpus),
            cpus=2.0 * max(1.0, gpus),
            workload_class=rng.choice(CLASSES),
            est_runtime_s=runtime,
            energy_sensitivity=rng.choice((0.0, 0.0, 0.9)),
            deadline=deadline,
            checkpointable=rng.random() < 0.5,  # work the priority-protection rule may move
        )
        if long_every and i < 70 and i % long_every == 0 and spec.checkpointable:
            spec = msgspec.structs.replace(spec, est_runtime_s=6 * 3600.0)
        out.append((t, spec))
    return out


@dataclass
class Record:
    placements: list[tuple[float, str, str, tuple[int, ...]]]
    power: list[tuple[float, str, str]]
    end_s: float
    moves: list[tuple[float, str, str]]  # (when decided, job, node it leaves)
    reasons: tuple[str, ...] = ()  # each move's reason (the simulator's only)


class Recording(Mosaic):
    """The simulator's Mosaic, writing down what it decides (nothing else changes)."""

    def attach(self, ctx) -> None:  # type: ignore[override]
        super().attach(ctx)
        self.placed: list[tuple[float, str, str, tuple[int, ...]]] = []
        self.powered: list[tuple[float, str, str]] = []
        self.moved: list[tuple[float, str, str]] = []
        # the same moves with the size each resumes on (a shrink or a grow; 0: its own size)
        self.resized: list[tuple[float, str, str, int]] = []
        self.reasons: list[str] = []

    def move_step(self, now):  # type: ignore[override]
        out = super().move_step(now)
        self.moved += [(now, job.spec.id, job.allocs[0].node) for job, _, _, _ in out]
        self.resized += [(now, job.spec.id, job.allocs[0].node, to) for job, _, _, to in out]
        self.reasons += [reason for _, _, reason, _ in out]
        return out

    def schedule(self, queue, view, running, now):  # type: ignore[override]
        out = super().schedule(queue, view, running, now)
        for job, allocs in out:  # a gang: its leader (the node its Placed event names)
            a = allocs[0]
            self.placed.append((now, job.spec.id, a.node, tuple(a.gpu_indices)))
        return out

    def power_step(self, now):  # type: ignore[override]
        suspend, resume, nxt = super().power_step(now)
        self.powered += [(now, "suspend", n) for n in suspend]
        self.powered += [(now, "wake", n) for n in resume]
        return suspend, resume, nxt


class StartsAfterTick(Recording):
    """The simulator's Mosaic told of starts in the live placer's order: the engine starts a
    pass's jobs at once, before the instant's moves and power step; the live placer commits
    them (and reports ``start_job``) only after its whole ``tick``. Held back until the power
    step has run, so one in-process run shows whether that order changes any decision."""

    def attach(self, ctx) -> None:  # type: ignore[override]
        super().attach(ctx)
        self.held: list[tuple] = []

    def started(self, job, now) -> None:  # type: ignore[override]
        self.held.append((job, now))

    def flush(self) -> None:
        held, self.held = self.held, []
        for job, now in held:
            super().started(job, now)

    def power_step(self, now):  # type: ignore[override]
        out = super().power_step(now)
        self.flush()
        return out

    def ended(self, job, now) -> None:  # type: ignore[override]
        self.flush()  # no instant without a power step (the engine's last ones): not late
        super().ended(job, now)


def simulated(
    jobs: list[tuple[float, JobSpec]],
    nodes: list[NodeSpec],
    policy_cls=None,
    cfg: PolicyConfig | None = None,
) -> Record:
    profiles = ProfileTable.default().covering(nodes)
    policy = (policy_cls or Recording)(cfg or PolicyConfig.default())
    trace = [TraceJob(spec=s, submit_s=t) for t, s in jobs]
    result = simulate(trace, nodes, policy, profiles)
    end = max(j.end_s for j in result.jobs)
    return Record(policy.placed, policy.powered, end, policy.moved, tuple(policy.reasons))


@dataclass
class Live:
    bus: Bus
    placer: Placer
    controller: StepController
    http: aiohttp.ClientSession
    base: str
    power: list[tuple[float, str, str]]
    done: set[str]


@pytest.fixture
async def live(nats_url: str, tmp_path, request) -> AsyncIterator[Live]:
    """The live services; ``request.param`` (indirect parametrisation), where given, is the
    placer's PolicyConfig, else the defaults."""
    cfg: PolicyConfig | None = getattr(request, "param", None)
    nodes = demo_cluster()
    bus = await Bus.connect(nats_url, "test")
    await bus.ensure_topology()
    await put_nodes(bus, nodes)
    port = free_port()
    services = [
        start_in_process(
            "gateway",
            gateway_main,
            nats_url,
            clock=SteppedClock(epoch=0.0),
            http_host="127.0.0.1",
            http_port=port,
            admin_token_file=str(admin_token_file()),
        ),
        start_in_process(
            "executor",
            executor_main,
            nats_url,
            clock=SteppedClock(epoch=0.0),
            mode="sim",
            node_spec=[msgspec.json.encode(n).decode() for n in nodes],
            log_dir=str(tmp_path / "logs"),
            report_interval=0.5,
            boot_s=PolicyConfig.default().resume_s,
            step_name="executor",
        ),
    ]
    pbus = await Bus.connect(nats_url, "placer")
    settings = PlacerSettings(holder="live", tick_s=0.5, debounce_s=0.0, settle_s=0.0)
    log, tracer = get_logger(service="placer"), setup_tracing("placer")
    placer = Placer(pbus, SteppedClock(epoch=0.0), log, tracer, settings, policy=cfg)
    await placer.start()
    placer_stop = asyncio.Event()
    placer_task = asyncio.create_task(placer.run(placer_stop))
    power: list[tuple[float, str, str]] = []
    done: set[str] = set()

    async def on_power(cmd: PowerCommand) -> None:
        power.append((cmd.time, cmd.action, cmd.node))

    async def on_event(ev: LifecycleEvent) -> None:
        if is_terminal(ev):
            done.add(ev.job_id)

    await bus.subscribe(f"{subjects.NODE_PREFIX}.*.{subjects.POWER_VERB}", PowerCommand, on_power)
    await bus.subscribe(f"{subjects.LIFECYCLE_PREFIX}.>", LifecycleEvent, on_event)
    controller = StepController(bus, ["executor", "placer"], timeout_s=60)
    await controller.start()
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        await poll(lambda: _healthy(http, base), timeout_s=30)
        await poll(lambda: asyncio.sleep(0, placer.active), timeout_s=30)
        await poll(lambda: asyncio.sleep(0, len(placer.nodes) == len(nodes)), timeout_s=30)
        try:
            yield Live(bus, placer, controller, http, base, power, done)
        finally:
            placer_stop.set()
            await placer_task
            codes = [await s.close() for s in services]
            await controller.stop()
            await pbus.close()
            await bus.close()
    assert codes == [0, 0]


async def lived(live: Live, jobs: list[tuple[float, JobSpec]]) -> Record:
    """Step the live services through the workload (see the module docstring)."""
    arrivals: dict[float, list[JobSpec]] = {}
    for t, s in jobs:
        arrivals.setdefault(t, []).append(s)
    todo = sorted(arrivals)
    want = {s.id for _, s in jobs}

    async def submit(t: float) -> None:
        for spec in arrivals.get(t, []):
            body = msgspec.json.encode(spec)
            headers = {"Content-Type": "application/json"}
            async with live.http.post(f"{live.base}/v1/jobs", data=body, headers=headers) as r:
                assert r.status == 201, await r.text()
        ids = {s.id for s in arrivals.get(t, [])}
        await poll(lambda: asyncio.sleep(0, ids <= set(live.placer.tracker.specs)), timeout_s=20)

    t = 0.0
    steps = 0
    while True:
        await live.controller.step(t, decide=True, before_decide=lambda t=t: submit(t))
        steps += 1
        assert steps < 5000, "the live run does not end"
        if want <= live.done and not [a for a in todo if a > t]:
            break
        due = [a for a in todo if a > t][:1]
        nxt = live.controller.next_s()
        t = min(due + ([nxt] if nxt is not None and nxt > t else []))
    events = await lifecycle_events(live.bus)
    placed = [
        (e.time, e.job_id, e.node, tuple(e.gpu_indices)) for e in events if isinstance(e, Placed)
    ]
    ends = [e.time for e in events if isinstance(e, Completed)]
    info = await live.bus.js.stream_info(subjects.STREAM_DECISIONS)
    moves = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        d = msgspec.json.decode((await live.bus.js.get_msg(subjects.STREAM_DECISIONS, seq)).data)
        ours = d.get("service") == "placer" and not d.get("intent")  # the scheduler's own
        rule = d.get("reason", "").split(":", 1)[0]
        if ours and d.get("action") == "preempt" and rule in (PRIORITY_RULE, SHORT_RULE, BOOT_RULE):
            moves.append((d["time"], d["job_id"], d["node"]))
    return Record(placed, sorted(live.power), max(ends), sorted(moves))


@pytest.mark.parametrize("seed", [21, 1, 29, 7, 96])
def test_the_scheduler_decides_the_same_whether_starts_come_before_or_after_the_power_step(
    seed: int,
) -> None:
    """In process, no NATS: the order in which the two drivers report a pass's starts (the
    engine before the instant's moves and power step, the placer after its tick) changes no
    decision. It used to: on seeds 1 and 29 the blocked jobs a pass had just placed still
    counted as demand in the same instant's power step, which woke a node live and not in the
    simulator; on seed 96 the jobs it had just started were not yet movable, so the live
    placer was owed no instant for the priority-protection rule and passed later."""
    nodes = sorted(demo_cluster(), key=lambda n: n.id)
    jobs = workload(seed=seed)
    sim = simulated(jobs, nodes)
    late = simulated(jobs, nodes, StartsAfterTick)
    assert late.power == sim.power
    assert late.placements == sim.placements
    assert late.moves == sim.moves


# seed 21: the rule moves three jobs; seed 5 with long work: the short-wait rule moves seven
# (seed 7 until issue 15's natural-load rules left it none to move); seed 1: a pass places blocked
# jobs between two backfill passes, just before a power step (a woken node's first pass),
# and nodes still sleep. Seed 1 live is in `make test-all` (each live run is 20-40 s on 2
# cores); the in-process check above covers its ordering in `make test`
@pytest.mark.parametrize(
    ("seed", "moves", "long_every"),
    [(21, True, 0), (5, True, 4), pytest.param(1, False, 0, marks=pytest.mark.slow)],
)
async def test_the_live_services_place_and_power_exactly_as_the_simulator(
    live: Live, seed: int, moves: bool, long_every: int
) -> None:
    # the live placer orders its nodes by id (whatever order they register in); the
    # simulator takes the order it is given: the same cluster, the same order
    nodes = sorted(demo_cluster(), key=lambda n: n.id)
    jobs = workload(seed=seed, long_every=long_every)
    sim = simulated(jobs, nodes)
    if long_every:  # long work among short jobs: the short-wait rule moves some of it
        assert any(r.startswith("short-wait") for r in sim.reasons), sim.reasons
    # the workload exercises what it should: jobs wait, a node sleeps and wakes
    arrived = {s.id: t for t, s in jobs}
    assert any(t > arrived[j] for t, j, *_ in sim.placements), "no job waited: too light"
    assert any(a == "suspend" for _, a, _ in sim.power) and any(
        a == "wake" for _, a, _ in sim.power
    )
    if moves:  # (seed 1 is there for its pass order: the reserve leaves it nothing to move)
        assert sim.moves, "no job was moved: the workload does not exercise preemption"
    got = await lived(live, jobs)
    assert len(sim.placements) == len(jobs) + len(sim.moves)  # a moved job is placed again
    assert got.placements == sim.placements
    assert got.moves == sorted(sim.moves)  # the same jobs moved, from the same nodes, then
    # the engine takes no power step once every job has ended; the live placer still may
    end = min(sim.end_s, got.end_s)
    compared = sorted(p for p in sim.power if p[0] < end)
    assert {"suspend", "wake"} <= {a for _, a, _ in compared}
    assert [p for p in got.power if p[0] < end] == compared


BOOT_ON = dataclasses.replace(
    PolicyConfig.default(),
    preempt=dataclasses.replace(PolicyConfig.default().preempt, boot_enabled=True),
)


@pytest.mark.parametrize("live", [BOOT_ON], indirect=True)
async def test_the_live_services_move_for_a_boot_exactly_as_the_simulator(live: Live) -> None:
    """Boot protection (off by default) on in both drivers: on seed 21 it stops jobs so that
    high-priority jobs need not wait for a node to boot, and their victims resume on the woken
    node; the live placer, the executor's boot and the power plan's held rooms must give the
    same starts, moves and power commands as the simulator."""
    nodes = sorted(demo_cluster(), key=lambda n: n.id)
    jobs = workload(seed=21)
    sim = simulated(jobs, nodes, cfg=BOOT_ON)
    assert any(r.startswith(BOOT_RULE) for r in sim.reasons), sim.reasons
    got = await lived(live, jobs)
    assert got.placements == sim.placements
    assert got.moves == sorted(sim.moves)
    end = min(sim.end_s, got.end_s)
    assert [p for p in got.power if p[0] < end] == sorted(p for p in sim.power if p[0] < end)


HOLD_ON = dataclasses.replace(PolicyConfig.default(), warm_high_hold_gpus=8.0)


@pytest.mark.parametrize("live", [HOLD_ON], indirect=True)
async def test_the_live_services_hold_gpus_for_urgent_jobs_exactly_as_the_simulator(
    live: Live,
) -> None:
    """The high-priority hold (``stages.hold``, off by default) on in both drivers: on seed 21
    it changes which jobs start where and when (checked against the simulator without it),
    and the live placer must give the same starts, moves and power commands as the
    simulator with it."""
    nodes = sorted(demo_cluster(), key=lambda n: n.id)
    jobs = workload(seed=21)
    sim = simulated(jobs, nodes, cfg=HOLD_ON)
    assert sim.placements != simulated(jobs, nodes).placements, "the hold changed nothing"
    got = await lived(live, jobs)
    assert got.placements == sim.placements
    assert got.moves == sorted(sim.moves)
    end = min(sim.end_s, got.end_s)
    assert [p for p in got.power if p[0] < end] == sorted(p for p in sim.power if p[0] < end)
