"""Placement's memory of heat (libs.policy.stages.heat): a long job that could never be moved
keeps off a node the thermal guard held hot, while another node can take it; movable or short
work still uses that node; a job that fits only there waits a bounded while, then starts
there; the memory lapses; a hot label counts from the start."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

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
    """Only the node that ran hot is free: the stuck long job waits (``HotNode``) for half
    its runtime, then takes it rather than wait for ever. The wait counts only between passes
    that both kept it off that node: one that gave another reason (the node held again)
    starts the count afresh."""
    s = _sched()
    _ran_hot(s, 5.0)
    s.queue_job(PendingJob(JobSpec(id="fill", gpus=4, est_runtime_s=LONG_S, priority=9), 6.0))
    assert [p.allocation.node for p in s.schedule_pass(6.0)] == ["cool"]
    s.queue_job(PendingJob(JobSpec(id="a", gpus=4, est_runtime_s=LONG_S), 10.0))
    assert s.schedule_pass(20.0) == [] and s.last is not None
    assert s.last.waiting["a"] == "HotNode"
    s.set_cordoned("hot", HOLD_HOT, True)  # it runs hot again: the memory is renewed
    s.schedule_pass(30.0)
    assert s.last.waiting["a"] != "HotNode"
    s.set_cordoned("hot", HOLD_HOT, False)
    patience_s = CFG.thermal.averse_wait_share * LONG_S
    assert s.schedule_pass(40.0) == [] and s.last.waiting["a"] == "HotNode"
    assert s.schedule_pass(20.0 + patience_s + 1.0) == []  # 20 -> 30 does not count
    assert [p.allocation.node for p in s.schedule_pass(40.0 + patience_s + 1.0)] == ["hot"]


def test_a_job_that_queued_for_capacity_still_waits_for_a_cool_node() -> None:
    """A long queue for capacity is no wait for heat: when the node that ran hot is the first
    to free, days after the job arrived, the job still waits for the other node (its wait for
    heat starts then), and takes the hot one only after half its runtime of that."""
    s = _sched()
    _ran_hot(s, 5.0)
    fill = JobSpec(id="fill", gpus=4, est_runtime_s=LONG_S, priority=9)
    ck = JobSpec(id="ck", gpus=4, est_runtime_s=LONG_S, priority=9, checkpointable=True)
    assert _where(s, fill, 6.0) == "cool" and _where(s, ck, 7.0) == "hot"
    s.queue_job(PendingJob(JobSpec(id="a", gpus=4, est_runtime_s=LONG_S), 10.0))
    days = 10.0 + 4 * LONG_S  # far beyond half its runtime, queued for capacity
    assert s.schedule_pass(days) == [] and s.last is not None
    assert s.last.waiting.get("a") != "HotNode"
    _ran_hot(s, days + 1.0)  # the movable job ran it hot again, then ends
    s.cancel_job("ck", days + 2.0)
    assert s.schedule_pass(days + 3.0) == [] and s.last.waiting["a"] == "HotNode"
    patience_s = CFG.thermal.averse_wait_share * LONG_S
    assert s.schedule_pass(days + 3.0 + patience_s - 1.0) == []
    assert [p.allocation.node for p in s.schedule_pass(days + 4.0 + patience_s)] == ["hot"]


def test_a_pass_that_did_not_look_at_a_job_keeps_its_wait_for_heat() -> None:
    """``HeatMemory.note_waits``: a pass that stopped above the job (it is not in the pass's
    reasons) neither adds nor resets; another reason resets; a start forgets. It names the
    instant the job's patience runs out (a pass is due then), or None."""
    mem = _sched().heat
    job = PendingJob(JobSpec(id="a", gpus=4, est_runtime_s=LONG_S), 0.0)
    queued = {"a": job}.get
    patience_s = CFG.thermal.averse_wait_share * LONG_S

    def note(waiting: dict[str, str], now: float) -> float | None:
        return mem.note_waits(waiting, now, queued, CFG)

    assert note({"a": "HotNode"}, 100.0) == pytest.approx(100.0 + patience_s)
    assert note({}, 150.0) == pytest.approx(100.0 + patience_s)
    assert note({"a": "HotNode"}, 200.0) == pytest.approx(100.0 + patience_s)
    assert mem.waited_s["a"] == 100.0
    assert note({"a": "Resources"}, 300.0) is None  # it waits for something else now
    note({"a": "HotNode"}, 400.0)
    assert mem.waited_s["a"] == 100.0
    assert note({"a": "HotNode"}, 450.0) == pytest.approx(400.0 + patience_s - 100.0)
    assert mem.waited_s["a"] == 150.0 and mem.waited_at("a", 500.0) == 200.0
    mem.forget("a")
    assert "a" not in mem.waited_s and note({}, 600.0) is None


def test_a_pass_runs_when_a_kept_off_job_runs_out_of_patience() -> None:
    """No event comes, yet the job may take the risky node once its patience is spent: the
    scheduler asks its driver for a pass at that instant (``next_pass_s``)."""
    s = _sched()
    _ran_hot(s, 5.0)
    s.queue_job(PendingJob(JobSpec(id="fill", gpus=4, est_runtime_s=LONG_S, priority=9), 6.0))
    s.schedule_pass(6.0)
    s.queue_job(PendingJob(JobSpec(id="a", gpus=4, est_runtime_s=LONG_S), 10.0))
    patience_s = CFG.thermal.averse_wait_share * LONG_S
    now, started = 20.0, []
    for _ in range(10):  # the backfill cadence's passes, then the one patience asks for
        started = s.schedule_pass(now)
        due = s.next_pass_s()
        if started or due is None:
            break
        now = due
    assert now == pytest.approx(20.0 + patience_s)
    assert [p.allocation.node for p in started] == ["hot"]


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
