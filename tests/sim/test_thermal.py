"""Heat in the simulator (libs.sim.thermal): throttling slows jobs by the documented factor,
the guard holds a hot node (mosaic), and the scenario options are checked."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from libs.policy.config import PolicyConfig, ThermalConfig
from libs.policy.profiles import ProfileTable
from libs.policy.thermal_model import THROTTLE_SPEED
from libs.sim.baselines.fifo import Fifo
from libs.sim.baselines.mosaic import Mosaic
from libs.sim.engine import Engine
from libs.sim.thermal import HotNodes, SimThermal
from tests.sim.helpers import FlatProfiles, job, node

NODES = [node("hot-0"), node("cool-0")]
HEAT = {"hot-0": 1.6}  # v100 here: 275 W busy -> about 100 C steady, over the 90 C slowdown


def run(policy, jobs, *, heat=HEAT, cfg: ThermalConfig | None = None, nodes=NODES):
    thermal = SimThermal(nodes, cfg or ThermalConfig(), heat=heat)
    profiles = ProfileTable.default() if isinstance(policy, Mosaic) else FlatProfiles()
    result = Engine(jobs, nodes, policy, profiles, thermal=thermal).run()
    return result, thermal


def test_a_job_on_a_throttled_gpu_runs_at_half_speed() -> None:
    jobs = [job("a", 0.0, 3600.0, gpus=4), job("b", 0.0, 3600.0, gpus=4)]
    result, thermal = run(Fifo(), jobs)
    ends = {j.spec.id: j.end_s for j in result.jobs}
    slow, fast = sorted(ends, key=ends.get, reverse=True)
    assert ends[fast] == pytest.approx(3600.0)  # the cool node: no throttling
    # the hot node: throttled after it heats (seconds), so nearly all of it at half speed
    assert 3600 / THROTTLE_SPEED - 200 < ends[slow] <= 3600 / THROTTLE_SPEED + 1
    t = thermal.totals
    assert t.throttled_gpu_s == pytest.approx(4 * (ends[slow] - 0.0), rel=0.05)
    assert t.throttle_lost_s == pytest.approx(ends[slow] - 3600.0, rel=0.02)
    assert t.peak_c > 90.0 and t.holds == 0  # fifo has no guard


def test_without_heat_nothing_changes() -> None:
    jobs = [job("a", 0.0, 3600.0, gpus=4), job("b", 10.0, 1800.0, gpus=4)]
    plain = Engine(jobs, NODES, Fifo(), FlatProfiles()).run()
    result, thermal = run(Fifo(), jobs, heat={})
    assert [j.end_s for j in result.jobs] == [j.end_s for j in plain.jobs]
    assert thermal.totals.throttled_gpu_s == 0.0 and thermal.totals.peak_c < 85.0


def hot_workload() -> list:
    """A stream of 1-GPU jobs, more than one node holds at a time, for a few hours."""
    return [job(f"j{i}", 300.0 * i, 2400.0, gpus=1) for i in range(40)]


def test_the_guard_holds_the_hot_node_and_avoids_throttled_gpu_hours() -> None:
    jobs = hot_workload()
    with_guard, on = run(Mosaic(), jobs)
    off_cfg = dataclasses.replace(PolicyConfig(), thermal=ThermalConfig(enabled=False))
    without, off = run(Mosaic(off_cfg), jobs, cfg=off_cfg.thermal)
    assert on.totals.holds >= 1 and off.totals.holds == 0
    assert on.totals.releases >= 1  # it cooled once its jobs ended, and took work again
    # the placement filter (thermal_max_c) keeps new work off a hot node with or without the
    # guard; the hold adds hysteresis, never more throttling (migrations: see below)
    assert on.totals.throttled_gpu_s <= off.totals.throttled_gpu_s
    assert all(j.state == "completed" for j in with_guard.jobs + without.jobs)


def test_hot_nodes_option() -> None:
    assert HotNodes.parse(None, None, None) is None
    s = HotNodes.parse("hot-0", None, None)
    assert s is not None and s.heat_by_node(NODES) == {"hot-0": 1.5}
    nodes = [node(f"n{i}") for i in range(10)]
    share = HotNodes.parse(None, 0.2, 1.8)
    assert share is not None and share.heat_by_node(nodes) == {"n0": 1.8, "n5": 1.8}
    with pytest.raises(ValueError, match="not in the cluster: nope"):
        HotNodes.parse("nope", None, None).heat_by_node(NODES)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="--hot-share"):
        HotNodes.parse(None, 1.5, None)
    with pytest.raises(ValueError, match=r"heat factor of hot-0 must be in \[0.1, 5"):
        SimThermal(NODES, heat={"hot-0": 9.0})


def test_mosaic_sim_reports_the_hot_node_scenario() -> None:
    from libs.sim.runner import run_simulation

    hot = HotNodes.parse("a100-0,a100-1", None, None)
    r = run_simulation("synthetic:150", "demo", 0, ["fifo", "mosaic"], None, load=0.9, hot=hot)
    t = r["thermal"]
    assert t["hot_nodes"] == ["a100-0", "a100-1"] and t["throttle_speed"] == THROTTLE_SPEED
    assert t["with_guard"]["holds"] >= 1 and t["without_guard"]["holds"] == 0
    assert t["throttled_gpu_h_avoided"] == pytest.approx(
        t["without_guard"]["throttled_gpu_h"] - t["with_guard"]["throttled_gpu_h"]
    )
    # (the sign of the saving is a figure of the scenario, not a property: on 150 jobs it is
    # decided by where one 16-GPU gang lands; the property is the two-node test above)
    assert t["with_guard"]["migrations"] >= 1 and t["without_guard"]["migrations"] == 0
    assert r["policies"]["fifo"]["thermal"]["throttled_gpu_h"] > 0  # heat hits every policy
    plain = run_simulation("synthetic:150", "demo", 0, ["mosaic"], None, load=0.9)
    assert "thermal" not in plain and "thermal" not in plain["policies"]["mosaic"]


def test_the_guard_migrates_checkpointable_jobs_off_the_hot_node() -> None:
    """Long checkpointable jobs on the hot node move to the cool one once short jobs free it:
    with the guard they finish sooner and far fewer GPU-hours run throttled; without it they
    run at half speed to the end. Nothing the rule protects is ever moved."""
    jobs = [
        job(f"j{i}", 0.0, 1800.0 if i % 2 else 14400.0, gpus=1, checkpointable=True)
        for i in range(8)
    ] + [job("plain", 0.0, 14400.0, gpus=1)]
    with_guard, on = run(Mosaic(), jobs)
    off_cfg = dataclasses.replace(PolicyConfig(), thermal=ThermalConfig(enabled=False))
    without, off = run(Mosaic(off_cfg), jobs, cfg=off_cfg.thermal)
    assert on.totals.migrations >= 1 and off.totals.migrations == 0
    assert on.totals.throttled_gpu_s < 0.7 * off.totals.throttled_gpu_s
    assert with_guard.preempted_non_checkpointable == 0
    moved = {j.spec.id for j in with_guard.jobs if j.migrations}
    assert moved and "plain" not in moved
    assert all(j.state == "completed" for j in with_guard.jobs)
    end = {j.spec.id: j.end_s for j in with_guard.jobs}
    end_off = {j.spec.id: j.end_s for j in without.jobs}
    assert max(end.values()) < max(end_off.values())


def test_summary_line() -> None:
    from libs.sim.thermal import summary_line

    assert summary_line({}) is None
    t = {"with_guard": {"holds": 3, "throttled_gpu_h": 6.2}, "migrations": 2}
    t |= {"without_guard": {"throttled_gpu_h": 18.0}, "hot_nodes": ["a"], "heat": 1.5}
    line = summary_line({"thermal": t | {"throttled_gpu_h_avoided": 11.8}})
    assert line is not None and "2 migrations" in line and "avoided: 11.8" in line


def test_the_simulator_and_the_sim_telemetry_backend_read_the_same_temperatures() -> None:
    """One model, two drivers: the same load on the same hot node, stepped a minute at a time,
    gives the telemetry backend's readings (noise and all) and the simulator's temperatures
    within a degree or two."""
    from types import SimpleNamespace

    from libs.sim.cluster import SimCluster
    from proto.ledger import Allocation
    from services.telemetry.backends import SimulatedGpuBackend

    spec = msgspec.structs.replace(NODES[0], labels={"mosaic/heat": "1.6"})
    a = Allocation(
        job_id="j",
        node=spec.id,
        gpu_indices=(0, 1),
        gpu_share=1.0,
        gpu_mem_gb=8,
        host_mem_gb=8,
        cpus=2,
        time=0.0,
    )
    cluster = SimCluster([spec])
    cluster.allocate(a)
    engine = SimpleNamespace(cluster=cluster, policy=None, running={}, jobs=[], finished=0)
    sim = SimThermal([spec])
    sim.attach(engine, lambda _t: None)
    sim.start(0.0)
    backend = SimulatedGpuBackend([spec], seed=3)
    backend.set_allocations([a])
    backend.sample(0.0)
    busy_gap, idle_gap = [], []
    for k in range(1, 21):
        sim.at(60.0 * k)
        (reading,) = backend.sample(60.0 * k)
        got = [g.temp_c for g in reading.gpus]
        want = sim.temp_c[0, : spec.gpu_count].tolist()
        busy_gap.append((got[0] + got[1] - want[0] - want[1]) / 2)
        idle_gap.append((got[2] + got[3] - want[2] - want[3]) / 2)
    # per reading, the backend's efficiency (0.9 +- 0.04) and power noise move a busy GPU by
    # a few degrees; on average the two agree
    assert max(abs(g) for g in busy_gap) < 5.0 and abs(sum(busy_gap) / 20) < 1.5
    assert max(abs(g) for g in idle_gap) < 1.5
    assert sim.temp_c[0, 0] > 90 > 45 > sim.temp_c[0, 3]
