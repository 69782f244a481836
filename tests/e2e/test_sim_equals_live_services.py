"""Sim == live with an inference service (issue 16): the first wave of the sim-equals-live
workload plus a service whose load jumps from 50 to 2,000 req/s at t=900 s (25 replicas
asked), on the demo cluster the wave keeps nearly full: most replicas take free GPUs at once,
the burst rule moves a training job for one, the rest wait for GPUs to free. The load then
falls to 100 req/s: once it stayed low for the quiet window the scaler stops most replicas (a
scale-down), a 4-GPU training job that arrives then takes GPUs they held, and the removal of
the service at the curve's end stops the rest. The simulator
(``libs.sim.serving``) and the live placer (``services.placer.scaling``: the service defined
and deleted over HTTP, its load reported on ``load.<service>``) apply the scaler's orders at
the same instants, name the replicas alike, make room for them by the same burst rule, stop
the same replicas in the same order, end them alike (``cancelled``, "scaled down: ..."), free
their GPUs at the same instant and give them to the same waiting jobs: every placement, move
and stop is compared, in order, through the curve's end."""

from __future__ import annotations

import asyncio

import msgspec

from libs.policy.config import PolicyConfig
from libs.policy.inventory import demo_cluster
from libs.policy.profiles import ProfileTable
from libs.policy.stages.burst import BURST_RULE
from libs.sim.engine import simulate
from libs.sim.services import parse_scenario
from libs.sim.serving import SimServices
from libs.sim.state import CANCELLED
from libs.sim.trace import TraceJob
from proto import subjects
from proto.events import Cancelled, Placed
from proto.inference import InferenceService, LoadReport
from proto.jobs import JobSpec
from tests.e2e.test_sim_equals_live import Live, Recording, workload
from tests.e2e.test_sim_equals_live import live as live  # the fixture
from tests.services._scorer_util import lifecycle_events, poll

REPLICA = JobSpec(
    id="template", priority=8, gpus=1, gpu_mem_gb=16, host_mem_gb=8, cpus=2, kind="inference",
    workload_class="inference", latency_p99_ms=100.0, est_runtime_s=10_000_000.0,
)  # fmt: skip
QUIET_S = 150.0  # the quiet window: not on a load point, so the scaler's own wake-up is owed
SVC = InferenceService(
    id="chat", replica=REPLICA, rps_per_replica=100.0, max_replicas=30, scale_down_after_s=QUIET_S
)
BURST_S = 900.0  # the wave keeps the cluster nearly full by then, and GPUs as fast as its A100
# are free for the training job the burst stops (a victim resumes no slower than it ran: at
# 1,000 s only slower GPUs were, and the burst moved nobody)
LOW_S = 1200.0  # the load falls: quiet from here, a scale-down at LOW_S + QUIET_S
POINTS = [(0.0, 50.0), (BURST_S, 2000.0), *[(LOW_S + 60.0 * k, 100.0) for k in range(6)]]
STEP_S = 60.0  # the curve ends one step after its last point (the service is removed then)
END_S = POINTS[-1][0] + STEP_S
Stop = tuple[float, str]  # (when ordered, replica), in the order the scaler gave them
Ended = tuple[float, str, str]  # (when it ended, replica, reason): every stopped one ends cancelled


class StopsRecorded(SimServices):
    """The simulator's services, writing down each stop order as it applies it."""

    def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*a, **kw)
        self.stops: list[Stop] = []

    def _stop(self, rid: str, t: float, reason: str) -> None:
        self.stops.append((t, rid))
        super()._stop(rid, t, reason)


# shorter than every waiting training job (300 s and up), so it leads the queue: the rank is
# shortest-first (stages.rank, issue 15), and this job must take the freed GPUs at that instant
LATE = JobSpec(
    id="w-late", priority=9, gpus=4, gpu_mem_gb=40.0, host_mem_gb=32.0, cpus=8.0,
    workload_class="cnn", est_runtime_s=120.0,
)  # fmt: skip


def jobs() -> list[tuple[float, JobSpec]]:
    """The first wave, and a job that fits only once the scale-down's replicas are gone."""
    return [(t, s) for t, s in workload(21) if t <= 1400.0] + [(LOW_S + QUIET_S, LATE)]


Placement = tuple[float, str, str, tuple[int, ...]]  # (when, job, node, GPU indices)
Point = tuple[float, float]  # (Mosaic time, req/s): the service's load curve


def simulated(
    work: list[tuple[float, JobSpec]] | None = None,
    points: list[Point] = POINTS,
    svc: InferenceService = SVC,
    policy: Recording | None = None,
) -> tuple[list[Placement], list, list[Stop], list[Ended]]:
    """Placements, moves, stop orders and stopped replicas' ends up to the curve's end (that of
    ``points``, one step after its last point), of the training jobs ``work`` ((arrival, spec);
    this module's ``jobs()`` by default) and the service ``svc`` under the load ``points``;
    ``policy``: the simulator's Mosaic to run (it records what it decides; a new ``Recording``
    by default)."""
    end_s = points[-1][0] + STEP_S
    nodes = sorted(demo_cluster(), key=lambda n: n.id)
    scenario = {
        "services": [{"service": msgspec.to_builtins(svc), "load": [list(p) for p in points]}],
        "step_s": STEP_S,
    }
    loads = parse_scenario(scenario)
    policy = policy or Recording(PolicyConfig.default())
    profiles = ProfileTable.default().covering(nodes)
    trace = [TraceJob(spec=s, submit_s=t) for t, s in (work or jobs())]
    services = StopsRecorded(loads, profiles)
    result = simulate(trace, nodes, policy, profiles, services=services)
    ended = sorted(
        (j.end_s, j.spec.id, j.reason) for j in result.jobs if j.spec.service and j.end_s <= end_s
    )
    assert all(j.state == CANCELLED for j in result.jobs if j.spec.service)
    return (
        [p for p in policy.placed if p[0] <= end_s],
        [m for m in policy.moved if m[0] <= end_s],
        services.stops,
        ended,
    )


async def lived(
    live: Live,
    work: list[tuple[float, JobSpec]] | None = None,
    points: list[Point] = POINTS,
    svc: InferenceService = SVC,
) -> tuple[list[Placement], list[Ended]]:
    """Placements and stopped replicas' ends up to the curve's end, stepped as the engine
    (the arguments: ``simulated``'s)."""
    end_s = points[-1][0] + STEP_S
    arrivals: dict[float, list[JobSpec]] = {}
    for t, s in work or jobs():
        arrivals.setdefault(t, []).append(s)
    loads = dict(points)
    placer = live.placer
    headers = {"Content-Type": "application/json"}
    name = svc.id

    async def before(t: float) -> None:
        if t == 0.0:
            data = msgspec.json.encode(svc)
            async with live.http.post(f"{live.base}/v1/services", data=data, headers=headers) as r:
                assert r.status == 201, await r.text()
            await poll(lambda: asyncio.sleep(0, name in placer.service_defs), timeout_s=10)
        if t == end_s:  # the curve ends: the service is removed, its replicas stop
            async with live.http.delete(f"{live.base}/v1/services/{name}") as r:
                assert r.status == 200, await r.text()
            await poll(lambda: asyncio.sleep(0, name not in placer.service_defs), timeout_s=10)
        if t in loads:
            report = LoadReport(service=name, time=t, rps=loads[t])
            await live.bus.nc.publish(subjects.load(name), msgspec.json.encode(report))
            await poll(
                lambda: asyncio.sleep(0, placer.load_reports.get(name) == report), timeout_s=10
            )
        for spec in arrivals.get(t, []):
            data = msgspec.json.encode(spec)
            async with live.http.post(f"{live.base}/v1/jobs", data=data, headers=headers) as r:
                assert r.status == 201, await r.text()
        ids = {s.id for s in arrivals.get(t, [])}
        await poll(lambda: asyncio.sleep(0, ids <= set(placer.tracker.specs)), timeout_s=20)

    todo = sorted(set(arrivals) | set(loads) | {end_s})
    t, steps = 0.0, 0
    while t <= end_s:
        await live.controller.step(t, decide=True, before_decide=lambda t=t: before(t))
        steps += 1
        assert steps < 3000, "the live run does not end"
        due = [a for a in todo if a > t][:1]
        nxt = live.controller.next_s()
        if t == end_s:
            break
        t = min(due + [end_s] + ([nxt] if nxt is not None and nxt > t else []))
    events = await lifecycle_events(live.bus)
    placed = [
        (e.time, e.job_id, e.node, tuple(e.gpu_indices))
        for e in events
        if isinstance(e, Placed) and e.time <= end_s
    ]
    ended = sorted(
        (e.time, e.job_id, e.reason)
        for e in events
        if isinstance(e, Cancelled) and e.job_id.startswith(f"{name}-")
    )
    return placed, ended


async def test_a_service_is_scaled_and_placed_live_exactly_as_in_the_simulator(
    live: Live,
) -> None:
    sim, moves, stops, ended = simulated()
    replicas = [p for p in sim if p[1].startswith("chat-")]
    assert len(replicas) >= 20, "the burst did not scale the service up"
    assert any(p[0] == BURST_S for p in replicas), "no replica placed at the burst's instant"
    assert any(m[0] == BURST_S for m in moves), "the burst rule moved nothing"
    # the workload exercises the stops: running replicas are stopped by the quiet window
    # before the curve's end, and their GPUs go to waiting training jobs at that instant
    down = [t for t, _ in stops if t < END_S]
    assert down and min(down) == LOW_S + QUIET_S, "no scale-down before the curve's end"
    held = {(p[2], g) for p in replicas for t, rid in stops if rid == p[1] and t < END_S
            for g in p[3]}  # fmt: skip
    (late,) = [p for p in sim if p[1] == LATE.id]  # placed when the replicas' ends freed room
    assert late[0] == LOW_S + QUIET_S and {(late[2], g) for g in late[3]} <= held
    assert all(reason.startswith("scaled down: ") for *_, reason in ended)
    assert len(ended) == len(stops) and {e[:2] for e in ended} == set(stops)  # ends when ordered
    got, got_ended = await lived(live)
    assert got == sim
    assert got_ended == ended
    assert await decided(live, "scale_down") == stops
    assert await burst_moves(live) == [m for m in moves if m[0] == BURST_S]


async def decided(live: Live, action: str) -> list[tuple[float, str]]:
    """The live placer's audit records of ``action``, in the order it published them."""
    info = await live.bus.js.stream_info(subjects.STREAM_DECISIONS)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        d = msgspec.json.decode((await live.bus.js.get_msg(subjects.STREAM_DECISIONS, seq)).data)
        if d.get("action") == action:
            out.append((d["time"], d["job_id"]))
    return out


async def burst_moves(live: Live) -> list[tuple[float, str, str]]:
    """The live placer's moves by the burst rule (its audit records)."""
    info = await live.bus.js.stream_info(subjects.STREAM_DECISIONS)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        d = msgspec.json.decode((await live.bus.js.get_msg(subjects.STREAM_DECISIONS, seq)).data)
        if d.get("action") == "preempt" and BURST_RULE in d.get("reason", ""):
            out.append((d["time"], d["job_id"], d["node"]))
    return sorted(out)
