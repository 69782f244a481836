"""Sim == live for the grow-back (issue 16, ``libs.policy.stages.grow``): a service's burst
shrinks elastic training jobs for its replicas, the load falls, the replicas are stopped, and
once the quiet window after the burst passed each job grows back to the size it asked. The
simulator and the live services (the fixture, helpers and stepping of
``tests/e2e/test_sim_equals_live_services.py``) shrink and grow the same jobs, by the same
sizes, at the same instants, and place, stop and power alike.

The workload, on the demo cluster: four 8-GPU training jobs of priority 5 fill the four A100
nodes at t=0, two elastic (``Elastic(min_gpus=4, max_gpus=8)``, checkpointable), two neither
(the burst rule may move neither); the idle V100 and T4 nodes are suspended. The service
``chat`` (no minimum; its replica, priority 8, runs on an A100 only) gets 150 req/s at
``BURST_S``: two replicas, no A100 GPU free, so the burst rule shrinks each elastic job 8 -> 7
(one per node) and each replica takes the GPU one gave (all resume once the checkpoints are
saved). At ``LOW_S`` the load falls to 60 req/s, and ``QUIET_S`` later the scaler stops one
replica; at ``ZERO_S`` it falls to 0 and the other is stopped at ``ZERO_S + QUIET_S``. The
grows (the default ``PolicyConfig``: the fixture's live placer takes no other):

* the job beside the first stopped replica grows 7 -> 8 at ``BURST_S + grow_quiet_s``, an
  instant no event marks (the end of the quiet window and of its move window): each driver
  must be woken by the scheduler's ``next_move_s``;
* the other grows 7 -> 8 at the second stop, the instant its replica's end frees the GPU.

A second case adds a 1-GPU training job at ``TAKEN_S`` that the pass starts on the GPU the
first stop freed (a job that starts comes before one that speeds up): that grow waits for
the job's end, an instant of the executor's (``Completed``), not the scheduler's.

The curve ends (and the service is removed) after the second grow's resume.
"""

from __future__ import annotations

import msgspec
import pytest

from libs.policy.config import PolicyConfig
from libs.policy.stages.burst import BURST_RULE
from libs.policy.stages.grow import GROW_RULE
from proto import subjects
from proto.events import Preempted
from proto.inference import InferenceService
from proto.jobs import Elastic, JobSpec
from tests.e2e.test_sim_equals_live import Live, Recording
from tests.e2e.test_sim_equals_live import live as live  # the fixture
from tests.e2e.test_sim_equals_live_services import REPLICA, STEP_S, decided, lived, simulated
from tests.services._scorer_util import lifecycle_events

A100 = "a100-80gb"
ASKED = 8  # the elastic jobs' size, the size each grows back to
QUIET_S = 150.0  # the service's scale-down window
SVC = InferenceService(
    id="chat",
    replica=msgspec.structs.replace(REPLICA, constraints=(A100,)),
    rps_per_replica=100.0,
    min_replicas=0,
    max_replicas=4,
    scale_down_after_s=QUIET_S,
)
BURST_S = 900.0  # past the elastic jobs' min_run_s: the burst rule may shrink them
LOW_S = 1200.0  # 60 req/s: one replica is stopped at LOW_S + QUIET_S
GROW_S = BURST_S + PolicyConfig.default().preempt.grow_quiet_s  # the quiet window's end
ZERO_S = GROW_S + 500.0  # 0 req/s: the other replica is stopped at ZERO_S + QUIET_S
POINTS = [
    (0.0, 0.0),
    (BURST_S, 150.0),  # two replicas (100 req/s each, scaled up past 80% of it)
    *[(LOW_S + 60.0 * k, 60.0) for k in range(4)],  # fresh reports through the scale-down
    *[(ZERO_S + 60.0 * k, 0.0) for k in range(4)],
    (ZERO_S + 1500.0, 0.0),  # the curve lasts past the second grow's resume
]
END_S = POINTS[-1][0] + STEP_S  # the curve's end
Move = tuple[float, str, str, int]  # (when decided, job, node it leaves, GPUs it resumes on)


def training(i: int, **kw) -> JobSpec:  # type: ignore[no-untyped-def]
    return JobSpec(
        id=f"train-{i}", priority=5, gpus=float(ASKED), gpu_mem_gb=40.0, host_mem_gb=64.0,
        cpus=16.0, workload_class="transformer", est_runtime_s=40_000.0, constraints=(A100,),
        **kw,
    )  # fmt: skip


ELASTIC = {"elastic": Elastic(min_gpus=4, max_gpus=ASKED), "checkpointable": True}
ELASTIC_IDS = ("train-0", "train-1")
WORK = [(0.0, training(i, **ELASTIC)) for i in (0, 1)] + [(0.0, training(i)) for i in (2, 3)]
TAKEN_S = 2000.0  # after the first stop: the freed GPU is taken until after GROW_S
SMALL = JobSpec(
    id="small", priority=5, gpus=1.0, gpu_mem_gb=20.0, host_mem_gb=8.0, cpus=2.0,
    workload_class="cnn", est_runtime_s=3000.0, constraints=(A100,),
)  # fmt: skip


async def live_moves(live: Live) -> list[tuple[Move, str]]:
    """The live placer's own moves (its audit records, in order), each with the size its
    ``Preempted`` names (the job's next one after the decision) and the rule that made it."""
    info = await live.bus.js.stream_info(subjects.STREAM_DECISIONS)
    records = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        d = msgspec.json.decode((await live.bus.js.get_msg(subjects.STREAM_DECISIONS, seq)).data)
        if d.get("service") == "placer" and not d.get("intent") and d.get("action") == "preempt":
            records.append(d)
    preempted = [e for e in await lifecycle_events(live.bus) if isinstance(e, Preempted)]
    out = []
    for d in records:
        ev = next(e for e in preempted if e.job_id == d["job_id"] and e.time >= d["time"])
        preempted.remove(ev)
        rule = d["reason"].split(":", 1)[0]
        out.append(((d["time"], d["job_id"], d["node"], ev.resize_gpus), rule))
    return out


@pytest.mark.parametrize("taken", [False, True], ids=["quiet", "gpu-taken"])
async def test_shrunk_jobs_grow_back_live_exactly_as_in_the_simulator(
    live: Live, taken: bool
) -> None:
    work = WORK + ([(TAKEN_S, SMALL)] if taken else [])
    policy = Recording(PolicyConfig.default())
    sim, _, stops, ended = simulated(work, POINTS, SVC, policy)
    moves = [m for m in policy.resized if m[0] <= END_S]
    home = {j: n for _, j, n, _ in sim}
    # the scenario exercises what it should: the burst shrinks both elastic jobs, the stops
    # free their GPUs, each job grows back to the size it asked, at the instants above
    shrinks = [(BURST_S, j, home[j], ASKED - 1) for j in ELASTIC_IDS]
    assert [m for m in moves if m[0] == BURST_S] == shrinks
    assert [t for t, _ in stops] == [LOW_S + QUIET_S, ZERO_S + QUIET_S]
    first, second = (home[rid] for _, rid in stops)  # the nodes the stops free a GPU on
    (early,), (late,) = ([j for j in ELASTIC_IDS if home[j] == n] for n in (first, second))
    grows = [m for m in moves if m[0] > BURST_S]
    assert [m[1:] for m in grows] == [(j, home[j], ASKED) for j in (early, late)]
    assert grows[1][0] == ZERO_S + QUIET_S
    if taken:  # the small job took the GPU: the grow came at its end, after the quiet window
        assert (TAKEN_S, SMALL.id, first, (0,)) in sim and GROW_S < grows[0][0] < ZERO_S
    else:
        assert grows[0][0] == GROW_S
    for job in (early, late):  # placed on 8 GPUs, resumed on 7, grown back to 8, in place
        assert [len(p[3]) for p in sim if p[1] == job] == [ASKED, ASKED - 1, ASKED]
    assert any(a == "suspend" for _, a, _ in policy.powered)

    got, got_ended = await lived(live, work, POINTS, SVC)
    assert got == sim  # job -> node, GPU indices, in order, with their times
    rules = [BURST_RULE] * 2 + [GROW_RULE] * 2
    assert await live_moves(live) == list(zip(moves, rules, strict=True))
    assert await decided(live, "scale_down") == stops
    assert got_ended == ended
    power = [p for p in policy.powered if p[0] <= END_S]
    assert sorted(p for p in live.power if p[0] <= END_S) == sorted(power)
