"""Compiled inner loops of the scheduling pass (numba): the steps that are one loop over the
queue's rows or over the feasible nodes.

Why compiled: on a long queue behind a full cluster (thousands of rows), a backfill pass spends
its time in a few dozen numpy calls over those rows (group them, look up their kept slow-model
codes, filter the dead ones) and, per placement, over the feasible nodes (the score terms),
each a few microseconds of fixed cost. One loop does the same work in a fraction of that.

Exactness: the row steps make only integer arithmetic and the same float operations as the
numpy expressions they replace (comparisons, elementwise arithmetic, exact min/max), so their
answers are identical bit for bit. The placement scores also sum, in a fixed order, where
numpy summed pairwise or through BLAS; those totals may differ in the last bits, which is why
a placement treats totals within ``placement.SCORE_TIE`` as a tie. ``tests/policy/
test_kernels.py`` checks each kernel against the numpy expression (or score function) it
replaces.

Compiled code is cached on disk (next to this file, else ``~/.cache/numba``, or where
``NUMBA_CACHE_DIR`` says: the image sets ``/tmp/numba``), so a process compiles only what the
cache lacks. Where no location is writable the functions are compiled per process instead:
the same code, only slower to start.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit


def compiled(fn: Callable) -> Callable:
    """``njit`` with the on-disk cache where a location is writable (see the module note)."""
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available" (read-only)
        return njit(nogil=True)(fn)


@compiled
def _code_from_waits(r, waits, waited, cache, kept):
    """Row ``r``'s slow-model code after ``waited`` seconds (bit m: ``waits[r, m] > waited``),
    into ``cache[r]``, and the window it holds for, into ``kept[r]``: (code, since = waited,
    until = the smallest threshold still ahead, inf if none)."""
    code = 0
    until = np.inf
    for m in range(waits.shape[1]):
        w = waits[r, m]
        if w > waited:
            code += np.int64(1) << m
            if w < until:
                until = w
    cache[r] = code
    kept[r, 0] = code
    kept[r, 1] = waited
    kept[r, 2] = until


@compiled
def row_codes(rows, shape_of, shape_dead, cache, kept, waits, enq, now):
    """Fill ``cache[r]`` (the slow-model code) of each row of ``rows`` whose shape is not dead
    and whose cache is empty: from its kept window where that still holds (``since <= now -
    enq < until``), else from its hold waits (``_code_from_waits``). Return the rows whose
    hold waits are not known yet (NaN), in the order given: the caller computes them and
    asks ``codes_from_waits``."""
    out = np.empty(len(rows), dtype=np.int64)
    n = 0
    for r in rows:
        if shape_dead[shape_of[r]] or cache[r] >= 0:
            continue
        waited = now - enq[r]
        if kept[r, 1] <= waited and waited < kept[r, 2]:  # NaN (never computed): no
            cache[r] = np.int64(kept[r, 0])
        elif waits.shape[1] == 0 or not np.isnan(waits[r, 0]):
            _code_from_waits(r, waits, waited, cache, kept)
        else:
            out[n] = r
            n += 1
    return out[:n]


@compiled
def codes_from_waits(rows, waits, enq, now, cache, kept):
    """``_code_from_waits`` of each row of ``rows`` (their hold waits now known)."""
    for r in rows:
        _code_from_waits(r, waits, now - enq[r], cache, kept)


@compiled
def row_keys(rows, shape_of, shape_dead, cache, bits):
    """(shape << bits) + slow-model code per row; code 0 for a row whose shape is dead."""
    keys = np.empty(len(rows), dtype=np.int64)
    for j in range(len(rows)):
        r = rows[j]
        s = shape_of[r]
        keys[j] = (s << bits) if shape_dead[s] else (s << bits) + cache[r]
    return keys


@compiled
def unique_small(keys, span):
    """``np.unique(keys, return_inverse=True)`` for keys in [0, span), with a presence table."""
    seen = np.zeros(span, dtype=np.bool_)
    for k in keys:
        seen[k] = True
    lut = np.empty(span, dtype=np.int64)
    n = 0
    for k in range(span):
        if seen[k]:
            lut[k] = n
            n += 1
    uniq = np.empty(n, dtype=np.int64)
    for k in range(span):
        if seen[k]:
            uniq[lut[k]] = k
    inv = np.empty(len(keys), dtype=np.int64)
    for j in range(len(keys)):
        inv[j] = lut[keys[j]]
    return uniq, inv


@compiled
def group_rows(rows, shape_of, shape_dead, cache, bits, span, group_of_row):
    """The bulk walk's groups of ``rows`` (``stages.screen.DeadRows.assign``): each row's key
    (``row_keys``), grouped as ``unique_small`` groups them, each row's group index filed in
    ``group_of_row[row]``. Returns the distinct keys (ascending), their shapes and codes."""
    keys = row_keys(rows, shape_of, shape_dead, cache, bits)
    uniq, inv = unique_small(keys, span)
    for j in range(len(rows)):
        group_of_row[rows[j]] = inv[j]
    return uniq, uniq >> bits, uniq & ((np.int64(1) << bits) - 1)


@compiled
def live_rows(rows, group_of_row, dead_g):
    """``rows[~dead_g[group_of_row[rows]]]``."""
    out = np.empty(len(rows), dtype=np.int64)
    n = 0
    for r in rows:
        if not dead_g[group_of_row[r]]:
            out[n] = r
            n += 1
    return out[:n]


@compiled
def rows_ranked_after(rows, s, e, q, s0, e0, q0, after):
    """The rows of ``rows`` ranked after the key (s0, e0, q0) (``after=False``: the others),
    in the order given. Ranked after: a lower score, or the same score and a later enqueue
    time, or both the same and a higher tie number (``priority.order_of``'s order)."""
    out = np.empty(len(rows), dtype=np.int64)
    n = 0
    for r in rows:
        si, ei = s[r], e[r]
        later = si < s0 or (si == s0 and (ei > e0 or (ei == e0 and q[r] > q0)))
        if later == after:
            out[n] = r
            n += 1
    return out[:n]


@compiled
def fit_one(static, req, available, whole_free, host_free, cpus_free, gpu_free, gpu_mem_free, eps):
    """bool[N]: the request ``req`` (one row of ``filters.shape_requests``: fractional flag,
    whole GPUs, host memory, CPUs, GPU share, GPU memory) fits on each node now: the
    comparisons of the dynamic filters (``filters.f_cordon``, ``f_thermal`` through
    ``available``, ``f_free_gpus``, ``f_host_memory``, ``f_cpus``) on the nodes whose shape
    can hold it (``static``). The loop is written out here and in ``fit_whole`` (a call per
    node to a shared helper cost ten times the loop)."""
    n_nodes = len(available)
    frac = req[0] != 0.0
    k = req[1]
    host = req[2] - eps
    cpus = req[3] - eps
    share = req[4] - eps
    mem = req[5] - eps
    out = np.zeros(n_nodes, dtype=np.bool_)
    for n in range(n_nodes):
        if not (static[n] and available[n] and host_free[n] >= host and cpus_free[n] >= cpus):
            continue
        if frac:
            for g in range(gpu_free.shape[1]):
                if gpu_free[n, g] >= share and gpu_mem_free[n, g] >= mem:
                    out[n] = True
                    break
        else:
            out[n] = whole_free[n] >= k
    return out


@compiled
def fit_whole(shapes, static, req, available, whole_free, host_free, cpus_free, eps):
    """bool[len(shapes), N]: the whole-GPU request shapes ``shapes`` (rows of ``static``,
    bool[shape, node], and of ``req``, ``filters.shape_requests``) fit on each node now:
    ``fit_one``'s comparisons for each shape. Rows of fractional shapes are left False (the
    caller fills them)."""
    n_nodes = len(available)
    out = np.zeros((len(shapes), n_nodes), dtype=np.bool_)
    for i in range(len(shapes)):
        s = shapes[i]
        if req[s, 0] != 0.0:
            continue
        k = req[s, 1]
        host = req[s, 2] - eps
        cpus = req[s, 3] - eps
        for n in range(n_nodes):
            out[i, n] = (
                static[s, n]
                and available[n]
                and whole_free[n] >= k
                and host_free[n] >= host
                and cpus_free[n] >= cpus
            )
    return out


@compiled
def screen_shapes(
    shapes,
    static,
    req,
    available,
    cordoned,
    whole_free,
    host_free,
    cpus_free,
    gpu_free,
    gpu_mem_free,
    eps,
):
    """(fits, why): ``fits`` bool[len(shapes), N], each shape's ``fit_one`` (``fit_whole``
    for whole GPUs, ``fit_one`` for a fraction); ``why`` per shape: 0 when it fits some node,
    else its ``refusal_code`` (4, no node could ever hold it: the caller asks
    ``filters.refusal_reason`` which static filter). The bulk walk's screen in one call."""
    fits = fit_whole(shapes, static, req, available, whole_free, host_free, cpus_free, eps)
    n_nodes = len(available)
    why = np.zeros(len(shapes), dtype=np.int64)
    for i in range(len(shapes)):
        s = shapes[i]
        if req[s, 0] != 0.0:
            fits[i] = fit_one(
                static[s],
                req[s],
                available,
                whole_free,
                host_free,
                cpus_free,
                gpu_free,
                gpu_mem_free,
                eps,
            )
        fit = False
        for n in range(n_nodes):
            if fits[i, n]:
                fit = True
                break
        if not fit:
            why[i] = refusal_code(static[s], available, cordoned)
    return fits, why


@compiled
def refusal_code(static, available, cordoned):
    """Why a request fits no node now (``filters.refusal_reason``), from its static mask: 1
    Resources (some node that could hold it is up and cool: busy), 2 Thermal (some is
    uncordoned, all of those too hot), 3 Cordoned; 4 when no node could ever hold it."""
    ever = False
    uncordoned = False
    for n in range(len(static)):
        if static[n]:
            if available[n]:
                return 1
            ever = True
            if not cordoned[n]:
                uncordoned = True
    return 4 if not ever else (2 if uncordoned else 3)


@compiled
def groups_fit(fits, inv, codes, model_idx, allowed):
    """bool per group: its shape (row ``inv[g]`` of ``fits``) fits some node now; for a group
    whose slow-model code holds some models (bit m: model m), some node of a model not held
    and ``allowed`` (not reserved)."""
    out = np.zeros(len(inv), dtype=np.bool_)
    n_nodes = fits.shape[1]
    for g in range(len(inv)):
        s = inv[g]
        code = codes[g]
        for n in range(n_nodes):
            if fits[s, n] and (code == 0 or (((code >> model_idx[n]) & 1) == 0 and allowed[n])):
                out[g] = True
                break
    return out


@compiled
def _hold_row(
    c,
    est,
    prog,
    prio,
    deadline,
    high_priority,
    es,
    present,
    speed,
    energy,
    out,
    guard,
):
    """One job's row of ``hold_waits`` into ``out`` (per model): ``c`` its workload class,
    ``present`` the models that could hold its shape. ``guard``: the settings, in the order
    of ``stages.guard.guard_args`` (slow guard runtime, green minimum tolerance, green maximum
    runtime, green worth, slow guard minimum speed, energy guard factor, green energy slack,
    green wait). The one definition ``hold_waits`` and ``hold_waits_table`` use."""
    guard_runtime = guard[0]
    green_min_tol = guard[1]
    green_max_runtime = guard[2]
    green_worth = guard[3]
    slow_min_speed = guard[4]
    guard_factor = guard[5]
    green_slack = guard[6]
    green_wait = guard[7]
    n_models = len(present)
    anyp = False
    fast = 0
    best_sp = -np.inf
    greenest = np.inf
    for m in range(n_models):
        if present[m]:
            anyp = True
            if speed[m, c] > best_sp:  # the first fastest (lowest index)
                best_sp = speed[m, c]
                fast = m
            if energy[m, c] < greenest:
                greenest = energy[m, c]
    best = speed[fast, c] if anyp else 1.0
    e_fast = energy[fast, c] if anyp else 1.0
    if not (est >= guard_runtime and anyp):
        for m in range(n_models):
            out[m] = -np.inf
        return
    left = 1.0 - prog
    if left < 0.0:  # np.maximum(0.0, left): a NaN stays NaN
        left = 0.0
    rem = est * left
    tol = 0.0
    if not (prio >= high_priority or not np.isnan(deadline)):
        tol = es  # np.clip(es, 0.0, 1.0): a NaN stays NaN
        if tol < 0.0:
            tol = 0.0
        elif tol > 1.0:
            tol = 1.0
    green = tol >= green_min_tol and est <= green_max_runtime
    for m in range(n_models):
        sp = speed[m, c]
        e = energy[m, c]
        loss = rem / sp - rem / best
        worth = 1.0 - e / e_fast >= (1.0 - green_worth * tol) * (1.0 - sp / best)
        slow = sp < slow_min_speed * best
        costly = (slow or (sp < best and e > e_fast)) and not worth
        if costly:
            hold = guard_factor * loss
        elif slow and not green:
            hold = loss
        else:
            hold = -np.inf
        hungry = green and e > green_slack * greenest
        other = green_wait if hungry else -np.inf
        # np.fmax: a NaN never holds
        if np.isnan(hold) or (other > hold):  # other > NaN is False
            hold = other
        out[m] = hold


@compiled
def hold_waits(
    cls,
    est,
    prog,
    prio,
    deadline,
    high_priority,
    es,
    present,
    speed,
    energy,
    guard,
):
    """``stages.guard.hold_waits`` per row (``_hold_row``), the same float operations in the
    same order (every one elementwise; the only reductions are a first arg-max and a min,
    which are exact)."""
    n, n_models = present.shape
    out = np.empty((n, n_models))
    for i in range(n):
        _hold_row(
            cls[i],
            est[i],
            prog[i],
            prio[i],
            deadline[i],
            high_priority,
            es[i],
            present[i],
            speed,
            energy,
            out[i],
            guard,
        )
    return out


@compiled
def hold_waits_table(
    table,
    rows,
    high_priority,
    present,
    speed,
    energy,
    guard,
):
    """``hold_waits`` of rows of a queue's table (``queue.COLUMNS`` order: prio, es, enq,
    est, prog, deadline, gpus, cls, tenant), read in place; ``present[i]``: row ``rows[i]``'s
    models."""
    out = np.empty((len(rows), present.shape[1]))
    for i in range(len(rows)):
        r = rows[i]
        _hold_row(
            np.int64(table[r, 7]),
            table[r, 3],
            table[r, 4],
            table[r, 0],
            table[r, 5],
            high_priority,
            table[r, 1],
            present[i],
            speed,
            energy,
            out[i],
            guard,
        )
    return out


@compiled
def too_big(req, ever, max_share, max_whole, eps):
    """bool per shape: larger than the largest free block (a fractional ask above the largest
    free share, a whole one above the most free GPUs on a node) and not a shape no node could
    ever hold. ``req``: ``filters.shape_requests`` (fractional flag, whole GPUs, ..., GPUs
    asked)."""
    out = np.empty(len(ever), dtype=np.bool_)
    share = max_share + eps
    for s in range(len(ever)):
        if req[s, 0] != 0.0:
            out[s] = req[s, 4] > share and ever[s]
        else:
            out[s] = req[s, 1] > max_whole and ever[s]
    return out


@compiled
def dead_groups(g_shape, failed, too_big, g_pair, g_nofit):
    """bool per group: its shape failed or is too big, or the group itself was refused."""
    out = np.empty(len(g_shape), dtype=np.bool_)
    for g in range(len(g_shape)):
        s = g_shape[g]
        out[g] = failed[s] or too_big[s] or g_pair[g] or g_nofit[g]
    return out


@compiled
def _fragmentation(free, sizes, probs, eps):
    """``scores.fragmentation`` of one node's free shares (float[G]): the free share a request
    drawn from the size mix could not use. Sums run in a fixed order (GPU slots in order; whole
    sizes, then fractional ones, each in mix order), so the result is the same on every
    machine; numpy's pairwise and BLAS sums may differ from it in the last bits."""
    total = 0.0
    full = 0
    for g in range(len(free)):
        total += free[g]
        if free[g] >= 1.0 - eps:
            full += 1
    partial = total - full
    out_whole = 0.0
    for j in range(len(sizes)):
        if sizes[j] >= 1.0 - eps:
            # round(): half to even, as np.round
            out_whole += (partial if full >= round(sizes[j]) else total) * probs[j]
    out_frac = 0.0
    for j in range(len(sizes)):
        if sizes[j] < 1.0 - eps:
            small = 0.0
            for g in range(len(free)):
                if free[g] < sizes[j] - eps:
                    small += free[g]
            out_frac += small * probs[j]
    return out_whole + out_frac


@compiled
def score_nodes(
    nodes,
    gpu_free,
    gpu_mem_free,
    gpu_mem_gb,
    model_idx,
    temp_c,
    temps_known,
    speed,
    energy,
    cls,
    frac,
    k,
    gpus,
    mem,
    sizes,
    probs,
    weights,
    wsum,
    thermal_max,
    thermal_span,
    eps,
    tie,
):
    """``placement.place``'s score of each feasible node: terms[5, n] (speed, energy, pack,
    thermal, memory fit, as ``libs.policy.scores`` defines them), the weighted total, the
    chosen node (the first within ``tie`` of the best total; with a NaN total, the first NaN,
    as ``np.argmax``) and, for a fractional job, the GPU slot it takes on each node (the best
    fit, first on ties). Every step is elementwise or an exact min/max/arg-min
    in numpy's order, except the fragmentation sums (see ``_fragmentation``)."""
    n = len(nodes)
    n_slots = gpu_free.shape[1]
    terms = np.empty((5, n))
    slot = np.zeros(n, dtype=np.int64)
    growth = np.empty(n)
    after = np.empty(n_slots)
    sp_max = -np.inf
    e_min = np.inf
    for i in range(n):
        v = nodes[i]
        m = model_idx[v]
        sp = speed[m, cls]
        e = energy[m, cls]
        terms[0, i] = sp
        terms[1, i] = e
        if sp > sp_max or (np.isnan(sp) and not np.isnan(sp_max)):
            sp_max = sp
        if e < e_min or (np.isnan(e) and not np.isnan(e_min)):
            e_min = e
        for g in range(n_slots):
            after[g] = gpu_free[v, g]
        if frac:
            best_g = -1
            for g in range(n_slots):
                fits = gpu_free[v, g] >= gpus - eps and gpu_mem_free[v, g] >= mem - eps
                if fits and (best_g < 0 or gpu_free[v, g] < gpu_free[v, best_g]):
                    best_g = g
            if best_g < 0:  # np.argmin of all inf: the first slot
                best_g = 0
            slot[i] = best_g
            after[best_g] -= gpus
        else:
            taken = 0
            for g in range(n_slots):
                if taken < k and gpu_free[v, g] >= 1.0 - eps:
                    after[g] -= 1.0
                    taken += 1
        growth[i] = _fragmentation(after, sizes, probs, eps) - _fragmentation(
            gpu_free[v], sizes, probs, eps
        )
    lo = np.inf
    hi = -np.inf
    for i in range(n):  # normalize_higher_better(-growth)
        x = -growth[i]
        lo = min(lo, x)
        hi = max(hi, x)
    for i in range(n):
        terms[0, i] = terms[0, i] / sp_max
        terms[1, i] = e_min / terms[1, i]
        terms[2, i] = 1.0 if hi - lo < 1e-12 else (-growth[i] - lo) / (hi - lo)
        if temps_known:
            t = temp_c[nodes[i]]
            h = (thermal_max - t) / thermal_span
            h = 0.0 if h < 0.0 else (1.0 if h > 1.0 else h)
            terms[3, i] = 1.0 if np.isnan(t) else h
        else:
            terms[3, i] = 1.0
        q = mem / max(gpu_mem_gb[nodes[i]], eps)
        terms[4, i] = 0.0 if q < 0.0 else (1.0 if q > 1.0 else q)
    total = np.empty(n)
    top = -np.inf
    has_nan = False
    for i in range(n):
        acc = 0.0
        for t in range(5):
            acc += weights[t] * terms[t, i]
        total[i] = acc / wsum
        if np.isnan(total[i]):
            has_nan = True
        elif total[i] > top:
            top = total[i]
    best = 0
    for i in range(n):  # the first within tie of the best (np.argmax with a NaN)
        if has_nan:
            if np.isnan(total[i]):
                best = i
                break
        elif total[i] >= top - tie:
            best = i
            break
    return total, terms, slot, best


@compiled
def power_due(now, idle_since, suspended, resuming, empty, suspend_after):
    """(due, any asleep, any due, next due time or inf) of the power step: a node is due to
    sleep when it is awake (neither suspended nor resuming), empty (``power.empty_nodes``) and
    idle at least ``suspend_after`` (``now - idle_since``; NaN while it holds a job); the next
    due time is the earliest ``idle_since + suspend_after`` after ``now`` among awake idle
    nodes. The comparisons and sums of the numpy expressions, node by node."""
    n = len(idle_since)
    due = np.zeros(n, dtype=np.bool_)
    any_asleep = False
    any_due = False
    nxt = np.inf
    for i in range(n):
        if suspended[i]:
            any_asleep = True
            continue
        if resuming[i] or np.isnan(idle_since[i]):
            continue
        if now - idle_since[i] >= suspend_after and empty[i]:
            due[i] = True
            any_due = True
        t = idle_since[i] + suspend_after
        if t > now and t < nxt:
            nxt = t
    return due, any_asleep, any_due, nxt


@compiled
def _clip01(x):
    """``np.clip(x, 0.0, 1.0)`` of one number (NaN stays NaN)."""
    return 0.0 if x < 0.0 else (1.0 if x > 1.0 else x)


@compiled
def urgency_of(deadline, now, remaining, scale, missed):
    """The deadline urgency of one job (``priority.urgency``): 0 without a deadline (NaN),
    ``missed`` once the slack is negative, else exp(-slack / scale)."""
    if np.isnan(deadline):
        return 0.0
    slack = deadline - now - remaining
    if slack < 0.0:
        return missed
    return np.exp(-slack / scale)


@compiled
def urgency_many(deadline, now, remaining, scale, missed):
    """``urgency_of`` per row."""
    out = np.empty(len(deadline))
    for i in range(len(deadline)):
        out[i] = urgency_of(deadline[i], now, remaining[i], scale, missed)
    return out


@compiled
def _score_terms(
    prio,
    es,
    enq,
    est,
    prog,
    deadline,
    dom,
    n_tenants,
    best,
    settings,
):
    """(base, fair share, energy, urgency, aging, score) of one queued job: the operations, and
    their order, of the numpy expressions the module docstring of ``priority`` writes down.
    ``dom``: its tenant's dominant share; ``best``: the fastest speed for its workload class;
    ``settings``: now, aging per hour, urgency scale, urgency once missed, and the regime's
    weights on fair share, energy, deadline and priority (``priority._score_settings``).
    The one definition both ``priority_terms`` and ``score_table_rows`` use."""
    now, aging_per_h, scale, missed = settings[0], settings[1], settings[2], settings[3]
    w_fair, w_energy, w_deadline, w_priority = settings[4], settings[5], settings[6], settings[7]
    base = (prio + 1.0) / 10.0
    fair = 1.0 / (1.0 + dom * n_tenants)
    energy = 1.0 - _clip01(es)
    remaining = est * _clip01(1.0 - prog) / best
    urg = urgency_of(deadline, now, remaining, scale, missed)
    waited = now - enq
    aging = aging_per_h * (0.0 if waited < 0.0 else waited) / 3600.0
    mix = w_fair * fair + w_energy * energy + w_deadline * urg + w_priority
    return base, fair, energy, urg, aging, base * mix + aging


@compiled
def priority_terms(
    prio,
    es,
    enq,
    est,
    prog,
    deadline,
    cls,
    tenant,
    tenant_dom,
    n_tenants,
    best,
    settings,
):
    """float[6, rows]: the terms of ``priority.score_arrays`` per queued row (base, fair share,
    energy, urgency, aging) and the score, base x (w_fair fair + w_energy energy + w_deadline
    urgency + w_priority) + aging (``_score_terms``). ``tenant_dom``: dominant share per
    tenant index; ``best``: the fastest speed per workload class. A pass scores the one or
    two jobs queued since the last, where numpy's fixed cost per call was most of the time."""
    n = len(prio)
    out = np.empty((6, n))
    for i in range(n):
        t = _score_terms(
            prio[i],
            es[i],
            enq[i],
            est[i],
            prog[i],
            deadline[i],
            tenant_dom[tenant[i]],
            n_tenants,
            best[cls[i]],
            settings,
        )
        for k in range(6):
            out[k, i] = t[k]
    return out


@compiled
def score_table_rows(
    table,
    rows,
    tenant_dom,
    n_tenants,
    best,
    settings,
):
    """float[len(rows)]: the score (``_score_terms``) of rows of a queue's table, float[row,
    column] in ``queue.COLUMNS`` order (prio, es, enq, est, prog, deadline, gpus, cls,
    tenant): the one or two rows queued since the last pass, read in place instead of
    through a ``QueueArrays`` of them."""
    out = np.empty(len(rows))
    for i in range(len(rows)):
        r = rows[i]
        t = _score_terms(
            table[r, 0],
            table[r, 1],
            table[r, 2],
            table[r, 3],
            table[r, 4],
            table[r, 5],
            tenant_dom[np.int64(table[r, 8])],
            n_tenants,
            best[np.int64(table[r, 7])],
            settings,
        )
        out[i] = t[5]
    return out


@compiled
def dominant_shares(usage, capacity):
    """float[T]: per row of ``usage`` (float[T, R]), the largest share of any resource with
    capacity (``usage / capacity`` over the resources with capacity > 0, maximum; 0 when no
    resource has capacity): DRF's dominant share (``priority.dominant_share``)."""
    out = np.zeros(usage.shape[0])
    for t in range(usage.shape[0]):
        first = True
        m = 0.0
        for r in range(usage.shape[1]):
            if capacity[r] > 0.0:
                v = usage[t, r] / capacity[r]
                if first or v > m or np.isnan(v):
                    m = v
                    first = False
                if np.isnan(m):
                    break
        out[t] = m
    return out


@compiled
def _ranks_before(s, e, q, a, b):
    """Row ``a`` comes before row ``b`` in rank order: higher score, then earlier enqueue, then
    lower tie number (``priority.order_of``)."""
    if s[a] != s[b]:
        return s[a] > s[b]
    if e[a] != e[b]:
        return e[a] < e[b]
    return q[a] < q[b]


@compiled
def _sort_rows(rows, s, e, q):
    """``rows`` in rank order, a stable merge sort (equal keys keep the order given, as
    ``np.lexsort`` keeps it)."""
    n = len(rows)
    a = rows.copy()
    b = np.empty_like(a)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if _ranks_before(s, e, q, a[j], a[i]):
                    b[k] = a[j]
                    j += 1
                else:
                    b[k] = a[i]
                    i += 1
                k += 1
            while i < mid:
                b[k] = a[i]
                i += 1
                k += 1
            while j < hi:
                b[k] = a[j]
                j += 1
                k += 1
        a, b = b, a
        width *= 2
    return a


@compiled
def top_rows(rows, s, e, q, k):
    """(best, rest, ok): ``best`` = the rows of ``rows`` scoring at least the ``k``-th best
    score (every row when k >= len(rows)), in rank order; ``rest`` = the others, in the order
    given. The same rows and order as ``priority.order_of(s[rows], e[rows], k, q[rows])``
    (which keeps every tie of its last score). ``ok`` False (and nothing computed) when a key
    is NaN: the caller then asks numpy, whose sorts put NaN last."""
    n = len(rows)
    for r in rows:
        if np.isnan(s[r]) or np.isnan(e[r]) or np.isnan(q[r]):
            return rows[:0], rows[:0], False
    if k <= 0:
        return rows[:0], rows.copy(), True
    if k >= n:
        return _sort_rows(rows, s, e, q), rows[:0], True
    neg = np.empty(n)
    for i in range(n):
        neg[i] = -s[rows[i]]
    thr = -np.partition(neg, k - 1)[k - 1]
    best = np.empty(n, dtype=np.int64)
    rest = np.empty(n, dtype=np.int64)
    nb = 0
    nr = 0
    for r in rows:
        if s[r] >= thr:
            best[nb] = r
            nb += 1
        else:
            rest[nr] = r
            nr += 1
    return _sort_rows(best[:nb], s, e, q), rest[:nr], True


@compiled
def size_mix_of_counts(counts):
    """(sizes, probabilities) of a histogram of request size codes (``scores.SizeMix.
    size_code``: 1..10 tenths of a GPU, 10 + k for k whole GPUs), codes in increasing order;
    a "1.0" fraction (code 10) counts as one whole GPU (code 11) when both occur. Empty when
    the histogram is. The counts are whole numbers, so their float sum is exact in any order
    and the shares are those numpy's expressions give."""
    n = 0
    for code in range(len(counts)):
        if counts[code] != 0:
            n += 1
    merge = len(counts) > 11 and counts[10] != 0 and counts[11] != 0
    if merge:
        n -= 1
    sizes = np.empty(n)
    c = np.empty(n)
    j = 0
    for code in range(len(counts)):
        if counts[code] == 0 or (merge and code == 10):
            continue
        if code == 10:
            sizes[j] = 1.0
        elif code < 10:
            sizes[j] = code / 10.0
        else:
            sizes[j] = code - 10.0
        c[j] = float(counts[code])
        if merge and code == 11:
            c[j] += float(counts[10])
        j += 1
    total = 0.0
    for k in range(n):
        total += c[k]
    for k in range(n):
        c[k] = c[k] / total
    return sizes, c


@compiled
def largest_free(whole_free, gpu_free):
    """(the most whole free GPUs on one node, the largest free share of one GPU): the
    ``max()`` of each array (NaN propagates, as numpy's does), 0 for an empty one."""
    w = 0
    for i in range(len(whole_free)):
        if i == 0 or whole_free[i] > w:
            w = whole_free[i]
    share = 0.0
    first = True
    for v in gpu_free.flat:
        if first or v > share or np.isnan(v):
            share = v
            first = False
        if np.isnan(share):
            break
    return int(w), float(share)


@compiled
def unique_sorted(a):
    """``np.unique(a, return_inverse=True)`` for a non-empty sorted ``a``, without sorting."""
    inv = np.empty(len(a), dtype=np.int64)
    n = 0
    for i in range(len(a)):
        if i > 0 and a[i] != a[i - 1]:
            n += 1
        inv[i] = n
    uniq = np.empty(n + 1, dtype=a.dtype)
    for i in range(len(a)):
        uniq[inv[i]] = a[i]
    return uniq, inv


@compiled
def power_resume(static, counts, needs, claim, down, rank, gpu_total, eps):
    """The resume half of ``power.plan``: for each group of blocked jobs in order (``static``:
    bool[group, node], where its shape fits; ``counts``: jobs; ``needs``: GPUs each asks),
    every job first takes unclaimed GPUs of a node already booting (the first such node, in
    index order: ``claim`` >= need), else wakes the first suspended node (``down``) it fits, in
    ``rank`` order, which it claims minus its need, while some node is left to wake or to
    claim. Returns (nodes to resume, in order; nodes some group fits). ``claim`` and ``down``
    are updated in place."""
    n = static.shape[1]
    resume = np.empty(n, dtype=np.int64)
    n_resume = 0
    needed = np.zeros(n, dtype=np.bool_)
    waking = False
    for i in range(n):
        if down[i] or claim[i] > 0:
            waking = True
            break
    for g in range(static.shape[0]):
        for i in range(n):
            if static[g, i]:
                needed[i] = True
        if not waking:
            continue
        need = needs[g]
        for _ in range(counts[g]):
            up = -1
            for i in range(n):
                if static[g, i] and claim[i] >= need - eps:
                    up = i
                    break
            if up >= 0:
                claim[up] -= need
                continue
            k = -1
            for p in range(n):
                if static[g, rank[p]] and down[rank[p]]:
                    k = rank[p]
                    break
            if k < 0:
                break
            down[k] = False
            claim[k] = float(gpu_total[k]) - need
            resume[n_resume] = k
            n_resume += 1
        waking = False
        for i in range(n):
            if down[i] or claim[i] > 0:
                waking = True
                break
    return resume[:n_resume], needed


@compiled
def feasible_nodes(fit, mask):
    """``np.flatnonzero(fit & mask)``: the nodes a job fits now and may use."""
    out = np.empty(len(fit), dtype=np.int64)
    n = 0
    for i in range(len(fit)):
        if fit[i] and mask[i]:
            out[n] = i
            n += 1
    return out[:n]


@compiled
def groups_in_order(ids):
    """(distinct values of ``ids`` in order of first appearance, how often each occurs): what
    ``np.unique(ids, return_index=True, return_counts=True)`` reordered by first index gives,
    without sorting (``ids``: small non-negative integers, request-shape indices)."""
    span = 0
    for v in ids:
        if v + 1 > span:
            span = v + 1
    slot = np.full(span, -1, dtype=np.int64)
    first = np.empty(len(ids), dtype=np.int64)
    counts = np.zeros(len(ids), dtype=np.int64)
    n = 0
    for v in ids:
        s = slot[v]
        if s < 0:
            s = slot[v] = n
            first[n] = v
            n += 1
        counts[s] += 1
    return first[:n], counts[:n]


@compiled
def reserve_candidates(static, available, exclude, fit, first_end, now):
    """The reservation search's nodes (``backfill.reserve``): (the lowest eligible node that
    fits now, or -1; else the eligible nodes with a finite lower bound on their start, as
    (bound, node) sorted by bound then node). Eligible: ``static & available & ~exclude``;
    a node's bound is ``max(first_end[node], now)`` (it needs at least its first release).
    One pass instead of a dozen numpy calls on ~100 nodes, which was most of a reservation."""
    n = len(static)
    lbs = np.empty(n)
    nodes = np.empty(n, dtype=np.int64)
    k = 0
    for i in range(n):
        if not static[i] or not available[i] or exclude[i]:
            continue
        if fit[i]:
            return i, lbs[:0], nodes[:0]
        lb = first_end[i]
        if lb < now:
            lb = now
        if lb < np.inf:
            lbs[k] = lb
            nodes[k] = i
            k += 1
    by = np.argsort(lbs[:k], kind="mergesort")  # stable: equal bounds keep node order
    return -1, lbs[:k][by], nodes[:k][by]
