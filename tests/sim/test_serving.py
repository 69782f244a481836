"""Inference services in the simulator (libs.sim.services, libs.sim.serving; issue 16): load
curves are seeded and bursty, every policy replays the same scaler's orders, replicas serve
until stopped and never count as training, a burst's request-to-capacity is measured from the
report that asked, and the latency model counts a minute as met only while capacity covers it."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from libs.sim.runner import run_simulation
from libs.sim.services import diurnal, parse_scenario
from libs.sim.serving import LATE_SHARE, SimServices, _Minutes, summary_lines
from libs.sim.sharing import SimSharing
from libs.sim.state import RUNNING, SimJob
from tests.sim.helpers import FlatProfiles

REPLICA = {
    "id": "t", "gpus": 1.0, "gpu_mem_gb": 8.0, "host_mem_gb": 8.0, "cpus": 2.0, "priority": 8,
    "kind": "inference", "workload_class": "inference", "latency_p99_ms": 100.0,
    "solo_latency_p99_ms": 80.0, "est_runtime_s": 86400.0,
}  # fmt: skip


def _scenario(load, **svc) -> dict:  # type: ignore[no-untyped-def]
    service = {"id": "chat", "replica": REPLICA, "rps_per_replica": 50.0, "max_replicas": 16}
    return {"services": [{"service": service | svc, "load": load}]}


def test_the_diurnal_curve_is_seeded_peaks_in_the_afternoon_and_bursts() -> None:
    t, a, end = diurnal("diurnal:peak=1000,base=100,bursts=0,noise=0,seed=1")
    assert end == 86_400.0 and len(t) == 1440
    assert max(a) == pytest.approx(1000.0) and min(a) == pytest.approx(100.0, rel=1e-3)
    assert 13 <= t[int(np.argmax(a))] / 3600 <= 15
    _, b1, _ = diurnal("diurnal:peak=1000,base=100,bursts=6,burst_x=3,seed=1")
    _, b1_again, _ = diurnal("diurnal:peak=1000,base=100,bursts=6,burst_x=3,seed=1")
    _, b2, _ = diurnal("diurnal:peak=1000,base=100,bursts=6,burst_x=3,seed=2")
    assert b1 == b1_again and b1 != b2
    assert max(b1) > 1500  # a burst over the daily peak's neighbourhood
    with pytest.raises(ValueError, match="unknown key"):
        diurnal("diurnal:peek=3")


def test_a_scenario_is_validated_and_points_hold_until_the_next() -> None:
    (sl,) = parse_scenario(_scenario([[0, 10], [120, 500], [60, 20]]))
    assert sl.times_s == (0.0, 60.0, 120.0) and sl.rps == (10.0, 20.0, 500.0)
    assert sl.end_s == 180.0 and sl.peak_replicas() == 13  # ceil(500 / 40)
    with pytest.raises(ValueError, match="rps_per_replica"):
        parse_scenario(_scenario([[0, 1]], rps_per_replica=0.0))


def test_a_minute_is_met_only_while_capacity_covers_it_but_for_one_percent() -> None:
    m = _Minutes((0.0, 60.0), (100.0, 100.0), 120.0)
    m.k, m.capacity_rps = 0, 100.0
    m.close(30.0)
    m.capacity_rps = 50.0
    m.close(30.0 + LATE_SHARE * 60.0)  # short for exactly 1% of the first minute
    m.capacity_rps = 100.0
    m.close(60.0)
    m.k, m.capacity_rps = 1, 99.0
    m.close(120.0)
    assert m.met().tolist() == [True, False]


def test_capacity_counts_gpu_speed_and_interference_and_a_broken_target_serves_nothing() -> None:
    (sl,) = parse_scenario(_scenario([[0, 10]]))
    sharing = SimSharing()
    svc = SimServices([sl], FlatProfiles(speed={"fast": 2.0}), sharing)
    spec = msgspec.convert(REPLICA, type=type(sl.service.replica))
    spec = msgspec.structs.replace(spec, service="chat")
    job = SimJob(0, spec, 0.0, np.ones(1), 1.0, state=RUNNING, model="fast")
    svc.serving["chat"][0] = job
    assert svc.capacity_rps("chat") == pytest.approx(100.0)  # 50 req/s at twice the speed
    sharing._runs[0] = type("R", (), {"factor": 1.25})()  # co-tenants slow it by 1.25
    assert svc.capacity_rps("chat") == pytest.approx(80.0)  # p99 80 x 1.25 / 2 = 50 ms: in target
    job.model = "slow"  # speed 1: p99 80 x 1.25 = 100 ms, at the target still
    assert svc.capacity_rps("chat") == pytest.approx(40.0)
    sharing._runs[0].factor = 1.3  # 104 ms: past it, so it serves nothing within the target
    assert svc.capacity_rps("chat") == 0.0


@pytest.mark.parametrize("policy", ["mosaic", "fifo"])
def test_a_replay_scales_up_for_a_burst_and_back_and_keeps_training_apart(
    tmp_path,  # type: ignore[no-untyped-def]
    policy: str,
) -> None:
    pts = [[0, 20], [600, 20], [1200, 400], [2100, 30], *[[2160 + 60 * k, 30] for k in range(12)]]
    path = tmp_path / "svc.json"
    path.write_text(json.dumps(_scenario(pts, scale_down_after_s=120.0)))
    r = run_simulation("synthetic:30", "seed", 64, [policy], None, services=path)
    m = r["policies"][policy]
    s = m["services"]
    assert r["jobs"] == 30 and m["jobs_completed"] + m.get("jobs_failed", 0) <= 30
    assert s["training_jobs"] == 30
    assert s["replicas_added"] >= 1 + 10 - 1  # the minimum, then ceil(400 / 40) at the burst
    assert s["replicas_stopped"] == s["replicas_added"]  # every one ended by an order, none by
    assert s["scale_ups_answered"] >= 9  # itself; the burst's replicas started, timed from the
    assert 0.0 <= s["burst_request_to_capacity_p50_s"] <= s["burst_request_to_capacity_p99_s"]
    assert s["latency_minutes"] == len(pts)  # report that asked
    assert 0.0 < s["latency_minutes_met_share"] <= 1.0
    assert s["inference_gpu_s"] > 0
    assert s["gpu_utilization"] > s["training_gpu_utilization"] > 0
    (line,) = summary_lines(r)
    assert line.startswith(f"{policy}: latency minutes met") and f"+{s['replicas_added']}" in line


def test_the_pool_is_sized_at_the_densest_packing_that_keeps_the_target(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from libs.policy.config import PolicyConfig
    from libs.sim import bench_inference as BI

    replica = parse_scenario(BI.scenario(1.0, 1))[0].service.replica
    # 90 ms alone, 100 ms target: bound 1.11; inference beside inference slows by 1.05 each
    assert BI.per_gpu(replica, PolicyConfig.default()) == 3
    whole = msgspec.structs.replace(replica, gpus=1.0)
    assert BI.per_gpu(whole, PolicyConfig.default()) == 1
    page = tmp_path / "b.md"
    page.write_text("# B\n\n## Other\n\nkeep\n")
    BI.write_section("## Inference services beside training (issue 16)\n\nv1\n", page)
    BI.write_section("## Inference services beside training (issue 16)\n\nv2\n", page)
    text = page.read_text()
    assert "v2" in text and "v1" not in text and "keep" in text


def test_the_shared_pool_keeps_20_percent_fewer_gpus_and_the_same_arrivals(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from libs.sim import bench_inference as BI
    from libs.sim.runner import resolve_cluster
    from libs.sim.trace import Trace, TraceJob

    seed_gpus = sum(n.gpu_count for n in BI.inventory.seed_cluster(BI.GPUS))
    for pool in (0, 8, 88, 200):
        path, gpus = BI.shared_pool_cluster(tmp_path, seed_gpus, pool)
        nodes = resolve_cluster(str(path), None)
        assert sum(n.gpu_count for n in nodes) == gpus >= seed_gpus
        assert gpus <= 0.8 * (seed_gpus + pool) or gpus == seed_gpus
        assert gpus + BI.POOL_NODE_GPUS > 0.8 * (seed_gpus + pool)  # the largest such pool
    spec = msgspec.structs.replace(parse_scenario(BI.scenario(1.0, 1))[0].service.replica)
    tr = Trace(
        name="t",
        jobs=(
            TraceJob(spec=msgspec.structs.replace(spec, id="a"), submit_s=0.0),
            TraceJob(spec=msgspec.structs.replace(spec, id="b", deadline=900.0), submit_s=600.0),
        ),
    )
    out = BI.fixed_arrivals(3.0)(tr)
    assert [j.submit_s for j in out.jobs] == [0.0, 200.0]
    assert out.jobs[1].spec.deadline == 500.0  # its 300 s of slack kept


def test_a_stopped_replica_frees_its_gpu_after_the_instant_and_ends_cancelled() -> None:
    """As the live placer applies a stop (``services.placer.stepping``): the replica stops
    serving at the order, keeps its GPU through that instant's pass (live: the ledger entry
    until the executor's answer), frees it by an end of its own at the same Mosaic time, after
    which the scheduler passes again and the waiting job takes it; the replica ends
    ``cancelled``, "scaled down: <the scaler's reason>", as live's ``Cancelled`` says."""
    from libs.policy.config import PolicyConfig
    from libs.policy.profiles import ProfileTable
    from libs.sim.baselines.mosaic import Mosaic
    from libs.sim.engine import simulate
    from libs.sim.state import CANCELLED
    from libs.sim.trace import TraceJob
    from proto.jobs import JobSpec
    from tests.sim.helpers import node

    class Seen(Mosaic):
        def attach(self, ctx) -> None:  # type: ignore[no-untyped-def,override]
            super().attach(ctx)
            self.passes: list[tuple[float, float, list[str]]] = []  # (now, GPUs held, placed)

        def schedule(self, queue, view, running, now):  # type: ignore[no-untyped-def,override]
            out = super().schedule(queue, view, running, now)
            self.passes.append((now, view.allocated_gpus, [j.spec.id for j, _ in out]))
            return out

    class Instants(SimServices):
        def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*a, **kw)
            self.seen: list[tuple[float, int, float]] = []  # (t, replicas running, capacity)

        def after(self, t: float) -> None:  # after each instant's pass and moves
            super().after(t)
            running = [j for j in self.engine.running.values() if j.spec.service]
            self.seen.append((t, len(running), self.capacity_rps("chat")))

    nodes = [node("n0", gpus=2)]
    pts = [[0, 150], [30, 150], [60, 10], [120, 10], [180, 10]]  # two replicas, quiet from 60
    (sl,) = parse_scenario(_scenario(pts, rps_per_replica=100.0, scale_down_after_s=60.0))
    profiles = ProfileTable.default().covering(nodes)
    services = Instants([sl], profiles)
    policy = Seen(PolicyConfig.default())
    train = JobSpec(id="train", gpus=1, gpu_mem_gb=8.0, est_runtime_s=600.0)
    r = simulate([TraceJob(spec=train, submit_s=40.0)], nodes, policy, profiles, services=services)
    replicas = sorted((j for j in r.jobs if j.spec.service), key=lambda j: j.end_s)
    assert len(replicas) == 2 and all(j.state == CANCELLED for j in replicas)
    first, last = replicas
    assert first.end_s == 120.0 and first.reason.startswith("scaled down: down: 10 req/s")
    assert last.end_s == 240.0 and last.reason == "scaled down: service removed"
    # the order's instant: it serves no more but still runs (holds its GPU); then its end, an
    # instant of its own at the same time, frees it and the pass gives it to the waiting job
    assert [x[1:] for x in services.seen if x[0] == 120.0] == [(2, 100.0), (1, 100.0)]
    assert [(held, placed) for now, held, placed in policy.passes if now == 120.0] == [
        (1.0, ["train"])
    ]
    assert next(j for j in r.jobs if j.spec.id == "train").first_start_s == 120.0
    s = services.report(r.jobs, 2.0, r.t_end_s - r.t0_s)
    assert s["replicas_added"] == s["replicas_stopped"] == 2 and s["scale_ups_unanswered"] == 0
