"""Swap leases through the engine (``libs.policy.stages.lease``): a short job that swapped a
long one off a full node and overran its estimate is checkpointed at its lease's end, so the
long job resumes within its bound; a short job that could not be stopped makes no swap."""

from __future__ import annotations

import dataclasses

from libs.policy.config import PolicyConfig, PreemptConfig
from libs.policy.profiles import ProfileTable
from libs.policy.stages.lease import LEASE_RULE
from libs.policy.stages.short_wait import SHORT_RULE
from libs.sim.baselines.mosaic import Mosaic
from libs.sim.engine import simulate
from tests.sim.helpers import job, node, record_move_reasons

COST_S = 30.0
LONG_S = 36_000.0
MODEL = "v100-32gb"


def _run(short_ckpt: bool, short_true_s: float):  # type: ignore[no-untyped-def]
    """One 4-GPU node: a long checkpointable job, then a 4-GPU job estimated at 10 min whose
    true runtime is ``short_true_s``. The move reasons are kept as ordered."""
    cfg = dataclasses.replace(
        PolicyConfig.default(), preempt=PreemptConfig(enabled=False), power_saving=False
    )
    pol = Mosaic(cfg)
    reasons = record_move_reasons(pol)
    jobs = [
        job("L", 0.0, LONG_S, gpus=4, checkpointable=True, priority=1),
        job(
            "S", 100.0, 600.0, gpus=4, checkpointable=short_ckpt, priority=1,
            runtime_by_model={MODEL: short_true_s},
        ),
    ]  # fmt: skip
    res = simulate(jobs, [node("n0")], pol, ProfileTable.default(), checkpoint_cost_s=COST_S)
    return {j.spec.id: j for j in res.jobs}, reasons


def test_a_short_job_that_overruns_its_lease_is_stopped_so_the_long_job_resumes_in_time() -> None:
    j, reasons = _run(short_ckpt=True, short_true_s=6_000.0)
    assert any(r.startswith(SHORT_RULE) and "on a lease" in r for r in reasons), reasons
    assert any(r.startswith(LEASE_RULE) for r in reasons), reasons
    long_job, short = j["L"], j["S"]
    assert long_job.moves >= 1 and short.moves >= 1
    bound_s = PreemptConfig().resume_bound_s
    assert long_job.resume_delays_s and max(long_job.resume_delays_s) <= bound_s
    assert all(x.state == "completed" and x.terminal_count == 1 for x in j.values())


def test_a_short_job_that_keeps_its_estimate_ends_before_its_lease() -> None:
    j, reasons = _run(short_ckpt=True, short_true_s=600.0)
    assert any(r.startswith(SHORT_RULE) for r in reasons), reasons
    assert not any(r.startswith(LEASE_RULE) for r in reasons), reasons
    assert j["S"].moves == 0 and j["L"].moves == 1
    assert max(j["L"].resume_delays_s) <= 600.0 + 2 * COST_S + 60.0


def test_a_short_job_that_could_not_be_stopped_makes_no_swap() -> None:
    """Its lease could not be ended: the long job's promise would rest on its estimate."""
    j, reasons = _run(short_ckpt=False, short_true_s=6_000.0)
    assert reasons == []
    assert j["L"].moves == 0 and j["S"].first_start_s >= LONG_S
