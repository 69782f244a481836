"""The scorer's pending set and the placer's tracker as snapshots hold them, without NATS.

Why these tests: a restart from a snapshot replays the events between the snapshot's sequence
(the consumer's ack floor) and the moment the model was encoded, so both folds must end in the
same state whether or not a run of events they already hold is applied again. Before
``Preempted`` named its attempt, a replayed ``Preempted`` after the next ``Placed`` freed the
running attempt in the tracker (the placer would have given its GPUs to another job) and queued
a third attempt in the pending set.
"""

from __future__ import annotations

import msgspec
import pytest

from proto.events import (
    Checkpointed,
    Completed,
    LifecycleEvent,
    Placed,
    Preempted,
    Queued,
    Started,
    Submitted,
)
from proto.jobs import JobSpec
from services.placer.tracker import JobTracker, TrackerSnapshot
from services.scorer.pending import PendingSet, PendingSnapshot


def _sub(job: str, t: float = 1.0, gpus: float = 1) -> Submitted:
    return Submitted(job_id=job, time=t, spec=JobSpec(id=job, gpus=gpus, submit_time=t))


def history() -> list[LifecycleEvent]:
    """Two preemptions of one job, one job that ends, one still pending, one invalid."""
    return [
        _sub("a"),
        _sub("b", 2.0),
        _sub("bad", 2.5, gpus=-1),
        Queued(job_id="a", time=3.0),
        Placed(job_id="a", time=4.0, node="n1", attempt=1),
        Started(job_id="a", time=5.0, node="n1", attempt=1),
        Checkpointed(job_id="a", time=6.0, node="n1", progress=0.25),
        Preempted(job_id="a", time=7.0, node="n1", attempt=1),
        Queued(job_id="a", time=8.0),
        Placed(job_id="a", time=9.0, node="n2", attempt=2),
        Started(job_id="a", time=10.0, node="n2", attempt=2),
        Preempted(job_id="a", time=11.0, node="n2", attempt=2),
        Queued(job_id="a", time=12.0),
        Placed(job_id="a", time=13.0, node="n1", attempt=3),
        Started(job_id="a", time=14.0, node="n1", attempt=3),
        _sub("c", 15.0),
        Placed(job_id="c", time=16.0, node="n2"),
        Completed(job_id="c", time=17.0, node="n2"),
        _sub("c", 18.0),  # a duplicate after the end: never a second job
        Queued(job_id="b", time=19.0),
    ]


def _pending_state(s: PendingSet) -> PendingSnapshot:
    """The state, without the event counters (a replay counts its events again)."""
    snap = msgspec.msgpack.decode(s.encode(), type=PendingSnapshot)
    terminal = [(j, 0) for j, _ in snap.terminal]
    return msgspec.structs.replace(snap, events=0, terminal=terminal, refused=0)


def _tracker_state(t: JobTracker) -> TrackerSnapshot:
    snap = msgspec.msgpack.decode(t.encode(), type=TrackerSnapshot)
    terminal = [(j, e, 0) for j, e, _ in snap.terminal]
    return msgspec.structs.replace(snap, events_seen=0, terminal=terminal)


def _windows(n: int) -> list[tuple[int, int]]:
    """Every (floor, encoded-at) pair: events floor+1..at are folded in and then replayed."""
    return [(f, t) for t in range(n + 1) for f in range(t + 1)]


@pytest.mark.parametrize("kind", ["pending", "tracker"])
def test_replaying_what_a_snapshot_holds_changes_nothing(kind: str) -> None:
    events = history()
    make = PendingSet if kind == "pending" else JobTracker
    state = _pending_state if kind == "pending" else _tracker_state
    whole = make()
    for ev in events:
        whole.apply(ev)
    expected = state(whole)
    for floor, at in _windows(len(events)):
        model = make()
        for ev in events[:at]:
            model.apply(ev)
        restored = make().load(model.encode())
        for ev in events[floor:]:  # what the restarted consumer delivers: floor+1 onwards
            restored.apply(ev)
        assert state(restored) == expected, (floor, at)


def test_a_replayed_preemption_does_not_free_the_running_attempt() -> None:
    t = JobTracker()
    for ev in history()[:14]:  # up to a's third Placed
        t.apply(ev)
    assert not t.holds_nothing("a", 3)
    t.apply(Preempted(job_id="a", time=11.0, node="n2", attempt=2))  # replayed
    t.apply(Placed(job_id="a", time=13.0, node="n1", attempt=3))  # replayed
    assert not t.holds_nothing("a", 3) and t.holds_nothing("a", 2)
    s = PendingSet()
    for ev in history()[:14]:
        s.apply(ev)
    s.apply(Preempted(job_id="a", time=11.0, node="n2", attempt=2))
    assert "a" not in s.pending  # not a fourth attempt


def test_the_pending_set_round_trips_and_refuses_a_corrupt_or_foreign_snapshot() -> None:
    s = PendingSet()
    for ev in history():
        s.apply(ev)
    assert sorted(s.pending) == ["b"]
    back = PendingSet().load(s.encode())
    assert back.pending == s.pending and back.is_terminal("c")
    assert not back.needs_queued_event("b")  # its Queued went out before the snapshot
    back.apply(Preempted(job_id="a", time=20.0, node="n1", attempt=3))
    assert back.pending["a"].attempt == 4 and back.pending["a"].progress == 0.25
    assert back.needs_queued_event("a")
    for bad in (b"", b"\xc1", msgspec.msgpack.encode({"version": 2})):
        with pytest.raises((ValueError, msgspec.DecodeError, msgspec.ValidationError)):
            PendingSet().load(bad)


def test_the_tracker_round_trips_without_its_own_unannounced_placements() -> None:
    t = JobTracker()
    for ev in history():
        t.apply(ev)
    t.note_placed("b", 1)  # committed, Placed not yet out
    back = JobTracker().load(t.encode())
    assert t.next_attempt("b") == 2 and back.next_attempt("b") == 1
    assert not back.placed_seen("b", 1)  # so a takeover resends b's Placed
    assert back.placed_seen("a", 3) and back.started_seen("a", 3)
    assert back.is_terminal("c") and back.terminal == t.terminal
    assert [s.id for s, _ in back.invalid_jobs()] == ["bad"]
    assert back.progress == {"a": 0.25}
    for bad in (b"", b"\xc1", msgspec.msgpack.encode({"version": 9})):
        with pytest.raises((ValueError, msgspec.DecodeError, msgspec.ValidationError)):
            JobTracker().load(bad)


def test_an_ended_job_keeps_only_its_end_and_is_forgotten_after_the_retention() -> None:
    # retention 6 events: beyond the 5 replayed after the end (it must exceed any replay)
    t, s = JobTracker(keep_terminal_events=6), PendingSet(keep_terminal_events=6)
    run = [
        _sub("x"),
        Placed(job_id="x", time=2.0, node="n"),
        Started(job_id="x", time=3.0, node="n"),
        Checkpointed(job_id="x", time=4.0, node="n", progress=0.5),
        Completed(job_id="x", time=5.0, node="n"),
    ]
    for ev in [*run, *run]:  # the whole run replayed after the end: nothing comes back
        t.apply(ev)
        s.apply(ev)
    assert t.is_terminal("x") and t.known("x")
    assert (t.specs, t.placed, t.started, t.progress) == ({}, {}, {}, {})
    assert s.is_terminal("x") and s.pending == {}
    for i in range(4):  # other jobs' events move retention on
        t.apply(_sub(f"o{i}"))
        s.apply(_sub(f"o{i}"))
    assert not t.is_terminal("x") and not s.is_terminal("x")
    assert len(t.terminal) == 0 and "x" not in s.pending
    t.apply(_sub("x", 30.0))  # an id submitted anew after it was forgotten: a new job
    s.apply(_sub("x", 30.0))
    assert "x" in t.specs and "x" in s.pending


def _shrink_history(twice: bool) -> list[LifecycleEvent]:
    """An elastic 4-GPU job (min 1) shrunk to 2, placed again, then (``twice``) to 1."""
    from proto.jobs import Elastic

    spec = JobSpec(
        id="e", gpus=4, est_runtime_s=1000.0, elastic=Elastic(min_gpus=1, max_gpus=4),
        submit_time=1.0,
    )  # fmt: skip
    evs: list[LifecycleEvent] = [
        Submitted(job_id="e", time=1.0, spec=spec),
        Placed(job_id="e", time=2.0, node="n1", attempt=1),
        Checkpointed(job_id="e", time=3.0, node="n1", progress=0.5),
        Preempted(job_id="e", time=4.0, node="n1", attempt=1, resize_gpus=2),
    ]
    if twice:
        evs += [
            Placed(job_id="e", time=5.0, node="n1", attempt=2),
            Preempted(job_id="e", time=6.0, node="n1", attempt=2, resize_gpus=1),
        ]
    return evs


@pytest.mark.parametrize("twice", [False, True])
def test_a_shrink_resizes_the_job_in_every_fold_once_even_when_replayed(twice: bool) -> None:
    """``Preempted.resize_gpus``: the tracker, the pending set and the gateway's jobs model all
    resize the job the same way (``stages.shrink.fold_resize``: runtime scaled by the GPU
    ratio), and replaying the events (a restart from a snapshot) changes nothing."""
    from services.gateway.jobs_view import JobsModel

    evs = _shrink_history(twice)
    want_gpus = 1.0 if twice else 2.0
    t, p, g = JobTracker(), PendingSet(), JobsModel()
    for ev in [*evs, *evs[1:]]:  # the whole history, then a replay of it
        t.apply(ev)
        p.apply(ev)
        g.apply(ev)
    assert t.specs["e"].gpus == want_gpus
    assert t.specs["e"].est_runtime_s == pytest.approx(1000.0 * 4 / want_gpus)
    assert p.pending["e"].spec == t.specs["e"] and p.pending["e"].progress == 0.5
    view = g.get("e")
    assert view is not None and view.gpus == want_gpus and view.state == "pending"


def test_a_resize_the_job_may_not_take_is_ignored() -> None:
    """Below its minimum, or a job that is not elastic: the fold keeps the size."""
    from libs.policy.stages.shrink import fold_resize
    from proto.jobs import Elastic

    plain = JobSpec(id="p", gpus=4)
    assert fold_resize(plain, 2) == plain
    el = JobSpec(id="e", gpus=4, elastic=Elastic(min_gpus=2, max_gpus=4))
    assert fold_resize(el, 1) == el and fold_resize(el, 4) == el and fold_resize(el, 0) == el
    assert fold_resize(el, 3).gpus == 3.0


@pytest.mark.parametrize("replay_from", [1, 3, 4])
def test_a_grow_back_after_a_shrink_survives_a_replay_of_the_earlier_shrink(
    replay_from: int,
) -> None:
    """Sizes are not monotone once jobs grow back (``stages.grow``): shrunk 4 -> 2 (attempt 1),
    grown back 2 -> 4 (attempt 2). Replaying the history from any point (the attempt-1 shrink
    among it) must not undo the grow: every fold keys its resize on the attempt it ends."""
    from services.gateway.jobs_view import JobsModel

    evs = [
        *_shrink_history(False),
        Placed(job_id="e", time=5.0, node="n1", attempt=2),
        Preempted(job_id="e", time=6.0, node="n1", attempt=2, resize_gpus=4),
    ]
    t, p, g = JobTracker(), PendingSet(), JobsModel()
    for ev in [*evs, *evs[replay_from:]]:
        t.apply(ev)
        p.apply(ev)
        g.apply(ev)
    assert t.specs["e"].gpus == 4.0
    assert t.specs["e"].est_runtime_s == pytest.approx(1000.0)  # the inverse of the shrink
    assert p.pending["e"].spec == t.specs["e"]
    view = g.get("e")
    assert view is not None and view.gpus == 4.0
