"""The bulk walk's compiled loops: queued rows grouped by (shape, slow-model code), which groups
are dead, and the rows left (``fast.screen``, ``fast.walk``)."""

from __future__ import annotations

import numpy as np

from libs.policy.fast.compile import compiled


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
    """The bulk walk's groups of ``rows`` (``fast.screen.DeadRows.assign``): each row's key
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
