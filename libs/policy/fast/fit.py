"""The filter stage's compiled loops: which nodes can hold a request now (the rules of
``stages.filter.f_*``), many shapes at once, and why a shape fits nowhere."""

from __future__ import annotations

import numpy as np

from libs.policy.fast.compile import compiled


@compiled
def fit_one(static, req, available, whole_free, host_free, cpus_free, gpu_free, gpu_mem_free, eps):
    """bool[N]: the request ``req`` (one row of ``filters.shape_requests``: fractional flag,
    whole GPUs, host memory, CPUs, GPU share, GPU memory) fits on each node now: the
    comparisons of the dynamic filters (``stages.filter.f_cordon``, ``f_thermal`` through
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
def feasible_nodes(fit, mask):
    """``np.flatnonzero(fit & mask)``: the nodes a job fits now and may use."""
    out = np.empty(len(fit), dtype=np.int64)
    n = 0
    for i in range(len(fit)):
        if fit[i] and mask[i]:
            out[n] = i
            n += 1
    return out[:n]
