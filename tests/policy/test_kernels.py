"""Each compiled loop of ``libs.policy.fast`` gives exactly what the numpy expression it
replaced gives (written here as the oracle), on random inputs with the edge cases the pass
meets: ties in rank keys, NaN scores and progress, dead shapes, held models, full nodes."""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy import fast as K
from libs.policy import filters as F
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.fast import codes as C
from libs.policy.fast import score as KS
from libs.policy.fast import shapes
from libs.policy.placement import PlaceContext
from libs.policy.priority import order_of
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue, QueueArrays
from libs.policy.stages import power as power_def
from libs.policy.stages import reserve as reserve_def
from libs.policy.types import PendingJob
from proto.jobs import HIGH_PRIORITY, JobSpec
from tests.policy.strategies import busy_view, jobs, node_spec, nodes

P = ProfileTable.default()
CFG = PolicyConfig.default()
_SPEC = JobSpec(id="s", tenant="t", gpus=1.0, gpu_mem_gb=8.0)


@st.composite
def rank_keys(draw, max_rows: int = 60):
    """(score, enqueue time, tie) per row, with few distinct values so ties are common, and
    distinct tie numbers (as a queue's insertion sequence)."""
    n = draw(st.integers(1, max_rows))
    s = np.array(draw(st.lists(st.sampled_from([0.1, 0.5, 0.5, 2.0]), min_size=n, max_size=n)))
    e = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 1.0, 7.0]), min_size=n, max_size=n)))
    q = np.array(draw(st.permutations(range(n))), dtype=float)
    return s, e, q


@settings(max_examples=200, deadline=None)
@given(rank_keys(), st.data())
def test_rows_ranked_after_matches_the_order(keys, data):
    s, e, q = keys
    n = len(s)
    rows = np.arange(n, dtype=np.int64)
    pivot = data.draw(st.integers(0, n - 1))
    after = (s < s[pivot]) | (
        (s == s[pivot]) & ((e > e[pivot]) | ((e == e[pivot]) & (q > q[pivot])))
    )
    got = K.rows_ranked_after(rows, s, e, q, s[pivot], e[pivot], q[pivot], True)
    assert got.tolist() == np.flatnonzero(after).tolist()
    got = K.rows_ranked_after(rows, s, e, q, s[pivot], e[pivot], q[pivot], False)
    assert got.tolist() == np.flatnonzero(~after).tolist()
    # and it agrees with order_of: exactly the rows after the pivot's position
    order = order_of(s, e, None, q).tolist()
    assert sorted(order[order.index(pivot) + 1 :]) == np.flatnonzero(after).tolist()


@st.composite
def groups(draw):
    """Rows with a shape, a cached slow-model code or none, a kept (code, since, until) window
    or none, and which shapes are dead."""
    n = draw(st.integers(1, 40))
    n_shapes = draw(st.integers(1, 6))
    bits = draw(st.integers(1, 4))
    shape_of = np.array(draw(st.lists(st.integers(0, n_shapes - 1), min_size=n, max_size=n)))
    dead = np.array(draw(st.lists(st.booleans(), min_size=n_shapes, max_size=n_shapes)))
    cache = np.array(draw(st.lists(st.integers(-1, (1 << bits) - 1), min_size=n, max_size=n)))
    kept = np.full((n, 3), np.nan)
    for i in range(n):
        if draw(st.booleans()):
            since = float(draw(st.integers(0, 100)))
            kept[i] = (
                draw(st.integers(0, (1 << bits) - 1)),
                since,
                since + draw(st.sampled_from([0.0, 5.0, np.inf])),
            )
    enq = np.array(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), dtype=float)
    return shape_of.astype(np.int64), dead, cache.astype(np.int64), kept, enq, bits


@settings(max_examples=200, deadline=None)
@given(groups(), st.integers(0, 200), st.data())
def test_row_codes_and_row_keys_match_numpy(g, now, data):
    shape_of, dead, cache, kept, enq, bits = g
    n = len(shape_of)
    rows = np.array(data.draw(st.permutations(range(n))), dtype=np.int64)
    # hold waits per row and model: known for some rows, not yet (NaN) for the others
    waits = np.array(
        data.draw(
            st.lists(
                st.lists(
                    st.sampled_from([-np.inf, 0.0, 7.0, 40.0, 150.0]), min_size=bits, max_size=bits
                ),
                min_size=n,
                max_size=n,
            )
        )
    )
    unknown = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    waits[unknown] = np.nan
    # oracle: the numpy expressions _SlowCodes.fill used (kept window, then codes from waits)
    want_cache, want_kept = cache.copy(), kept.copy()
    live = rows[~dead[shape_of[rows]]]
    miss = live[want_cache[live] < 0]
    waited = now - enq[miss]
    ok = (kept[miss, 1] <= waited) & (waited < kept[miss, 2])
    want_cache[miss[ok]] = kept[miss[ok], 0].astype(np.int64)
    miss, waited = miss[~ok], waited[~ok]
    want_new = miss[np.isnan(waits[miss, 0])]
    w = np.where(np.isnan(waits[miss]), 1e9, waits[miss])  # as if computed: any value will do
    filled = waits.copy()
    filled[want_new] = w[np.isnan(waits[miss, 0])]
    code = ((w > waited[:, None]) * (np.int64(1) << np.arange(bits))).sum(axis=1)
    want_cache[miss] = code
    want_kept[miss, 0] = code
    want_kept[miss, 1] = waited
    want_kept[miss, 2] = np.where(w > waited[:, None], w, np.inf).min(axis=1, initial=np.inf)
    got_cache, got_kept = cache.copy(), kept.copy()
    got_new = K.row_codes(rows, shape_of, dead, got_cache, got_kept, waits, enq, float(now))
    assert got_new.tolist() == want_new.tolist()
    K.codes_from_waits(got_new, filled, enq, float(now), got_cache, got_kept)
    assert got_cache.tolist() == want_cache.tolist()
    assert np.array_equal(got_kept, want_kept, equal_nan=True)
    shape = shape_of[rows]
    keys = shape << bits
    keys[~dead[shape]] += got_cache[rows][~dead[shape]]
    assert K.row_keys(rows, shape_of, dead, got_cache, bits).tolist() == keys.tolist()
    uniq, inv = K.unique_small(keys, len(dead) << bits)
    u2, i2 = np.unique(keys, return_inverse=True)
    assert uniq.tolist() == u2.tolist() and inv.tolist() == i2.tolist()
    dead_g = np.array(data.draw(st.lists(st.booleans(), min_size=len(uniq), max_size=len(uniq))))
    group_of_row = np.full(n, -1, dtype=np.int64)
    group_of_row[rows] = inv
    assert (
        K.live_rows(rows, group_of_row, dead_g).tolist()
        == rows[~dead_g[group_of_row[rows]]].tolist()
    )


@settings(max_examples=100, deadline=None)
@given(busy_view(), jobs(prefix="q"), st.data())
def test_fit_now_shapes_and_groups_fit_match_fit_now(vr, specs, data):
    view, _ = vr
    if data.draw(st.booleans()):
        view.set_cordoned(view.node_ids[0], True)
    shape_ids: dict = {}
    shape_specs = []
    for sp in specs:
        if F.shape_key(sp) not in shape_ids:
            shape_ids[F.shape_key(sp)] = len(shape_specs)
            shape_specs.append(sp)
    static = np.stack([F.static_mask(sp, view) for sp in shape_specs])
    req = F.shape_requests(shape_specs)
    shapes = np.array(
        sorted(set(data.draw(st.lists(st.integers(0, len(shape_specs) - 1), min_size=1)))),
        dtype=np.int64,
    )
    fresh = view.copy()  # fit_now_shapes files its rows in the view's fit_now memo
    view.memo.fit_now = None  # (building the busy view may have filled it)
    fits, refused = F.fit_now_shapes(shapes, shape_specs, view, CFG, static, req)
    for i, s in enumerate(shapes.tolist()):
        sp = shape_specs[s]
        want = (  # the named filters, in numpy: the oracle
            F.static_mask(sp, view)
            & F.f_cordon(sp, view)
            & F.f_thermal(sp, view, CFG)
            & F.f_free_gpus(sp, view)
            & F.f_host_memory(sp, view)
            & F.f_cpus(sp, view)
        )
        assert fits[i].tolist() == want.tolist()
        assert F.fit_now(sp, fresh, CFG).tolist() == want.tolist()
        # a shape that fits nowhere gets the reason refusal_reason gives; one that fits some
        # node is filed in fit_now's memo
        assert refused.get(s) == (None if want.any() else F.refusal_reason(sp, view, CFG)[0])
        assert not want.any() or np.shares_memory(F.fit_now(shape_specs[s], view, CFG), fits)
    # groups: (shape row of fits, slow-model code), the screen's numpy expression as oracle
    n_g = data.draw(st.integers(1, 8))
    inv = np.array(data.draw(st.lists(st.integers(0, len(shapes) - 1), min_size=n_g, max_size=n_g)))
    codes = np.array(
        data.draw(st.lists(st.integers(0, (1 << len(view.models)) - 1), min_size=n_g, max_size=n_g))
    )
    allowed = np.array(
        data.draw(st.lists(st.booleans(), min_size=len(view.node_ids), max_size=len(view.node_ids)))
    )
    want = fits.any(axis=1)[inv]
    held = codes != 0
    m = fits[inv[held]] & ~C.held_nodes(codes[held], view) & allowed
    want[held] = m.any(axis=1)
    got = K.groups_fit(fits, inv.astype(np.int64), codes.astype(np.int64), view.model_idx, allowed)
    assert got.tolist() == want.tolist()


def hold_waits_numpy(q, present, ctx, cfg):
    """The guard by its definition (``stages.guard.hold_waits``, numpy)."""
    from libs.policy.stages import guard

    return guard.hold_waits(
        q.cls, q.est, q.prog, q.prio, q.deadline, float(HIGH_PRIORITY), q.es, q.gpus, present,
        ctx.tables.speed, ctx.tables.energy_per_work, guard.guard_args(cfg),
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(nodes(), jobs(prefix="q"), st.data())
def test_hold_waits_bit_for_bit_as_numpy(node_list, specs, data):
    view = ClusterView.build(node_list)
    ctx = PlaceContext.build(view, P, CFG)
    pending = []
    for s in specs:
        s = msgspec.structs.replace(
            s,
            est_runtime_s=data.draw(st.sampled_from([60.0, 3600.0, 5 * 3600.0, 2e5, 2e6, 9e6])),
            deadline=data.draw(st.sampled_from([None, None, 1e6])),
            energy_sensitivity=data.draw(st.sampled_from([0.0, 0.1, 0.2, 0.5, 0.95, 1.0])),
        )
        prog = data.draw(st.sampled_from([0.0, 0.3, 0.999, 1.0, 1.5]))
        pending.append(PendingJob(s, enqueued_at=0.0, progress=prog))
    q = QueueArrays.from_jobs(pending)
    if data.draw(st.booleans()):  # NaN where numpy's NaN rules decide (clip, maximum, fmax)
        q.prog[0] = np.nan
        q.es[-1] = np.nan
    shape_of, _, shape_specs = shapes.shapes_of(pending)
    present = shapes.present_models(shape_specs, view)[shape_of]
    cfg = CFG  # the default config, or one where every job is green and the guard is 1x
    if data.draw(st.booleans()):
        cfg = dataclasses.replace(CFG, green_min_tolerance=0.0, energy_guard_factor=1.0)
    if data.draw(st.booleans()):  # the guard holding high-priority jobs too
        cfg = dataclasses.replace(cfg, guard_holds_high=True)
    got = C.hold_waits(q, present, ctx, cfg)
    want = hold_waits_numpy(q, present, ctx, cfg)
    np.testing.assert_array_equal(got, want)
    assert got.tobytes() == want.tobytes()  # bit for bit, signs of zero included
    # the same rule read from a kept queue's table, for some of its rows (as a pass asks it
    # for the jobs queued since the last)
    kept = PendingQueue(pending)
    table = kept.table()
    table[:, 4] = q.prog  # the NaNs above, in the table too
    table[:, 1] = q.es
    rows = np.array(
        data.draw(st.lists(st.integers(0, len(pending) - 1), min_size=1, unique=True)),
        dtype=np.int64,
    )
    from_table = C.hold_waits_of_rows(kept, rows, present[rows], ctx, cfg)
    assert from_table.tobytes() == got[rows].tobytes()


def test_kernels_compile_where_no_cache_location_is_writable() -> None:
    """A read-only install with no writable home (a pod with a read-only root filesystem and
    no NUMBA_CACHE_DIR) must still import and run the kernels, compiled per process."""
    import os
    import subprocess
    import sys

    from numba.core import config

    if not hasattr(config, "CACHE_LOCATOR_CLASSES"):
        pytest.skip("this numba cannot be told to find no cache location")
    env = dict(os.environ, NUMBA_CACHE_LOCATOR_CLASSES="_IPythonCacheLocator")
    env.pop("NUMBA_CACHE_DIR", None)
    code = (
        "import numpy as np; from libs.policy import fast as K; "
        "print(K.live_rows(np.arange(3), np.array([0, 1, 0]), np.array([False, True])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0 2]"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.25, 0.5, 0.999999, 1.0, 1.5, 2.0, 2.5, 3.5, 8.0]), min_size=1),
    st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    st.integers(0, 8),
    st.data(),
)
def test_too_big_and_dead_groups_match_numpy(gpus, max_share, max_whole, data):
    n = len(gpus)
    specs = [msgspec.structs.replace(_SPEC, gpus=g) for g in gpus]
    req = F.shape_requests(specs)
    ever = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    g = np.array(gpus)
    frac = g < 1.0 - 1e-9
    want = np.where(frac, g > max_share + 1e-9, np.round(g) > max_whole) & ever
    got = K.too_big(req, ever, max_share, max_whole, 1e-9)
    assert got.tolist() == want.tolist()
    n_g = data.draw(st.integers(0, 10))
    g_shape = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=n_g, max_size=n_g)))
    g_shape = g_shape.astype(np.int64)
    failed = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    pair, nofit = (
        np.array(data.draw(st.lists(st.booleans(), min_size=n_g, max_size=n_g)), dtype=bool)
        for _ in range(2)
    )
    want = failed[g_shape] | got[g_shape] | pair | nofit
    assert K.dead_groups(g_shape, failed, got, pair, nofit).tolist() == want.tolist()


def slots_numpy(spec, view, nodes):
    """(after, pick): what ``placement.place`` computed with numpy before the compiled loop."""
    rows = view.gpu_free[nodes]
    if F.is_fractional(spec):
        ok = (rows >= spec.gpus - 1e-9) & (view.gpu_mem_free_gb[nodes] >= spec.gpu_mem_gb - 1e-9)
        slot = np.argmin(np.where(ok, rows, np.inf), axis=1)
        after = rows.copy()
        after[np.arange(len(nodes)), slot] -= spec.gpus
        return after, slot
    full = rows >= 1.0 - 1e-9
    take = full & (np.cumsum(full, axis=1) <= F.whole_gpus(spec))
    return rows - take, take


@settings(max_examples=150, deadline=None)
@given(
    busy_view(),
    jobs(prefix="q", max_jobs=3),
    st.lists(
        st.tuples(st.sampled_from([0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 8.0]), st.floats(0.01, 1)),
        min_size=1,
        max_size=6,
    ),
    st.booleans(),
)
def test_placement_scores_match_the_score_functions(vr, specs, mix_pairs, hot):
    """``fast.score_nodes`` against the score terms' definitions (``stages.score``) and the
    pick (``stages.pick``):
    speed, energy, thermal and memory-fit terms and the GPU slots bit for bit, the packing
    term to rounding (its sums run in a fixed order, numpy's are pairwise/BLAS), and the
    chosen node wherever the best total is not a near-tie."""
    from libs.policy import scores as S
    from libs.policy.stages import score as D
    from libs.policy.stages.pick import SCORE_TIE, TERMS, pick

    view, _ = vr
    if hot:
        for nid, t in zip(view.node_ids, np.linspace(20.0, 90.0, len(view.temp_c)), strict=True):
            view.set_temp(nid, float(t))
    mix = S.SizeMix.of(mix_pairs)
    ctx = PlaceContext(S.ModelTables.build(view, P), mix)
    for spec in specs:
        nodes = np.flatnonzero(F.fit_now(spec, view, CFG))
        if not len(nodes):
            continue
        cls_i = S.CLASS_INDEX.get(spec.workload_class, S.CLASS_INDEX["other"])
        weights = np.array([1.0, 0.5, CFG.w_pack, CFG.w_thermal, CFG.w_memory_fit])
        total, terms, slot, best = K.score_nodes(
            nodes, view.gpu_free, view.gpu_mem_free_gb, view.gpu_mem_gb, view.model_idx,
            view.temp_c, not S.temps_unknown(view), ctx.tables.speed, ctx.tables.energy_per_work,
            cls_i, F.is_fractional(spec), F.whole_gpus(spec), float(spec.gpus),
            float(spec.gpu_mem_gb), mix.sizes, mix.probs, weights, float(weights.sum()),
            CFG.thermal_max_c, CFG.thermal_max_c - CFG.thermal_ambient_c, 1e-9, SCORE_TIE,
        )  # fmt: skip
        after, slots = slots_numpy(spec, view, nodes)
        want = {
            "speed": D.s_speed(view, nodes, cls_i, ctx.tables),
            "energy": D.s_energy(view, nodes, cls_i, ctx.tables),
            "pack": D.s_pack(view.gpu_free[nodes], after, mix)[0],
            "thermal": D.s_thermal(view, nodes, CFG),
            "memory_fit": D.s_memory_fit(view, nodes, spec.gpu_mem_gb),
        }
        for j, t in enumerate(TERMS):
            if t == "pack":
                np.testing.assert_allclose(terms[j], want[t], rtol=0, atol=1e-6)
            else:
                assert terms[j].tobytes() == want[t].tobytes(), t
        if F.is_fractional(spec):
            assert slot.tolist() == slots.tolist()
        for r, v in enumerate(nodes.tolist()):  # fragmentation of each row, to rounding
            for row in (after[r], view.gpu_free[v]):
                one = D.fragmentation(row[None, :], mix)[0]
                assert KS._fragmentation(row, mix.sizes, mix.probs, 1e-9) == pytest.approx(one)
        want_total = sum(w * want[t] for w, t in zip(weights, TERMS, strict=True)) / weights.sum()
        np.testing.assert_allclose(total, want_total, rtol=0, atol=1e-6)
        # the chosen node: the first within SCORE_TIE of the best, whichever sums are used
        # (unless some total sits at that boundary, within the terms' rounding)
        assert best == pick(total)
        edge = np.abs(want_total - (want_total.max() - SCORE_TIE)) < 1e-6
        if not edge.any():
            assert best == int(np.argmax(want_total >= want_total.max() - SCORE_TIE))


def test_a_tie_in_totals_goes_to_the_first_node_whatever_the_last_bits() -> None:
    """Two nodes whose totals differ in the last bits (sums rounded in another order) are a
    tie: the first wins, as it would if the totals were equal. Beyond the tie, the best wins."""
    from libs.policy.placement import place
    from libs.policy.stages.pick import SCORE_TIE

    nodes_ = [node_spec(f"n{i}", 4, "a100-80gb", 80.0) for i in range(3)]
    view = ClusterView.build(nodes_)
    spec = JobSpec(id="j", tenant="t", gpus=1.0, gpu_mem_gb=8.0)
    assert place(spec, view, P, CFG).node_index == 0  # identical nodes: the first

    def best_of(speeds: np.ndarray) -> int:
        """Three one-GPU nodes, one GPU model each with these speeds; speed weight only, so
        each total is its speed over the best."""
        return K.score_nodes(
            np.arange(3), np.ones((3, 1)), np.full((3, 1), 80.0), np.full(3, 80.0),
            np.arange(3, dtype=np.int64), np.full(3, np.nan), False, speeds[:, None],
            np.ones((3, 1)), 0, False, 1, 1.0, 8.0, np.array([1.0]), np.array([1.0]),
            np.array([1.0, 0.0, 0.0, 0.0, 0.0]), 1.0, 85.0, 55.0, 1e-9, SCORE_TIE,
        )[3]  # fmt: skip

    assert best_of(np.array([0.5, 0.5 + SCORE_TIE / 4, 0.5 - SCORE_TIE / 4])) == 0
    assert best_of(np.array([0.5, 0.5 + 10 * SCORE_TIE, 0.5])) == 1


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_power_due_matches_numpy(data):
    n = data.draw(st.integers(1, 12))
    now = float(data.draw(st.sampled_from([0.0, 100.0, 400.0, 1000.0])))
    idle_since = np.array(
        data.draw(
            st.lists(st.sampled_from([np.nan, 0.0, 50.0, 100.0, 700.0]), min_size=n, max_size=n)
        )
    )
    suspended, resuming = (
        np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
        for _ in range(2)
    )
    gpu_total = np.array(data.draw(st.lists(st.sampled_from([4, 8]), min_size=n, max_size=n)))
    whole_free = np.minimum(
        gpu_total, np.array(data.draw(st.lists(st.integers(0, 8), min_size=n, max_size=n)))
    )
    after = float(data.draw(st.sampled_from([0.0, 300.0])))
    empty = whole_free >= gpu_total  # power.empty_nodes
    due, asleep, any_due, nxt = K.power_due(now, idle_since, suspended, resuming, empty, after)
    w_due, w_asleep, w_any, w_nxt = power_def.power_due(
        now, idle_since, suspended, resuming, empty, after
    )
    assert due.tolist() == w_due.tolist()
    assert (asleep, any_due, nxt) == (w_asleep, w_any, w_nxt)


def score_arrays_numpy(q, *, now, load, tenant_usage, cap, cfg, best):
    """The priority score by its definition (``stages.rank.priority_terms``, numpy), with the
    tenants' dominant shares computed here in numpy too."""
    from libs.policy.priority import tenant_count
    from libs.policy.stages.rank import TERMS, priority_terms, regime_weights, score_settings

    _, w = regime_weights(load, cfg)
    n = max(tenant_count(q, tenant_usage), 1)
    dom = np.zeros(len(q.tenants))
    used = [k for k in range(len(q.tenants)) if q.tenants[k] in tenant_usage]
    ok = cap > 0
    if used and ok.any():
        u = np.array([tenant_usage[q.tenants[k]] for k in used], dtype=float)
        dom[used] = (u[:, ok] / cap[ok]).max(axis=1)
    out = priority_terms(
        q.prio, q.es, q.enq, q.est, q.prog, q.deadline, dom[q.tenant], float(n), best[q.cls],
        score_settings(now, cfg, w),
    )  # fmt: skip
    return out[-1], dict(zip(TERMS, out[:-1], strict=True))


@settings(max_examples=200, deadline=None)
@given(
    jobs(prefix="q"),
    st.lists(st.sampled_from(["a", "b", "c", "t0", "t1"]), max_size=4, unique=True),
    st.floats(0.0, 1.0),
    st.data(),
)
def test_priority_terms_bit_for_bit_as_numpy(specs, used, load, data):
    from libs.policy.priority import best_speed_per_class, score_arrays

    f = st.floats(-1e6, 1e7, allow_nan=False, allow_infinity=False)
    rows = []
    for s in specs:  # deadlines near and far, missed, absent; progress beyond [0, 1]; late enq
        dl = data.draw(st.one_of(st.none(), f))
        prog = data.draw(st.sampled_from([0.0, 0.3, 1.0, 1.5, -0.2, np.nan]))
        spec = msgspec.structs.replace(s, deadline=dl)
        rows.append(PendingJob(spec, data.draw(f), progress=prog))
    q = QueueArrays.from_jobs(rows)
    usage = {t: np.array(data.draw(st.lists(f, min_size=4, max_size=4))) for t in used}
    cap = np.array(data.draw(st.sampled_from([[64.0, 512.0, 0.0, 256.0], [0.0] * 4, [8.0] * 4])))
    models = ["A100-80GB", "T4-16GB"]
    now = data.draw(f)
    cfg = dataclasses.replace(
        CFG,
        aging_per_h=data.draw(st.sampled_from([0.05, 1.0, 7.0])),
        w_short=data.draw(st.sampled_from([0.0, 2.5, 10.0])),
        short_scale_s=data.draw(st.sampled_from([600.0, 14400.0])),
        w_urgent=data.draw(st.sampled_from([0.0, 0.5, 2.0])),
    )
    got, terms, _ = score_arrays(
        q,
        now=now,
        load=load,
        tenant_usage=usage,
        capacity=cap,
        cfg=cfg,
        profiles=P,
        models=models,
    )
    best = best_speed_per_class(P, models)
    want, want_terms = score_arrays_numpy(
        q, now=now, load=load, tenant_usage=usage, cap=cap, cfg=cfg, best=best
    )
    assert np.array_equal(got, want, equal_nan=True)
    for k, v in want_terms.items():
        assert np.array_equal(terms[k], v, equal_nan=True), k


@settings(max_examples=300, deadline=None)
@given(rank_keys(), st.integers(0, 70), st.booleans(), st.data())
def test_top_rows_is_order_of_with_top(keys, k, int_tie, data):
    s, e, q = keys
    q = q.astype(np.int64) if int_tie else q
    n = len(s)
    rows = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1))), np.int64)
    rows = rows[np.array(data.draw(st.permutations(range(len(rows)))), dtype=np.int64)]
    best, rest, ok = K.top_rows(rows, s, e, q, k)
    assert ok
    part = order_of(s[rows], e[rows], k if k < len(rows) else None, q[rows]) if k > 0 else []
    assert best.tolist() == rows[part].tolist()
    left = np.ones(len(rows), dtype=bool)
    left[part] = False
    assert rest.tolist() == rows[left].tolist()
    s2 = s.copy()
    s2[rows[0]] = np.nan  # numpy sorts NaN last: the kernel leaves that to numpy
    assert not K.top_rows(rows, s2, e, q, k)[2]


def size_mix_numpy(counts):
    """``SizeMix.from_code_counts`` as numpy wrote it (the oracle); None for an empty one."""
    nz = np.flatnonzero(counts)
    if len(nz) == 0:
        return None
    sizes = np.where(nz <= 10, nz / 10.0, nz - 10.0)
    sizes = np.where(nz == 10, 1.0, sizes)
    c = counts[nz].astype(float)
    if (nz == 10).any() and (nz == 11).any():
        c[nz == 11] += c[nz == 10]
        keep = nz != 10
        sizes, c = sizes[keep], c[keep]
    return sizes, c / c.sum()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0, 0, 0, 1, 2, 7, 1000, 123457]), min_size=1, max_size=40))
def test_size_mix_of_counts_matches_numpy(counts):
    counts = np.array(counts, dtype=np.int64)
    sizes, probs = K.size_mix_of_counts(counts)
    want = size_mix_numpy(counts)
    if want is None:
        assert len(sizes) == 0 and len(probs) == 0
    else:
        assert sizes.tolist() == want[0].tolist() and probs.tolist() == want[1].tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 8), max_size=30),
    st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, np.nan]), max_size=24),
    st.integers(1, 4),
)
def test_largest_free_is_the_maxima(whole, shares, width):
    whole = np.array(whole, dtype=np.int64)
    free = np.array(shares[: len(shares) // width * width], dtype=float).reshape(-1, width)
    got = K.largest_free(whole, free)
    want_w = int(whole.max()) if len(whole) else 0
    want_s = float(free.max()) if free.size else 0.0
    assert got[0] == want_w
    assert got[1] == want_s or (np.isnan(got[1]) and np.isnan(want_s))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.integers(0, 6), st.data())
def test_power_resume_matches_numpy(n, n_groups, data):
    def bools(k):
        return np.array(data.draw(st.lists(st.booleans(), min_size=k, max_size=k)), dtype=bool)

    static = np.array([bools(n) for _ in range(n_groups)], dtype=bool).reshape(n_groups, n)
    counts = np.array(data.draw(st.lists(st.integers(0, 5), min_size=n_groups, max_size=n_groups)))
    needs = np.array(
        data.draw(
            st.lists(
                st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0]), min_size=n_groups, max_size=n_groups
            )
        ),
        dtype=float,
    )
    gpu_total = np.array(data.draw(st.lists(st.sampled_from([4, 8]), min_size=n, max_size=n)))
    resuming = bools(n)
    down = bools(n) & ~resuming
    claim = np.where(resuming, gpu_total, 0).astype(float)
    rank = np.array(data.draw(st.permutations(range(n))), dtype=np.int64)
    c1, d1, c2, d2 = claim.copy(), down.copy(), claim.copy(), down.copy()
    want = power_def.power_resume(static, counts, needs, c1, d1, rank, gpu_total, 1e-9)
    got = K.power_resume(static, counts.astype(np.int64), needs, c2, d2, rank, gpu_total, 1e-9)
    assert got[0].tolist() == want[0] and got[1].tolist() == want[1].tolist()
    assert c1.tolist() == c2.tolist() and d1.tolist() == d2.tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=80))
def test_groups_in_order_matches_np_unique(ids):
    ids = np.array(ids, dtype=np.int64)
    uniq, first, counts = np.unique(ids, return_index=True, return_counts=True)
    order = np.argsort(first)
    got = K.groups_in_order(ids)
    assert got[0].tolist() == uniq[order].tolist() and got[1].tolist() == counts[order].tolist()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.data())
def test_reserve_candidates_matches_numpy(n, data):
    def mask(p):
        return np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n))) & (
            np.array(data.draw(st.lists(st.floats(0, 1), min_size=n, max_size=n))) < p
        )

    static, available, exclude = mask(0.9), mask(0.9), mask(0.2)
    fit = mask(0.1) & static & available
    ends = st.sampled_from([5.0, 10.0, 10.0, 30.0, np.inf])
    first_end = np.array(data.draw(st.lists(ends, min_size=n, max_size=n)))
    now = data.draw(st.sampled_from([0.0, 10.0, 20.0]))
    node, lbs, nodes = K.reserve_candidates(static, available, exclude, fit, first_end, now)
    w_node, w_lbs, w_nodes = reserve_def.reserve_candidates(
        static, available, exclude, fit, first_end, now
    )
    assert (int(node), lbs.tolist(), nodes.tolist()) == (w_node, w_lbs.tolist(), w_nodes.tolist())
