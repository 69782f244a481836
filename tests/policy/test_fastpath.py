"""The replay fast path changes cost, not decisions: memos kept on the view across passes give
the same passes as a cold view, the ordered prefix is the full order's prefix, the queue's size
histogram matches the from-scratch mix, and rank epochs behave as ``rerank_interval_s`` says."""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy import fast as K
from libs.policy import filters as F
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.fast import epochs, screen
from libs.policy.fast import walk as W
from libs.policy.placement import to_allocation
from libs.policy.priority import order_of
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue
from libs.policy.scheduler import schedule
from libs.policy.scores import SizeMix
from libs.policy.types import PendingJob, Placement, RunningJob
from libs.sim.perf import bench_replay
from proto.jobs import JobSpec
from tests.policy.strategies import busy_view, jobs, node_spec

P = ProfileTable.default()
CFG = PolicyConfig.default()
NO_EPOCH = dataclasses.replace(CFG, rerank_interval_s=0.0)


def _key(res):
    r = res.reservation
    return (
        [(j.spec.id, p.node_id, p.gpu_indices, p.gpu_share) for j, p in res.assignments],
        None if r is None else (r.job_id, r.node_id, r.start),
    )


@st.composite
def replay_case(draw):
    v, running = draw(busy_view())
    waves = [draw(jobs(prefix=f"w{k}_")) for k in range(3)]
    ends = draw(st.lists(st.integers(0, 50), min_size=3, max_size=3))
    return v, running, waves, ends


@settings(max_examples=40, deadline=None)
@given(replay_case())
def test_warm_view_memos_give_the_same_passes_as_a_cold_view(case):
    """Three passes with arrivals and finishes in between: each pass on the long-lived (warm)
    view equals the same pass on a fresh copy whose memos are empty."""
    view, running, waves, ends = case
    running = list(running)
    pending: list[PendingJob] = []
    for k, (wave, end_pick) in enumerate(zip(waves, ends, strict=True)):
        now = 100.0 * k
        pending += [PendingJob(s, now) for s in wave]
        if running and end_pick % 2:
            r = running.pop(end_pick % len(running))
            nid = view.node_ids[r.node_index]
            p = Placement(r.node_index, nid, r.gpu_indices, r.gpu_share, 0.0, {})
            view.release(to_allocation(r.spec, p, now))
        cold = view.copy()
        kw = {"now": now, "tenant_usage": {}, "profiles": P, "cfg": NO_EPOCH}
        a = schedule(pending, view, running, want_reservation=True, **kw)
        b = schedule(pending, cold, running, want_reservation=True, **kw)
        assert _key(a) == _key(b) and a.waiting == b.waiting
        assert np.array_equal(view.gpu_free, cold.gpu_free)
        started = {j.spec.id for j, _ in a.assignments}
        for j, p in a.assignments:
            end = now + P.runtime_s(j.spec, view.models[view.model_idx[p.node_index]])
            running.append(RunningJob(j.spec, p.node_index, p.gpu_indices, p.gpu_share, end))
        pending = [j for j in pending if j.spec.id not in started]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=60),
    st.integers(1, 70),
    st.randoms(use_true_random=False),
)
def test_ordered_prefix_is_the_full_orders_prefix_even_with_ties(raw, top, rnd):
    scores = np.array(raw, dtype=float)  # few distinct values: many ties
    enq = np.array([float(rnd.randint(0, 3)) for _ in raw])
    full = order_of(scores, enq)
    part = order_of(scores, enq, top)
    assert len(part) >= min(top, len(raw))
    assert np.array_equal(part, full[: len(part)])


def test_queue_size_histogram_matches_the_mix_from_scratch():
    fallback = SizeMix.of(CFG.size_mix)
    q = PendingQueue()
    sizes = [0.25, 0.5, 1.0, 1.0, 2.0, 8.0, 0.95, 3.0]
    for i, g in enumerate(sizes):
        q.add(PendingJob(JobSpec(id=f"j{i}", gpus=g), 0.0))
    q.add(PendingJob(JobSpec(id="j1", gpus=4.0), 0.0))  # replace keeps one row
    q.remove("j0")
    left = [p.spec.gpus for p in q]
    a, b = q.size_mix(fallback), SizeMix.from_requests(left, fallback)
    assert np.array_equal(a.sizes, b.sizes) and np.allclose(a.probs, b.probs)
    assert q.min_request() == (0.95, 1.0)  # 0.25 removed, the 0.5 replaced by 4 GPUs
    present = q.tenants_present()
    assert present.tolist() == [True]
    for p in list(q):
        q.remove(p.spec.id)
    assert q.size_mix(fallback) is fallback
    assert q.min_request() == (float("inf"), float("inf")) and not q.tenants_present().any()


def test_queue_column_follows_its_rows_and_forgets_replaced_jobs_and_old_keys():
    """A per-row cache (the slow-GPU hold thresholds live in one) must move with its row when
    a removal swaps the last row in, read NaN for a job added or replaced since, survive a
    growth of the queue, and start empty when the objects it was computed from change."""
    q = PendingQueue()
    for i in range(3):
        q.add(PendingJob(JobSpec(id=f"j{i}", gpus=1.0), 0.0))
    key = (object(),)
    col = q.column("c", 2, key)
    assert col.shape == (3, 2) and np.isnan(col).all()
    col[:] = [[0.0, 0.5], [1.0, 1.5], [2.0, 2.5]]
    q.remove("j0")  # j2 moves into row 0
    col = q.column("c", 2, key)
    assert col[q.position("j2")].tolist() == [2.0, 2.5]
    assert col[q.position("j1")].tolist() == [1.0, 1.5]
    q.add(PendingJob(JobSpec(id="j1", gpus=2.0), 0.0))  # replaced: its cache is stale
    for i in range(3, 40):  # grows the row storage past its first capacity
        q.add(PendingJob(JobSpec(id=f"j{i}", gpus=1.0), 0.0))
    col = q.column("c", 2, key)
    assert np.isnan(col[q.position("j1")]).all()
    assert col[q.position("j2")].tolist() == [2.0, 2.5]
    assert np.isnan(col[q.position("j39")]).all()
    assert np.isnan(q.column("c", 2, (object(),))).all()  # other inputs: nothing kept


def test_rank_epochs_keep_scores_until_the_interval_passes():
    # one free GPU, 4-GPU jobs: nothing starts, but the pass ranks (want_reservation)
    view = ClusterView.build([node_spec("n0", 4)])
    view.allocate(
        to_allocation(JobSpec(id="r", gpus=3), Placement(0, "n0", (0, 1, 2), 1.0, 0.0, {}), 0.0)
    )
    q = PendingQueue([PendingJob(JobSpec(id="a", gpus=4, priority=5), 0.0)])
    cfg = dataclasses.replace(CFG, rerank_interval_s=60.0)

    def run(now: float):
        return schedule(
            q, view, [], now=now, tenant_usage={}, profiles=P, cfg=cfg, want_reservation=True
        )

    first = run(0.0)
    assert first.rank is not None and first.rank.terms  # a full rank fills the terms
    q.add(PendingJob(JobSpec(id="b", gpus=4, priority=5), 30.0))
    mid = run(30.0)
    pos = {p.spec.id: i for i, p in enumerate(q)}
    assert mid.rank is not None and mid.rank.terms == {}  # inside the epoch: cached scores
    assert mid.rank.scores[pos["a"]] == first.rank.scores[0]  # not aged since the epoch
    # b was scored as of the epoch (t=0): same spec, queued later, so no aging either
    assert mid.rank.scores[pos["b"]] == mid.rank.scores[pos["a"]]
    late = run(3600.0)  # past the interval: a full re-rank, a has aged one hour
    assert late.rank is not None and late.rank.terms
    aged = late.rank.scores[pos["a"]] - first.rank.scores[0]
    assert aged == np.float64(cfg.aging_per_h) or abs(aged - cfg.aging_per_h) < 1e-9


def test_view_change_counters():
    v = ClusterView.build([node_spec("n0", 2)])
    spec = JobSpec(id="x", gpus=1)
    alloc = to_allocation(spec, Placement(0, "n0", (0,), 1.0, 0.0, {}), 0.0)
    g0, f0 = v.gen, v.freed_gen
    v.allocate(alloc)
    assert v.gen == g0 + 1 and v.freed_gen == f0  # taking resources frees nothing
    v.release(alloc)
    assert v.gen == g0 + 2 and v.freed_gen == f0 + 1
    v.set_cordoned("n0", False)
    v.set_temp("n0", 50.0)
    assert v.freed_gen == f0 + 3
    v.load()  # fills the view's memo
    c = v.copy()
    assert v.memo.load is not None and c.memo.load is None  # a copy starts with a fresh memo
    assert c.shape_memo is v.shape_memo  # and shares the one of the nodes' specs


def test_a_warm_view_reports_the_reservation_a_cold_copy_reports():
    """When a pass makes its reservation may not depend on what the memos already know:
    here the job below the blocked head is a shape that failed in the previous pass (the
    warm view remembers it, a cold copy does not), and both must still report the head's
    reservation. The old rule (reserve at the first job the memos had not refused) gave the
    warm view none."""
    nodes = [node_spec("v", 4), node_spec("t", 1, "t4", 16.0, idle_w=10.0, max_w=70.0)]
    view = ClusterView.build(nodes)
    busy_v = JobSpec(id="busy-v", gpus=2)
    busy_t = JobSpec(id="busy-t", gpus=1, constraints=("t4",))
    running = []
    for spec, node, slots in ((busy_v, 0, (0, 1)), (busy_t, 1, (0,))):
        p = Placement(node, nodes[node].id, slots, 1.0, 0.0, {})
        view.allocate(to_allocation(spec, p, 0.0))
        running.append(RunningJob(spec, node, slots, 1.0, 500.0))
    pending = [
        PendingJob(JobSpec(id="head", gpus=4, priority=9), 0.0),  # blocked: 2 of 4 free
        PendingJob(JobSpec(id="below", gpus=3, priority=5), 0.0),  # cannot start either
        PendingJob(JobSpec(id="t4-job", gpus=1, priority=1, constraints=("t4",)), 0.0),
    ]
    kw = {"tenant_usage": {}, "profiles": P, "cfg": NO_EPOCH, "reasons": False}
    first = schedule(pending, view, running, now=10.0, **kw)  # fills the warm view's memo
    assert first.assignments == [] and first.reservation is not None
    cold = view.copy()  # same resources, empty memos
    warm_res = schedule(pending, view, running, now=20.0, **kw)
    cold_res = schedule(pending, cold, running, now=20.0, **kw)
    assert warm_res.reservation == cold_res.reservation
    assert warm_res.reservation is not None and warm_res.reservation.node_id == "v"


def test_bench_replay_runs_and_places_every_job():
    out = bench_replay(20, 150, load=1.1)
    assert out["placements"] == 150 and out["events_per_s"] > 0


@settings(max_examples=30, deadline=None)
@given(replay_case(), st.lists(st.sampled_from([0.0, 20.0, 400.0]), min_size=3, max_size=3))
def test_book_inside_rank_epochs_matches_the_full_order(case, steps):
    """Two queues with the same history: one walks the kept book (reasons=False), the other
    sorts the whole queue each pass (reasons=True); they start the same jobs in each pass."""
    view, running, waves, _ = case
    # a tiny book (4 rows, no backfill depth) so passes run past it and it runs low
    cfg = dataclasses.replace(CFG, rerank_interval_s=60.0, backfill_depth=0)
    old_prefix, epochs.ORDER_PREFIX = epochs.ORDER_PREFIX, 4
    try:
        _book_case(view, running, waves, steps, cfg)
    finally:
        epochs.ORDER_PREFIX = old_prefix


@settings(max_examples=60, deadline=None)
@given(
    replay_case(),
    st.lists(st.sampled_from([0.0, 20.0, 400.0]), min_size=3, max_size=3),
    st.sampled_from([1, 2, 64]),
    st.sampled_from([1 << 16, 0]),
)
def test_bulk_skip_of_failed_shapes_walks_like_the_row_by_row_walk(case, steps, chunk, dense):
    """A pass that drops rows of already-failed shapes in bulk starts the same jobs, makes the
    same reservation and reports the same walked rows as one that visits every row; and both
    start what a fully ranked pass (reasons=True) starts. The bulk walk sorts its rows a chunk
    at a time (small chunks here, so that a pass crosses several), and groups its rows with a
    table or, past ``_DENSE_KEYS`` (many GPU models), with np.unique (``dense`` 0 forces it)."""
    view, running, waves, _ = case
    cfg = dataclasses.replace(CFG, rerank_interval_s=60.0)
    old_prefix, epochs.ORDER_PREFIX = epochs.ORDER_PREFIX, 4
    old_chunk, W.BULK_CHUNK = W.BULK_CHUNK, chunk
    old_dense, screen.DENSE_KEYS = screen.DENSE_KEYS, dense
    try:
        qs = [PendingQueue() for _ in range(4)]
        views = [view.copy() for _ in qs]
        runs = [list(running) for _ in qs]
        now = 0.0
        for wave, step in zip(waves, steps, strict=True):
            now += step
            for s in wave:
                for q in qs:
                    q.add(PendingJob(s, now))
            kw = {"now": now, "tenant_usage": {"a": 1.0}, "profiles": P, "cfg": cfg}
            bulk = schedule(qs[0], views[0], runs[0], reasons=False, **kw)
            W.BULK_SKIP = False
            try:
                rows = schedule(qs[1], views[1], runs[1], reasons=False, **kw)
            finally:
                W.BULK_SKIP = True
            full = schedule(qs[2], views[2], runs[2], reasons=True, **kw)
            few = schedule(qs[3], views[3], runs[3], reasons=False, walked_limit=2, **kw)
            assert _key(few) == _key(bulk)
            if bulk.rank is not None:  # a prefix of the walk
                assert few.rank.order.tolist()[:2] == bulk.rank.order.tolist()[:2]
            assert _key(bulk) == _key(rows) == _key(full)
            assert (bulk.rank is None) == (rows.rank is None)
            if bulk.rank is not None:
                assert bulk.rank.order.tolist() == rows.rank.order.tolist()
            assert np.array_equal(views[0].gpu_free, views[1].gpu_free)
            for res, q, rl in zip((bulk, rows, full, few), qs, runs, strict=True):
                for j, p in res.assignments:
                    q.remove(j.spec.id)
                    rl.append(RunningJob(j.spec, p.node_index, p.gpu_indices, p.gpu_share, now))
    finally:
        epochs.ORDER_PREFIX = old_prefix
        W.BULK_CHUNK = old_chunk
        screen.DENSE_KEYS = old_dense


def _book_case(view, running, waves, steps, cfg):
    qa, qb = PendingQueue(), PendingQueue()
    va, vb = view.copy(), view.copy()
    ra, rb = list(running), list(running)
    now = 0.0
    for wave, step in zip(waves, steps, strict=True):
        now += step
        for s in wave:
            qa.add(PendingJob(s, now))
            qb.add(PendingJob(s, now))
        kw = {"now": now, "tenant_usage": {"a": 1.0}, "profiles": P, "cfg": cfg}
        a = schedule(qa, va, ra, reasons=False, **kw)
        b = schedule(qb, vb, rb, reasons=True, **kw)
        assert _key(a) == _key(b)
        for res, q, rl in ((a, qa, ra), (b, qb, rb)):
            for j, p in res.assignments:
                q.remove(j.spec.id)
                rl.append(RunningJob(j.spec, p.node_index, p.gpu_indices, p.gpu_share, now + 99))


@settings(max_examples=80, deadline=None)
@given(
    busy_view(),
    jobs(prefix="q"),
    st.lists(st.booleans(), min_size=5, max_size=5),
    st.lists(st.sampled_from([float("nan"), 40.0, 95.0]), min_size=5, max_size=5),
)
def test_refusal_reasons_of_many_shapes_match_one_at_a_time(case, specs, cordon, temps):
    """The screen's refusal reasons (``fit_now_shapes``, one compiled pass) are
    ``refusal_reason`` for every shape that fits no node, on views with cordoned and hot
    nodes."""
    view, _ = case
    for i, nid in enumerate(view.node_ids):
        view.set_cordoned(nid, cordon[i % len(cordon)])
        view.set_temp(nid, temps[i % len(temps)])
    static = np.stack([F.static_mask(sp, view) for sp in specs])
    req = F.shape_requests(specs)
    _, refused = F.fit_now_shapes(np.arange(len(specs)), specs, view, CFG, static, req)
    up = ~view.cordoned
    cool = ~(view.temp_c >= CFG.thermal_max_c)
    for i, sp in enumerate(specs):
        m = F.static_mask(sp, view)
        # the oracle, in numpy: busy if some node that could hold it is up and cool, else
        # too hot if some is up, else cordoned; the static filter's name if none could
        if not m.any():
            acc = np.ones(len(view.node_ids), dtype=bool)
            want = ""
            for name, f in F.STATIC:
                acc = acc & f(sp, view)
                if not acc.any():
                    want = name
                    break
        else:
            want = (
                "Resources"
                if (m & up & cool).any()
                else "Thermal"
                if (m & up).any()
                else "Cordoned"
            )
        assert F.refusal_reason(sp, view, CFG)[0] == want
        if F.fit_now(sp, view, CFG).any():
            assert i not in refused
        else:
            assert refused[i] == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 63), min_size=1, max_size=80), st.sampled_from([64, 1 << 17]))
def test_grouping_helpers_equal_np_unique(keys, span):
    """The table-based grouping of the bulk walk and the sort-free unique of a sorted array
    give exactly ``np.unique(..., return_inverse=True)``."""
    a = np.array(keys, dtype=np.int64)
    for got, arr in (
        (K.unique_small(a, span), a),
        (K.unique_sorted(np.sort(a)), np.sort(a)),
    ):
        want = np.unique(arr, return_inverse=True)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(1, 3), st.data())
def test_group_rows_is_row_keys_grouped(n, bits, data):
    """``fast.group_rows`` (the bulk walk's grouping in one call) gives the distinct keys
    of ``row_keys`` as np.unique does, their shapes and codes, and files each row's group."""
    n_shapes = data.draw(st.integers(1, 6))
    shape_of = np.array(data.draw(st.lists(st.integers(0, n_shapes - 1), min_size=n, max_size=n)))
    dead = np.array(data.draw(st.lists(st.booleans(), min_size=n_shapes, max_size=n_shapes)))
    cache = np.array(
        data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=n, max_size=n)), dtype=np.int64
    )
    rows = np.array(
        data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)),
        dtype=np.int64,
    )
    shape_of = shape_of.astype(np.int64)
    group_of_row = np.full(n, -1, dtype=np.int64)
    span = n_shapes << bits
    uniq, g_shape, g_code = K.group_rows(rows, shape_of, dead, cache, bits, span, group_of_row)
    keys = K.row_keys(rows, shape_of, dead, cache, bits)
    want, inv = np.unique(keys, return_inverse=True)
    assert uniq.tolist() == want.tolist()
    assert g_shape.tolist() == (want >> bits).tolist()
    assert g_code.tolist() == (want & ((1 << bits) - 1)).tolist()
    assert group_of_row[rows].tolist() == inv.tolist()
    assert (np.delete(group_of_row, rows) == -1).all()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=60),
    st.sampled_from([1, 2, 3, 64]),
    st.data(),
)
def test_bulk_walk_hands_out_the_live_rows_in_rank_order(keys, chunk, data):
    """After the switch to bulk mode the walk hands out exactly the rows ranked after the
    switch row that are not dead, in rank order, however many chunks it sorts them in, and
    rows marked dead midway (``refilter``) are skipped from then on."""
    n = len(keys)
    scores = np.array([float(k[0]) for k in keys])
    enq = np.array([float(k[1]) for k in keys])
    tie = np.array(data.draw(st.permutations(range(n))), dtype=float)
    full = order_of(scores, enq, None, tie).tolist()
    switch = data.draw(st.integers(0, n - 1))
    dead = set(data.draw(st.lists(st.integers(0, n - 1), max_size=n)))
    killed = set(dead)  # the model's dead rows (``dead`` grows during the walk)
    later = set(data.draw(st.lists(st.integers(0, n - 1), max_size=n)))
    after_k = data.draw(st.integers(0, n))
    prefix = data.draw(st.sampled_from([None, 1, 2, 5, 64]))
    stop_at = data.draw(st.integers(1, n + 1))  # the pass fills up after this many rows
    limit = data.draw(st.sampled_from([None, 0, 1, 3, 64]))
    if prefix is not None and limit is not None:
        limit = min(limit, prefix)  # the scheduler asks at most the prefix it announced

    class Dead:
        def assign(self, rows):
            pass

        def live(self, rows):
            return np.array([r for r in rows.tolist() if r not in dead], dtype=np.int64)

    old, W.BULK_CHUNK = W.BULK_CHUNK, chunk
    try:
        walk = W.Walk(full, None, None, (scores, enq, tie))
        for _ in range(switch + 1):
            next(walk)
        got: list[int] = []
        walk.skip_dead(Dead(), lambda: len(got) >= stop_at, prefix)
        for r in walk:
            got.append(r)
            if len(got) == after_k:
                dead |= later
                walk.refilter()
        walked = walk.walked_in_bulk(limit).tolist()
    finally:
        W.BULK_CHUNK = old
    want = []
    for r in full[switch + 1 :]:
        if len(want) >= stop_at:
            break
        if r in killed:
            continue
        want.append(r)
        if len(want) == after_k:
            killed |= later
    assert got == want
    # the rows passed over, in rank order: through the last one handed out when the pass
    # filled up, every row after the switch when it ran out of rows
    rest = full[switch + 1 :]
    if len(got) >= stop_at:
        rest = rest[: rest.index(got[-1]) + 1]
    assert walked == (rest if limit is None else rest[:limit])


@settings(max_examples=100, deadline=None)
@given(
    jobs(prefix="q"),
    st.lists(st.sampled_from(["a", "b", "c", "x", "y"]), max_size=5),
    st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_queue_tenant_count_is_the_fair_share_count(specs, used, leave):
    """``PendingQueue.tenant_count`` (kept set of queued tenants) equals the count
    ``priority.tenant_count`` makes from the tenant columns, as jobs join and leave, and scores
    computed with it are the same numbers."""
    from libs.policy.priority import score_arrays, tenant_count

    q = PendingQueue([PendingJob(s, 0.0) for s in specs])
    usage = {t: np.array([1.0, 8.0, 4.0, 2.0]) for t in used}
    for s, gone in zip(specs, leave, strict=False):
        if gone and len(q) > 1:
            q.remove(s.id)
        qa = q.arrays()
        present = q.tenants_present()
        want = len(usage) + sum(
            1 for k in np.flatnonzero(present).tolist() if qa.tenants[k] not in usage
        )
        assert q.tenant_count(usage) == want == tenant_count(qa, usage, present)
        cap = np.array([64.0, 512.0, 1024.0, 256.0])
        kw = {"now": 0.0, "load": 0.5, "tenant_usage": usage, "capacity": cap, "cfg": CFG}
        a = score_arrays(qa, profiles=P, present=present, **kw)
        b = score_arrays(qa, profiles=P, n_tenants=q.tenant_count(usage), **kw)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1]["fair_share"], b[1]["fair_share"])


@settings(max_examples=100, deadline=None)
@given(
    jobs(prefix="q"),
    st.lists(st.sampled_from(["a", "b", "c", "x", "y"]), max_size=5),
    st.lists(st.booleans(), min_size=12, max_size=12),
    st.data(),
)
def test_scores_read_from_the_queue_table_are_score_arrays(specs, used, leave, data):
    """``priority.score_queue_rows`` (read in place from the queue's table, as a pass scores
    the jobs queued since the last) gives the numbers ``score_arrays`` gives for the same
    rows' columns, after rows moved (removals swap the last row in)."""
    from libs.policy.priority import score_arrays, score_queue_rows

    # deadlines from missed to far, so urgency (which reads the runtime) is not 0
    specs = [
        msgspec.structs.replace(s, deadline=None if i % 4 == 3 else 2000.0 + 4000.0 * i)
        for i, s in enumerate(specs)
    ]
    q = PendingQueue(
        [PendingJob(s, enqueued_at=float(i), progress=0.3 * (i % 3)) for i, s in enumerate(specs)]
    )
    for s, gone in zip(specs, leave, strict=False):
        if gone and len(q) > 1:
            q.remove(s.id)
    usage = {t: np.array([1.0, 8.0, 4.0, 2.0]) for t in used}
    rows = np.array(
        data.draw(st.lists(st.integers(0, len(q) - 1), min_size=1, max_size=4, unique=True)),
        dtype=np.int64,
    )
    cap = np.array([64.0, 512.0, 1024.0, 256.0])
    kw = {"now": 5000.0, "load": 0.9, "tenant_usage": usage, "capacity": cap, "cfg": CFG}
    n = q.tenant_count(usage)
    want = score_arrays(q.rows(rows), profiles=P, n_tenants=n, **kw)[0]
    got = score_queue_rows(q, rows, profiles=P, n_tenants=n, **kw)
    assert np.array_equal(got, want)
