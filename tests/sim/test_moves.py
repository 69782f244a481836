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
    """The urgent job is short (1 h): with the priority rule off, the short-wait rule, woken at
    its wait bound (2 h), moves for it; with both off nothing moves."""
    _res, j = _run(_work({"checkpointable": True}), _cfg(enabled=False, short_enabled=False))
    assert all(x.moves == 0 for x in j.values())
    _res, j = _run(_work({"checkpointable": True}), _cfg(enabled=False))
    assert j["urgent"].wait_s >= 2 * 3_600.0 - 1e-6 and sum(x.moves for x in j.values()) > 0


def test_a_victim_with_nowhere_to_resume_is_not_preempted() -> None:
    """The resume bound: with the other nodes full of work that ends after the bound, no low
    job could start again within 30 min, so none is stopped."""
    fixed = [job(f"fix{i}", 0.0, LONG_S, gpus=4, priority=1) for i in range(2)]
    low = [job(f"low{i}", 0.0, LONG_S, gpus=1, priority=1, checkpointable=True) for i in range(4)]
    _res, j = _run([*fixed, *low, job("urgent", 100.0, 3_600.0, gpus=4, priority=9)], _cfg())
    assert all(x.moves == 0 for x in j.values())


def test_an_elastic_job_shrinks_for_an_urgent_one_and_finishes_later_on_fewer_gpus() -> None:
    """Three 4-GPU nodes full of protected work but one, which holds an elastic 4-GPU job
    (min 2): a 2-GPU urgent job gets half of it. The elastic job is shrunk to 2 GPUs (not
    stopped: there is no room elsewhere), resumes at once on its own node, keeps its progress,
    and its remaining work takes twice as long on half the GPUs."""
    from proto.jobs import Elastic

    fixed = [job(f"fix{i}", 0.0, LONG_S * 3, gpus=4, priority=1) for i in range(2)]
    el = job("el", 0.0, LONG_S, gpus=4, priority=1, elastic=Elastic(min_gpus=2, max_gpus=4))
    urgent = job("urgent", 100.0, 3_600.0, gpus=2, priority=9)
    res, j = _run([*fixed, el, urgent], _cfg(grow_enabled=False))  # grows back: next test
    e, u = j["el"], j["urgent"]
    assert e.shrinks == 1 and e.moves == 1 and e.spec.gpus == 2.0
    assert e.state == "completed" and e.terminal_count == 1
    assert 700.0 <= u.first_start_s <= 700.0 + COST_S + 30.0
    assert e.resume_delays_s and e.resume_delays_s[0] <= 1.0  # its room: its own node
    # the first attempt ran ~t0..t_ckpt at 4 GPUs; the rest, at 2 GPUs, takes twice as long
    t_ckpt = u.first_start_s
    done = t_ckpt - COST_S  # the save froze its progress at the checkpoint's start
    expected_end = t_ckpt + (LONG_S - done) * 2.0
    assert abs(e.end_s - expected_end) < 5.0, (e.end_s, expected_end)
    assert res.preempted_non_checkpointable == 0


def test_a_shrunk_job_grows_back_on_its_node_once_the_gpus_are_free_and_finishes_sooner() -> None:
    """The same shrink, with the grow-back rule on (``stages.grow``): when the urgent job ends
    (its 2 GPUs free on the elastic job's node, nothing waiting, the move window passed), the
    elastic job checkpoints once more and resumes at once on all 4 GPUs of its node, never
    more than it asked; it ends well before the run where it stays at 2 GPUs."""
    from proto.jobs import Elastic

    def work() -> list:  # type: ignore[type-arg]
        fixed = [job(f"fix{i}", 0.0, LONG_S * 3, gpus=4, priority=1) for i in range(2)]
        el = job("el", 0.0, LONG_S, gpus=4, priority=1, elastic=Elastic(min_gpus=2, max_gpus=4))
        return [*fixed, el, job("urgent", 100.0, 3_600.0, gpus=2, priority=9)]

    _res, small = _run(work(), _cfg(grow_enabled=False))
    res, j = _run(work(), _cfg())
    e, u = j["el"], j["urgent"]
    assert e.shrinks == 1 and e.grows == 1 and e.moves == 2 and e.spec.gpus == 4.0
    assert e.state == "completed" and e.terminal_count == 1
    assert e.resume_delays_s and max(e.resume_delays_s) <= 1.0  # both rooms: its own node
    assert e.end_s >= u.end_s  # it grew only after the urgent job gave the GPUs back
    # the rest after the grow runs at 4 GPUs: it saves about half of what was left at 2
    assert e.end_s < small["el"].end_s - 0.4 * (small["el"].end_s - u.end_s), (e.end_s,)
    assert res.preempted_non_checkpointable == 0
