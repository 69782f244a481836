"""The move rules' memos (libs.policy.fast.plans) give the definitions' answers: a replay with
every memo checking itself against the definition at every hit (``verify``), and the window
check ``time_protected`` against ``protection``'s words."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from libs.policy import moves as M
from libs.policy.config import PreemptConfig
from libs.policy.core import Scheduler
from libs.policy.fast.plans import GrowMemo, PlanMemo
from libs.policy.stages import preempt as P
from libs.policy.types import RunningJob
from libs.sim.runner import run_simulation
from proto.jobs import JobSpec


def test_a_replay_with_every_memo_checked_against_its_definition(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A loaded synthetic replay, where the rules look again and again over a changing
    cluster: every answer the memos give from memory equals the definition's (``verify``
    raises otherwise), and the memos did answer from memory."""
    plans: list[PlanMemo] = []
    grows: list[GrowMemo] = []

    def plan_memo() -> PlanMemo:
        plans.append(PlanMemo(verify=True))
        return plans[-1]

    def grow_memo() -> GrowMemo:
        grows.append(GrowMemo(verify=True))
        return grows[-1]

    monkeypatch.setattr(M, "PlanMemo", plan_memo)
    monkeypatch.setattr(M, "GrowMemo", grow_memo)
    kept_next_grow_s = Scheduler._next_grow_s
    asked: list[float | None] = []

    def next_grow_s(self: Scheduler, now: float) -> float | None:
        got = kept_next_grow_s(self, now)
        assert got == self._next_grow_scan_s(now)
        asked.append(got)
        return got

    monkeypatch.setattr(Scheduler, "_next_grow_s", next_grow_s)
    out = run_simulation("synthetic:1500", "seed", 48, ["mosaic"], None, load=1.5)
    assert out["jobs"]
    assert plans and sum(m.hits for m in plans) > 100
    assert grows and sum(m.hits for m in grows) > 100
    assert any(t is not None for t in asked)


@given(
    started=st.floats(0.0, 10_000.0),
    moved=st.one_of(st.none(), st.floats(0.0, 10_000.0)),
    later=st.floats(0.0, 20_000.0),
)
def test_time_protected_is_protections_windows(started, moved, later) -> None:  # type: ignore[no-untyped-def]
    """``time_protected`` is True exactly when ``protection`` refuses a movable job for one of
    its two windows, and once False it stays False."""
    pc = PreemptConfig()
    spec = JobSpec(id="j", checkpointable=True)
    job = RunningJob(spec, 0, (0,), 1.0, 1e9)
    facts = P.MoveFacts(started_at=started, last_moved_at=moved)
    for now in (later, later + 1.0, later + 4000.0):
        assert P.time_protected(facts, now, pc) == bool(P.protection(job, facts, now, pc))
    if not P.time_protected(facts, later, pc):
        assert not P.time_protected(facts, later + 1.0, pc)
    assert not P.time_protected(None, later, dataclasses.replace(pc))
