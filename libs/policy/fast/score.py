"""The score stage's compiled loop: every feasible node's weighted score terms (the terms of
``stages.score.s_*``), summed in a fixed order (ties: ``stages.pick.SCORE_TIE``), and the queue's
size mix."""

from __future__ import annotations

import numpy as np

from libs.policy.fast.compile import compiled


@compiled
def _fragmentation(free, sizes, probs, eps):
    """``stages.score.fragmentation`` of one node's free shares (float[G]): the free share a request
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
