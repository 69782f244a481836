"""Tiresias (libs.sim.baselines.tiresias): 2D-LAS queues, demotion, preemption through the
engine's shared mechanism, STARVELIMIT, and the -np twin that never preempts."""

from __future__ import annotations

import numpy as np
import pytest

from libs.sim.baselines import make_policy
from libs.sim.baselines.tiresias import Tiresias
from libs.sim.engine import simulate
from libs.sim.state import SimContext, SimJob
from tests.sim.helpers import FlatProfiles, job, node

PROFILES = FlatProfiles()
NODES = [node("n0", gpus=2)]


def _run(jobs, policy, cost_s: float = 0.0):  # type: ignore[no-untyped-def]
    res = simulate(jobs, NODES, policy, PROFILES, checkpoint_cost_s=cost_s)
    assert all(j.terminal_count == 1 and j.state == "completed" for j in res.jobs)
    assert res.preempted_non_checkpointable == 0
    return {j.spec.id: j for j in res.jobs}


def _long_then_new(**kw) -> list:  # type: ignore[no-untyped-def]
    """A 2-GPU job of 10,000 s at t=0 fills the node; a 2-GPU job of 500 s arrives at 1,000 s.
    The long job crosses the 3,200 GPU-s boundary at 1,600 s (2 GPUs x 1,600 s)."""
    return [job("long", 0, 10_000, gpus=2, **kw), job("new", 1_000, 500, gpus=2, **kw)]


def test_a_demoted_long_job_is_preempted_for_a_new_one_and_keeps_its_progress() -> None:
    j = _run(_long_then_new(checkpointable=True), make_policy("tiresias"))
    # at 1,000 s both are in queue 0 (FIFO: the long job keeps running); at 1,600 s the long
    # job is demoted to queue 1 and yields
    assert j["new"].first_start_s == pytest.approx(1_600.0)
    assert j["long"].moves == 1 and j["long"].attempts == 2
    assert j["long"].run_s == pytest.approx(10_000.0)  # progress kept: no work redone
    assert j["long"].end_s == pytest.approx(10_500.0)


def test_without_preemption_the_new_job_waits_for_the_long_one() -> None:
    j = _run(_long_then_new(checkpointable=True), make_policy("tiresias-np"))
    assert j["long"].moves == 0
    assert j["new"].first_start_s == pytest.approx(10_000.0)


def test_the_shared_checkpoint_cost_is_paid() -> None:
    j = _run(_long_then_new(checkpointable=True), make_policy("tiresias"), cost_s=60.0)
    assert j["new"].first_start_s == pytest.approx(1_660.0)  # the victim's save held the GPUs
    assert j["long"].end_s == pytest.approx(10_560.0)  # 60 s of GPUs spent saving


def test_a_job_that_cannot_checkpoint_is_never_preempted() -> None:
    j = _run(_long_then_new(), make_policy("tiresias"))
    assert j["long"].moves == 0
    assert j["new"].first_start_s == pytest.approx(10_000.0)


def test_a_job_of_the_same_queue_is_not_preempted() -> None:
    jobs = [
        job("long", 0, 10_000, gpus=2, checkpointable=True),
        job("big", 1_000, 20_000, gpus=2, checkpointable=True),
    ]
    j = _run(jobs, Tiresias((50_000.0,)))  # one boundary far away: all in queue 0
    assert j["long"].moves == 0 and j["big"].first_start_s == pytest.approx(10_000.0)


def _starving() -> list:
    """``a`` is preempted at 1,600 s by ``b`` (20,000 s long), having executed 1,600 s."""
    return [
        job("a", 0, 10_000, gpus=2, checkpointable=True),
        job("b", 1_000, 20_000, gpus=2, checkpointable=True),
    ]


def test_starvelimit_promotes_a_waiting_job_back_to_the_top_queue() -> None:
    j = _run(_starving(), make_policy("tiresias"))
    a = j["a"]
    assert j["b"].first_start_s == pytest.approx(1_600.0)
    # promoted once it has waited more than 2 x 1,600 s (at 4,800 s); b (6,400 GPU-s
    # attained by then) is in queue 1 and yields
    assert a.resume_delays_s[0] == pytest.approx(3_200.0, abs=0.01)
    assert a.end_s < j["b"].end_s


def test_without_starvelimit_the_waiting_job_waits_for_the_queue_0_job() -> None:
    j = _run(_starving(), Tiresias(starve_factor=1e9))
    # b runs in queue 0 until its own service demotes it, and only a job of a higher queue
    # could preempt it: a stays in queue 1 behind it
    assert j["a"].resume_delays_s[0] == pytest.approx(j["b"].end_s - 1_600.0)


def test_fresh_jobs_go_before_jobs_with_more_service() -> None:
    p = Tiresias()
    jobs = [job("old", 0, 5_000, gpus=2, checkpointable=True)]
    jobs += [job(f"f{i}", 2_000 + i, 100, gpus=1, checkpointable=True) for i in range(2)]
    j = _run(jobs, p)
    # the old job (3,200 GPU-s at 1,600 s) is in queue 1 when the fresh ones arrive
    assert j["old"].moves == 1
    assert j["f0"].first_start_s == pytest.approx(2_000.0)
    assert j["f1"].first_start_s == pytest.approx(2_001.0)


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="boundaries_gpu_s"):
        Tiresias((3_200.0, 100.0))
    with pytest.raises(ValueError, match="starve_factor"):
        Tiresias(starve_factor=0.0)


def test_the_node_that_needs_the_fewest_gpus_preempted_is_chosen() -> None:
    nodes = [node("n0", gpus=2), node("n1", gpus=2)]
    jobs = [
        job("a", 0, 50_000, gpus=2, checkpointable=True),  # n0, queue 1 from 1,600 s
        job("b", 0, 50_000, gpus=1, checkpointable=True),  # n1, queue 1 from 3,200 s
        job("new", 4_000, 500, gpus=2, checkpointable=True),
    ]
    res = simulate(jobs, nodes, make_policy("tiresias"), PROFILES, checkpoint_cost_s=0.0)
    j = {x.spec.id: x for x in res.jobs}
    # n1 has a free GPU: preempting b (1 GPU) is enough there; n0 would cost a's 2
    assert j["b"].moves == 1 and j["a"].moves == 0
    assert j["new"].first_start_s == pytest.approx(4_000.0)


def test_a_gang_wider_than_a_node_preempts_across_nodes() -> None:
    nodes = [node("n0", gpus=2), node("n1", gpus=2)]
    jobs = [
        job("gang", 0, 50_000, gpus=4, checkpointable=True),  # queue 1 from 800 s
        job("new", 1_000, 500, gpus=4, checkpointable=True),
    ]
    res = simulate(jobs, nodes, make_policy("tiresias"), PROFILES, checkpoint_cost_s=0.0)
    j = {x.spec.id: x for x in res.jobs}
    assert j["gang"].moves == 1
    assert j["new"].first_start_s == pytest.approx(1_000.0)
    assert all(x.terminal_count == 1 and x.state == "completed" for x in res.jobs)


def test_a_job_promoted_long_ago_does_not_hide_the_next_demotion() -> None:
    """Queue changes without an event: ``a`` runs 2 GPUs from 4,800 s with 0 service since its
    promotion (demoted at 6,400 s); ``b`` has waited past its limit (promoted at 3,000 s).
    The next look is a's demotion, not b's promotion in the past."""
    p = Tiresias()
    p.attach(SimContext(None, [], None, []))
    a = SimJob(0, job("a", 0, 10_000, gpus=2).spec, 0.0, np.ones(1), 1.0)
    b = SimJob(1, job("b", 0, 10_000, gpus=2).spec, 0.0, np.ones(1), 1.0)
    a.state, a.start_s, a.attained_gpu_s, a.run_s = "running", 4_800.0, 3_200.0, 1_600.0
    b.enqueue_s, b.run_s, b.attained_gpu_s = 1_000.0, 1_000.0, 2_000.0
    p.enqueued(b, 1_000.0)
    p.service_base_gpu_s[a.idx] = 3_200.0  # promoted while it waited, before this attempt
    p.started(a, 4_800.0)
    assert p.next_move_s(5_000.0) == pytest.approx(6_400.0, abs=0.01)
