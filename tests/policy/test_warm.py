"""The warm reserve (libs.policy.warm, power.plan's ``keep_nodes``): its size follows the recent
starts; the plan never suspends below it, wakes nodes when a start eats into it, and a
high-priority job that arrives on an idle cluster starts at once instead of waiting a boot."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.placement import place, to_allocation
from libs.policy.power import plan
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob
from libs.policy.warm import WarmHistory, bursts, reserve_nodes
from proto.jobs import JobSpec
from tests.policy.strategies import node_spec

CFG = PolicyConfig.default()
NOW = 41_000.0  # after every start below


def _cluster(n_a100: int = 4, n_t4: int = 0) -> list:
    a = [node_spec(f"a{i}", 8, "a100-80gb", 80.0, host=1024.0) for i in range(n_a100)]
    return a + [node_spec(f"t{i}", 8, "t4", 16.0, host=1024.0) for i in range(n_t4)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 5000), st.sampled_from([0.5, 1.0, 2.0, 8.0])), max_size=30),
    st.floats(1.0, 1000.0),
)
def test_bursts_are_the_gpus_started_within_the_window_before_each_start(starts, window_s):
    starts = sorted(starts)
    t = np.array([s for s, _ in starts])
    g = np.array([x for _, x in starts])
    got = bursts(t, g, window_s)
    for j in range(len(t)):  # brute force: (t_j - window, t_j], j and its equal-time peers
        assert got[j] == g[(t > t[j] - window_s) & (np.arange(len(t)) <= j)].sum()


def test_reserve_covers_the_quantile_burst_and_the_high_priority_headroom():
    # ten lone 1-GPU starts an hour apart, then a burst of 12 GPUs within a boot
    t = np.array([3600.0 * i for i in range(10)] + [40_000.0 + 10 * i for i in range(12)])
    g = np.ones(len(t))
    high = np.zeros(len(t), dtype=bool)
    cfg = dataclasses.replace(
        CFG, warm_quantile=0.5, warm_high_headroom=False, warm_history_s=86_400.0
    )
    n, burst, head = reserve_nodes(t, g, high, now=NOW, node_gpus=8.0, cfg=cfg)
    assert (n, head) == (1, 0.0) and burst == 1.0  # the median start came alone
    cfg = dataclasses.replace(cfg, warm_quantile=1.0)
    got = reserve_nodes(t, g, high, now=NOW, node_gpus=8.0, cfg=cfg)
    assert got[:2] == (2, 12.0)  # 12 GPUs: 2 nodes
    high[3] = True
    g[3] = 8.0  # a high-priority whole-node job: one more node of head-room
    cfg = dataclasses.replace(cfg, warm_quantile=0.5, warm_high_headroom=True)
    # bursts now: nine lone 1s, the lone 8, then 1..12: the median (11th of 22) is 2 GPUs;
    # 2 + 8 GPUs of head-room -> 2 nodes
    assert reserve_nodes(t, g, high, now=NOW, node_gpus=8.0, cfg=cfg) == (2, 2.0, 8.0)
    # no start in the history: nothing kept; the switch off: nothing kept
    empty = np.zeros(0)
    assert reserve_nodes(empty, empty, empty.astype(bool), now=NOW, node_gpus=8.0, cfg=CFG)[0] == 0
    off = dataclasses.replace(CFG, warm_reserve=False)
    assert reserve_nodes(t, g, high, now=NOW, node_gpus=8.0, cfg=off)[0] == 0


def test_history_forgets_starts_older_than_its_window():
    view = ClusterView.build(_cluster(2, 2))
    h = WarmHistory(view, CFG)
    a100 = view.models.index("a100-80gb")
    h.started(a100, 8.0, False, 0.0)
    keep, nxt = h.keep(10.0)
    assert keep[a100] == 1 and keep.sum() == 1 and nxt == CFG.warm_history_s
    assert "a100-80gb keeps 1 empty node(s) awake" in h.describe(a100, 10.0)
    keep, nxt = h.keep(CFG.warm_history_s + 1.0)
    assert keep.sum() == 0 and nxt == np.inf


def _plan(view, suspended, keep, idle_s=1e6):
    n = len(view.node_ids)
    return plan(
        view,
        idle_s=np.full(n, idle_s),
        suspended=np.asarray(suspended, dtype=bool),
        resuming=np.zeros(n, dtype=bool),
        blocked=[],
        reserved=(),
        cfg=CFG,
        keep_nodes=np.asarray(keep, dtype=np.int64),
    )


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(0, 6), st.integers(0, 8), st.integers(0, 8))
def test_plan_never_suspends_below_the_reserve_and_refills_it(n_a, n_t, keep_a, keep_t):
    """Every node idle long enough, some asleep: afterwards each model has min(reserve, its
    nodes) spare nodes (awake empty or booting), the rest asleep, and nothing is both
    suspended and woken."""
    view = ClusterView.build(_cluster(n_a, n_t))
    n = len(view.node_ids)
    suspended = np.arange(n) % 2 == 1
    keep = np.zeros(len(view.models), dtype=np.int64)
    keep[view.models.index("a100-80gb")] = keep_a
    if n_t:
        keep[view.models.index("t4")] = keep_t
    p = _plan(view, suspended, keep)
    assert not set(p.suspend) & set(p.resume) and set(p.warm) == set(p.resume)
    up = ~suspended.copy()
    up[list(p.suspend)] = False
    up[list(p.resume)] = True
    for m, name in enumerate(view.models):
        of_m = view.model_idx == m
        assert up[of_m].sum() == min(keep[m], of_m.sum()), name


def test_wakes_when_a_start_eats_the_reserve():
    view = ClusterView.build(_cluster(4))
    suspended = np.array([False, False, True, True])
    assert _plan(view, suspended, [2]) == _plan(view, suspended, [2])  # a fixed point
    p = _plan(view, suspended, [2])
    assert p.suspend == () and p.resume == ()
    # a job takes node 0: one spare node left of the two kept, so one sleeper wakes
    spec = JobSpec(id="x", gpus=1.0, gpu_mem_gb=8.0)
    res = place(spec, view, ProfileTable.default(), CFG)
    assert not suspended[res.node_index]
    view.allocate(to_allocation(spec, res, 0.0))
    p = _plan(view, suspended, [2])
    assert p.suspend == () and len(p.resume) == 1 and p.warm == p.resume
    assert suspended[p.resume[0]]


def _idle_scheduler(
    cfg: PolicyConfig, n_a100: int = 3, n_t4: int = 2, priorities: tuple[int, ...] = (5, 5)
) -> tuple[Scheduler, float]:
    """A scheduler whose A100 nodes ran two short whole-node jobs (of these priorities) and
    then idled for an hour (long past ``suspend_after_s``), the T4 nodes never used:
    (scheduler, now)."""
    s = Scheduler(_cluster(n_a100, n_t4), cfg=cfg, profiles=ProfileTable.default())
    for i, prio in enumerate(priorities):
        spec = JobSpec(id=f"w{i}", gpus=8.0, gpu_mem_gb=40.0, priority=prio)
        s.queue_job(PendingJob(spec, 0.0))
    d = s.tick(0.0)
    assert len(d.places) == 2
    for p in d.places:
        s.start_job(p.job.spec.id, p.allocation, p.job.spec, 0.0)
        s.end_job(p.job.spec.id, 600.0)
    now = 600.0
    while now < 4200.0:  # an hour of quiet, stepped at the instants the scheduler asks for
        d = s.tick(now, woke=False)
        now = d.next_tick_s if d.next_tick_s is not None and d.next_tick_s > now else now + 60
    return s, 4200.0


def test_a_high_priority_job_on_an_idle_cluster_starts_without_a_boot():
    """Without the reserve every idle node sleeps and the job waits a boot (the test can
    fail); with it an A100 node is awake and the job starts in the tick it arrives."""
    off, now = _idle_scheduler(dataclasses.replace(CFG, warm_reserve=False))
    on, _ = _idle_scheduler(CFG)
    # the T4 nodes (no start in the history) sleep; the idle A100 nodes the reserve keeps
    # say why they are up: the reserve (1 node) + the 8-GPU head-room (1 node)
    states = {n: on.power_state(n) for n in on.view.node_ids}
    assert [states[n] for n in ("t0", "t1")] == ["asleep", "asleep"]
    awake = [n for n, st_ in states.items() if st_ == "awake"]
    assert len(awake) == 2
    for n in awake:
        assert on.power_reason(n, now).startswith("awake: warm reserve: a100-80gb keeps 2")
    assert on.power_reason("t0", now) == "asleep"
    assert all(st_ == "asleep" for st_ in (off.power_state(n) for n in off.view.node_ids))
    urgent = JobSpec(id="hi", gpus=8.0, gpu_mem_gb=40.0, priority=9)
    for s, starts in ((off, False), (on, True)):
        s.queue_job(PendingJob(urgent, now))
        d = s.tick(now)
        assert bool(d.places) == starts
        if not starts:  # it waits for the node woken for it
            assert d.wake and s.reason_of("hi") == "NodeWaking" and not d.warm
        else:  # it took a kept node: the same tick wakes a sleeper to refill the reserve
            assert d.warm and set(d.warm) <= set(d.wake)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0, 8.0]), min_size=1, max_size=40),
    st.floats(0.0, 1.0),
)
def test_reserve_quantile_is_numpys_inverted_cdf(bursts_gpus, q):
    """``reserve_nodes`` takes the burst quantile by a partition; it is numpy's inverted-CDF
    quantile of the same bursts (starts 1 s apart, a 0.5 s window: each burst is its own
    request)."""
    cfg = dataclasses.replace(CFG, warm_quantile=q, warm_high_headroom=False, resume_s=0.5)
    g = np.array(bursts_gpus)
    t = np.arange(len(g), dtype=float)
    lone = np.zeros(len(g), dtype=bool)
    _, burst, _ = reserve_nodes(t, g, lone, now=t[-1], node_gpus=8.0, cfg=cfg)
    assert burst == float(np.quantile(g, q, method="inverted_cdf"))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 2000.0), st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0]), st.booleans()
        ),
        max_size=40,
    ),
    st.floats(0.0, 1.0),
    st.floats(100.0, 3000.0),
    st.sampled_from([0.0, 4.0, 16.0]),
)
def test_history_keeps_the_reserve_of_the_definition(starts, q, history_s, hold):
    """``WarmHistory`` (bursts kept as starts are appended, recomputed per model only when it
    changed) gives at every instant what ``reserve_nodes`` gives for the starts then within
    the history, the high-priority hold's GPUs included, and says a model had a
    high-priority start exactly when one lies within the history (``stages.hold``)."""
    cfg = dataclasses.replace(
        CFG, warm_quantile=q, warm_history_s=history_s, resume_s=300.0, warm_high_hold_gpus=hold
    )
    view = ClusterView.build(_cluster(2, 2))
    h = WarmHistory(view, cfg)
    a100 = view.models.index("a100-80gb")
    t = g = hi = np.zeros(0)
    clock = 0.0

    def check(now: float) -> None:
        inside = t > now - history_s
        want = reserve_nodes(t, g, hi, now=now, node_gpus=8.0, cfg=cfg)
        h.keep(now)
        assert h._detail[a100] == (want if inside.any() else (0, 0.0, 0.0))
        assert h.had_high(now)[a100] == bool((hi.astype(bool) & inside).any())

    for dt, gpus, high in starts:
        clock += dt  # starts come in time order, the instants asked too
        h.started(a100, gpus, high, clock)
        t, g, hi = np.append(t, clock), np.append(g, gpus), np.append(hi, high).astype(bool)
        check(clock)
    for later in (history_s / 3, history_s / 2, history_s, 2 * history_s):
        check(clock + later)


def test_history_keeps_the_definition_over_a_long_replay_with_compaction():
    """A few thousand starts in bursts and lulls, so aged-out starts are compacted away many
    times (the kept sorted bursts and widest high-priority starts drop them too): at every
    instant asked the reserve is ``reserve_nodes``' of the starts then within the history."""
    rng = np.random.default_rng(13)
    cfg = dataclasses.replace(CFG, warm_history_s=900.0, resume_s=300.0, warm_quantile=0.8)
    view = ClusterView.build(_cluster(2, 2))
    h = WarmHistory(view, cfg)
    a100 = view.models.index("a100-80gb")
    n = 4000
    dt = np.where(rng.random(n) < 0.02, 2000.0, rng.exponential(1.5, n))  # a lull now and then
    t = np.cumsum(dt)
    g = rng.choice([0.5, 1.0, 2.0, 4.0, 8.0], n)
    hi = rng.random(n) < 0.1
    last = 0.0
    for j in range(n):
        h.started(a100, float(g[j]), bool(hi[j]), float(t[j]))
        if j % 7 == 0 or dt[min(j + 1, n - 1)] > 1000.0:  # often, and before every lull
            now = last = max(last, float(t[j]) + float(rng.uniform(0.0, 5.0)))  # in order
            inside = t[: j + 1] > now - cfg.warm_history_s
            want = reserve_nodes(
                t[: j + 1], g[: j + 1], hi[: j + 1], now=now, node_gpus=8.0, cfg=cfg
            )
            h.keep(now)
            assert h._detail[a100] == (want if inside.any() else (0, 0.0, 0.0)), j
    assert h._dropped[a100] > 0  # compaction happened
