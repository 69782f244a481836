"""Placement's memory of heat (libs.policy.stages.heat): a long job that could never be moved
keeps off a node the thermal guard held hot, while another node can take it; movable or short
work still uses that node; a job that fits only there waits a bounded while, then starts
there; the memory lapses; a hot label counts from the start."""

from __future__ import annotations

import dataclasses

import msgspec

from libs.policy.config import PolicyConfig, ThermalConfig
from libs.policy.core import Scheduler
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from proto.intents import HOLD_HOT
from proto.jobs import Elastic, JobSpec
from tests.policy.strategies import node_spec

CFG = dataclasses.replace(
    PolicyConfig.default(), power_saving=False, thermal=ThermalConfig(risk_clear_busy_s=3600.0)
)
LONG_S = 10 * 3600.0


def _sched(nodes=None) -> Scheduler:  # type: ignore[no-untyped-def]
    nodes = nodes or [node_spec("hot", 4), node_spec("cool", 4)]  # the hot node ranks first
    return Scheduler(nodes, cfg=CFG, profiles=ProfileTable.default(), now=0.0)


def _ran_hot(s: Scheduler, at: float) -> None:
    """The guard held node "hot" at ``at`` and released it (the node cooled)."""
    s.set_cordoned("hot", HOLD_HOT, True)
    s.schedule_pass(at)
    s.set_cordoned("hot", HOLD_HOT, False)


def _where(s: Scheduler, spec: JobSpec, now: float) -> str:
    s.queue_job(PendingJob(spec, now))
    (p,) = s.schedule_pass(now)
    return p.allocation.node


def test_a_long_job_that_could_never_move_keeps_off_a_node_that_ran_hot() -> None:
    cold = _sched()
    assert _where(cold, JobSpec(id="a", gpus=4, est_runtime_s=LONG_S), 10.0) == "hot"
    s = _sched()
    _ran_hot(s, 5.0)
    assert _where(s, JobSpec(id="a", gpus=4, est_runtime_s=LONG_S), 10.0) == "cool"


def test_movable_or_short_work_still_uses_it() -> None:
    for spec in (
        JobSpec(id="ck", gpus=4, est_runtime_s=LONG_S, checkpointable=True),
        JobSpec(id="el", gpus=4, est_runtime_s=LONG_S, elastic=Elastic(min_gpus=1, max_gpus=4)),
        JobSpec(id="short", gpus=4, est_runtime_s=600.0),
    ):
        s = _sched()
        _ran_hot(s, 5.0)
        assert _where(s, spec, 10.0) == "hot", spec.id


def test_a_job_that_fits_only_there_waits_a_while_then_starts_there() -> None:
    """Only the node that ran hot is free: the stuck long job waits (``HotNode``) for a
    quarter of its runtime, then takes it rather than wait for ever."""
    s = _sched()
    _ran_hot(s, 5.0)
    s.queue_job(PendingJob(JobSpec(id="fill", gpus=4, est_runtime_s=LONG_S, priority=9), 6.0))
    assert [p.allocation.node for p in s.schedule_pass(6.0)] == ["cool"]
    s.queue_job(PendingJob(JobSpec(id="a", gpus=4, est_runtime_s=LONG_S), 10.0))
    assert s.schedule_pass(20.0) == [] and s.last is not None
    assert s.last.waiting["a"] == "HotNode"
    s.set_cordoned("hot", HOLD_HOT, True)  # it runs hot again: the memory is renewed
    s.schedule_pass(30.0)
    s.set_cordoned("hot", HOLD_HOT, False)
    later = 10.0 + CFG.thermal.averse_wait_share * LONG_S + 1.0
    assert [p.allocation.node for p in s.schedule_pass(later)] == ["hot"]


def test_the_memory_clears_after_load_without_heat_not_after_idle_time() -> None:
    """Idle for days, the node stays risky; an hour of load without another hold (the
    config's ``risk_clear_busy_s``) clears it."""
    s = _sched()
    _ran_hot(s, 5.0)
    days = 5 * 86_400.0
    s.schedule_pass(days)  # idle all along: nothing learnt is forgotten
    assert _where(s, JobSpec(id="a", gpus=4, est_runtime_s=LONG_S), days) == "cool"
    ck = JobSpec(id="ck", gpus=2, est_runtime_s=LONG_S, checkpointable=True)
    assert _where(s, ck, days + 1.0) == "hot"  # movable work runs there, and it stays cool
    s.schedule_pass(days + 3602.0)
    assert _where(s, JobSpec(id="b", gpus=2, est_runtime_s=LONG_S), days + 3603.0) == "hot"


def test_a_hot_label_counts_from_the_start() -> None:
    hot = msgspec.structs.replace(node_spec("hot", 4), labels={"mosaic/heat": "1.5"})
    s = _sched([hot, node_spec("cool", 4)])
    assert _where(s, JobSpec(id="a", gpus=4, est_runtime_s=LONG_S), 10.0) == "cool"
