"""Moving jobs in the simulator: the priority-protection rule, checkpoint cost, progress kept,
resume delay, and the protections (libs.policy.stages.preempt through the engine)."""

from __future__ import annotations

import dataclasses

from libs.policy.config import PolicyConfig, PreemptConfig
from libs.policy.profiles import ProfileTable
from libs.sim.baselines.mosaic import Mosaic
from libs.sim.engine import simulate
from tests.sim.helpers import job, node

COST_S = 60.0
PROFILES = ProfileTable.default()
NODES = [node("n0", gpus=4), node("n1", gpus=4), node("n2", gpus=4)]
LONG_S = 36_000.0


def _cfg(**kw) -> PolicyConfig:  # type: ignore[no-untyped-def]
    pc = PreemptConfig(min_wait_s=600.0, min_run_s=0.0, **kw)
    return dataclasses.replace(PolicyConfig.default(), preempt=pc, power_saving=False)


def _run(jobs, cfg: PolicyConfig):  # type: ignore[no-untyped-def]
    res = simulate(jobs, NODES, Mosaic(cfg), PROFILES, checkpoint_cost_s=COST_S)
    return res, {j.spec.id: j for j in res.jobs}


def _work(low_kw: dict) -> list:  # type: ignore[type-arg]
    """12 GPUs: two 2-GPU jobs that can never move, four 1-GPU low-priority jobs, then an
    urgent 4-GPU job that finds no node with 4 free GPUs."""
    fixed = [job(f"fix{i}", 0.0, LONG_S, gpus=2, priority=1) for i in range(2)]
    kw = {"priority": 1, **low_kw}
    low = [job(f"low{i}", 0.0, LONG_S, gpus=1, **kw) for i in range(4)]
    return [*fixed, *low, job("urgent", 100.0, 3_600.0, gpus=4, priority=9)]


def test_an_urgent_job_preempts_checkpointable_work_which_resumes_with_its_progress() -> None:
    res, j = _run(_work({"checkpointable": True}), _cfg())
    assert res.preempted_non_checkpointable == 0
    moved = [x for x in j.values() if x.moves]
    assert moved and all(x.spec.id.startswith("low") for x in moved)
    u = j["urgent"]
    # eligible after min_wait_s (t=700), then one checkpoint, then it starts
    assert 700.0 <= u.first_start_s <= 700.0 + COST_S + 30.0
    for m in moved:
        assert m.state == "completed" and m.attempts == 2 and m.moves == 1
        assert len(m.resume_delays_s) == 1 and m.resume_delays_s[0] <= 1800.0
        # progress kept: it ran its runtime once, plus the checkpoint it held the GPUs for
        assert abs(m.run_s - (LONG_S + COST_S)) < 1.0
    assert all(x.state == "completed" and x.terminal_count == 1 for x in j.values())


def test_work_that_is_neither_checkpointable_nor_elastic_is_never_preempted() -> None:
    _res, j = _run(_work({}), _cfg())
    assert all(x.moves == 0 for x in j.values())
    assert j["urgent"].first_start_s >= LONG_S  # it waited for the work to end


def test_inference_is_never_preempted() -> None:
    _res, j = _run(_work({"checkpointable": True, "kind": "inference"}), _cfg())
    assert all(x.moves == 0 for x in j.values())


def test_work_of_close_priority_is_protected() -> None:
    _res, j = _run(_work({"checkpointable": True, "priority": 7}), _cfg())  # gap 3: 9 - 7 < 3
    assert all(x.moves == 0 for x in j.values())


def test_the_rule_switched_off_moves_nothing() -> None:
    _res, j = _run(_work({"checkpointable": True}), _cfg(enabled=False))
    assert all(x.moves == 0 for x in j.values())


def test_a_victim_with_nowhere_to_resume_is_not_preempted() -> None:
    """The resume bound: with the other nodes full of work that ends after the bound, no low
    job could start again within 30 min, so none is stopped."""
    fixed = [job(f"fix{i}", 0.0, LONG_S, gpus=4, priority=1) for i in range(2)]
    low = [job(f"low{i}", 0.0, LONG_S, gpus=1, priority=1, checkpointable=True) for i in range(4)]
    _res, j = _run([*fixed, *low, job("urgent", 100.0, 3_600.0, gpus=4, priority=9)], _cfg())
    assert all(x.moves == 0 for x in j.values())
