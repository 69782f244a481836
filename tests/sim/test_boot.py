"""Boot protection through the engine (``libs.policy.stages.boot``): a high-priority job that
would wait for a sleeping node to boot starts now in the place of a low-priority job that may
move, and that job resumes on the woken node within its bound; with the rule off it waits the
boot, and a job that may not move is never stopped for it."""

from __future__ import annotations

import dataclasses

from libs.policy.config import PolicyConfig
from libs.policy.profiles import ProfileTable
from libs.policy.stages.boot import BOOT_RULE
from libs.sim.baselines.mosaic import Mosaic
from libs.sim.engine import simulate
from tests.sim.helpers import job, node, record_move_reasons

COST_S = 30.0
ARRIVE_S = 2_000.0  # the low-priority job has run 2,000 s (past min_run_s) when it arrives
CFG = PolicyConfig.default()


def _run(boot: bool, low_ckpt: bool = True):  # type: ignore[no-untyped-def]
    """Two 4-GPU nodes, power saving with no warm reserve: a low-priority 4-GPU job fills one,
    the other falls asleep; a priority-8 4-GPU job arrives at ``ARRIVE_S``."""
    pc = dataclasses.replace(CFG.preempt, boot_enabled=boot, short_enabled=False)
    cfg = dataclasses.replace(
        CFG, preempt=pc, power_saving=True, warm_reserve=False, warm_reserve_frac=0.0
    )
    pol = Mosaic(cfg)
    reasons = record_move_reasons(pol)
    jobs = [
        job("low", 0.0, 20_000.0, gpus=4, checkpointable=low_ckpt, priority=1),
        job("high", ARRIVE_S, 3_000.0, gpus=4, checkpointable=True, priority=8),
    ]
    nodes = [node("n0"), node("n1")]
    res = simulate(jobs, nodes, pol, ProfileTable.default(), checkpoint_cost_s=COST_S)
    return {j.spec.id: j for j in res.jobs}, reasons


def test_a_high_priority_job_does_not_wait_for_a_boot_its_victim_does() -> None:
    j, reasons = _run(boot=True)
    assert any(r.startswith(BOOT_RULE) for r in reasons), reasons
    high, low = j["high"], j["low"]
    assert high.first_start_s - ARRIVE_S <= 2 * COST_S  # the victim's save, not a boot
    assert low.moves == 1 and len(low.resume_delays_s) == 1
    # the victim waits for the woken node's boot (counted from its save's end), in its bound
    assert low.resume_delays_s[0] >= CFG.resume_s - COST_S
    assert low.resume_delays_s[0] <= min(CFG.resume_s + 3 * COST_S, CFG.preempt.resume_bound_s)
    assert all(x.state == "completed" and x.terminal_count == 1 for x in j.values())


def test_without_the_rule_the_high_priority_job_waits_for_the_boot() -> None:
    j, reasons = _run(boot=False)
    assert not any(r.startswith(BOOT_RULE) for r in reasons), reasons
    assert j["high"].first_start_s - ARRIVE_S >= CFG.resume_s
    assert j["low"].moves == 0


def test_a_job_that_may_not_move_is_never_stopped_for_a_boot() -> None:
    j, reasons = _run(boot=True, low_ckpt=False)
    assert reasons == []
    assert j["low"].moves == 0 and j["high"].first_start_s - ARRIVE_S >= CFG.resume_s
