"""The grow-back rule (libs.policy.stages.grow; issue 16): a shrunk elastic job grows back onto
its own node's free GPUs, never above the size it asked, never while a waiting job could start
there, a burst is recent or the gain is below the move's cost; and, through the scheduler and
the read models' fold, a grow is a resize every driver applies once per attempt."""

from __future__ import annotations

import dataclasses

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig, PreemptConfig
from libs.policy.stages import grow as G
from libs.policy.stages import preempt as P
from libs.policy.stages.shrink import fold_resize, resize_error, resized
from libs.policy.types import PendingJob, RunningJob
from proto.jobs import Elastic, JobSpec
from proto.ledger import Allocation
from tests.policy.strategies import node_spec

NOW = 100_000.0
CFG = dataclasses.replace(PolicyConfig.default(), preempt=PreemptConfig(min_run_s=0.0))
FACTS = P.MoveFacts(started_at=NOW - 10_000.0, last_moved_at=NOW - 10_000.0)


def _spec(jid: str, gpus: int, *, elastic: tuple[int, int] | None = None) -> JobSpec:
    return JobSpec(
        id=jid, gpus=float(gpus), gpu_mem_gb=4.0, host_mem_gb=1.0, cpus=1.0, priority=1,
        est_runtime_s=36_000.0, checkpointable=True,
        elastic=Elastic(min_gpus=elastic[0], max_gpus=elastic[1]) if elastic else None,
    )  # fmt: skip


def _world(
    held: int = 4, others: int = 0, node_gpus: int = 8, remaining_s: float = 20_000.0
) -> tuple[ClusterView, RunningJob]:
    """One node of ``node_gpus`` GPUs: the shrunk job on its first ``held`` GPUs (asked 8, min
    4), ``others`` GPUs after it taken by another job; the rest free."""
    view = ClusterView.build([node_spec("n0", node_gpus)])
    spec = _spec("el", held, elastic=(4, 8))
    allocs = [(spec, tuple(range(held)))]
    if others:
        allocs.append((_spec("other", others), tuple(range(held, held + others))))
    for s, gpus in allocs:
        _take(view, s, gpus)
    return view, RunningJob(spec, 0, tuple(range(held)), 1.0, NOW + remaining_s)


def _take(view: ClusterView, spec: JobSpec, gpus: tuple[int, ...]) -> None:
    alloc = Allocation(
        job_id=spec.id, node="n0", gpu_indices=gpus, gpu_share=1.0, gpu_mem_gb=4.0,
        host_mem_gb=1.0, cpus=1.0, time=0.0, attempt=1, spec=spec,
    )  # fmt: skip
    view.allocate(alloc)


def _size(job: RunningJob, view: ClusterView, waiting=(), asked: int = 8, cfg=CFG):  # type: ignore[no-untyped-def]
    return G.grow_size(job, asked, view, list(waiting), FACTS, NOW, cfg)


def test_a_shrunk_job_grows_back_to_the_size_it_asked_when_its_node_is_free() -> None:
    view, job = _world()
    to, why = _size(job, view)
    assert to == 8 and why.startswith(G.GROW_RULE)


def test_it_grows_only_onto_free_gpus_of_its_own_node() -> None:
    view, job = _world(others=2)  # 2 of the 4 it gave back are taken
    assert _size(job, view)[0] == 6
    view, job = _world(others=4)  # none free
    assert _size(job, view) == (0, "no free GPU on its node")


def test_it_never_grows_beyond_what_it_asked_nor_max_gpus() -> None:
    view, job = _world(held=4, node_gpus=8)
    assert _size(job, view, asked=6)[0] == 6
    assert _size(job, view, asked=16)[0] == 8  # Elastic.max_gpus = 8
    assert _size(job, view, asked=4)[0] == 0  # not shrunk below what it asked


def test_a_waiting_job_that_fits_those_gpus_keeps_them() -> None:
    view, job = _world()
    blocked = PendingJob(_spec("blocked", 2), NOW - 50.0)
    to, why = _size(job, view, [blocked])
    assert to == 0 and "blocked" in why
    too_big = PendingJob(_spec("big", 8), NOW - 50.0)  # cannot start on the 4 free ones
    assert _size(job, view, [too_big])[0] == 8


def test_no_grow_when_the_gain_is_below_the_checkpoint_cost() -> None:
    cost_s = 2.0 * CFG.preempt.checkpoint_cost_s
    view, job = _world(remaining_s=cost_s)  # saves half of it: less than the move
    to, why = _size(job, view)
    assert to == 0 and "saves" in why
    view, job = _world(remaining_s=4.0 * cost_s)
    assert _size(job, view)[0] == 8


def test_no_grow_within_the_move_window_nor_on_a_held_node() -> None:
    view, job = _world()
    recent = P.MoveFacts(started_at=NOW - 10.0, last_moved_at=NOW - 10.0)
    assert G.grow_size(job, 8, view, [], recent, NOW, CFG)[0] == 0
    view.set_cordoned("n0", True)
    assert _size(job, view)[0] == 0


def test_no_grow_while_a_burst_is_recent_or_a_replica_waits() -> None:
    view, job = _world()
    plan = G.grow_plan({"el": 8}, {"el": job}, view, [], {"el": FACTS}, NOW, CFG, quiet=False)
    assert plan == []
    plan = G.grow_plan({"el": 8}, {"el": job}, view, [], {"el": FACTS}, NOW, CFG, quiet=True)
    assert [(r.spec.id, to) for r, to, _ in plan] == [("el", 8)]
    off = dataclasses.replace(CFG, preempt=dataclasses.replace(CFG.preempt, grow_enabled=False))
    assert G.grow_plan({"el": 8}, {"el": job}, view, [], {"el": FACTS}, NOW, off, quiet=True) == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 7),
    st.integers(0, 7),
    st.integers(1, 16),
    st.sampled_from([4, 8]),
)
def test_a_grow_never_over_allocates_its_node(held: int, others: int, asked: int, n: int) -> None:
    """Whatever the node's state: the size grown to is at most what it asked and max_gpus, and
    once the job's own GPUs are released the node has that many whole GPUs free for it."""
    held, others = min(held, n), min(others, n - min(held, n))
    view = ClusterView.build([node_spec("n0", n)])
    spec = JobSpec(
        id="el", gpus=float(held), gpu_mem_gb=4.0, host_mem_gb=1.0, cpus=1.0,
        elastic=Elastic(min_gpus=1, max_gpus=n), est_runtime_s=1e6,
    )  # fmt: skip
    _take(view, spec, tuple(range(held)))
    if others:
        _take(view, _spec("o", others), tuple(range(held, held + others)))
    job = RunningJob(spec, 0, tuple(range(held)), 1.0, NOW + 1e6)
    to, _ = G.grow_size(job, asked, view, [], FACTS, NOW, CFG)
    if to:
        assert held < to <= min(asked, n)
        assert to - held <= int((view.gpu_free[0] >= 1.0).sum())
        assert resize_error(spec, to) == ""
        grown = resized(spec, to)
        assert grown.gpus == to and abs(grown.est_runtime_s - spec.est_runtime_s * held / to) < 1e-6


def test_resized_grows_with_the_inverse_runtime_scaling() -> None:
    spec = _spec("el", 8, elastic=(4, 8))
    small = resized(spec, 4)
    assert small.est_runtime_s == 72_000.0
    back = resized(small, 8)
    assert back.gpus == 8.0 and back.est_runtime_s == spec.est_runtime_s
    assert resize_error(small, 9) != ""  # never above max_gpus


def test_the_fold_sets_the_events_size_so_a_replay_of_the_same_event_is_a_no_op() -> None:
    spec = _spec("el", 8, elastic=(4, 8))
    small = fold_resize(spec, 4)
    assert fold_resize(small, 4) == small  # the shrink's event folded again
    back = fold_resize(small, 8)
    assert back == msgspec.structs.replace(spec)
    assert fold_resize(back, 8) == back  # the grow's event folded again
    assert fold_resize(back, 9) == back  # a size it may not take: ignored


def test_the_move_book_remembers_the_asked_size_and_grows_only_after_the_quiet_window() -> None:
    """``MoveBook``: a shrink order records the size the job held (8); the resized attempt on 4
    GPUs grows back to 8 on its own node (``to_node``: its room), only once the burst rule has
    moved nobody for ``grow_quiet_s``; the grow order forgets the record (it is whole again)."""
    from libs.policy.decisions import MoveOrder
    from libs.policy.moves import MoveBook

    view, small = _world()
    big = RunningJob(resized(small.spec, 8), 0, tuple(range(8)), 1.0, NOW)
    book = MoveBook(1)
    book.started(big, 1, "n0", NOW - 50_000.0)
    book.order(MoveOrder("el", 1, "n0", "preempt", "burst", shrink_to=4), NOW - 40_000.0, 1800.0)
    assert book.asked == {"el": 8}
    book.ended("el", 0)
    book.started(small, 2, "n0", NOW - 39_000.0)
    book.last_burst_s = NOW - 60.0  # a burst a minute ago: not quiet
    assert book.plan_grow(view, [], NOW, CFG) == []
    book.last_burst_s = NOW - CFG.preempt.grow_quiet_s
    (mo,) = book.plan_grow(view, [], NOW, CFG)
    assert (mo.job_id, mo.attempt, mo.shrink_to, mo.to_node) == ("el", 2, 8, "n0")
    assert book.asked == {} and "el" in book.moving
