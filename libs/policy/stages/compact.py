"""Compaction, the defragmenter's second rule: pack movable fractional jobs into the holes of
other GPUs so that one GPU comes free enough for a blocked job.

Why a rule of its own: the per-node plan (``stages.defrag``) clears one of a few candidate
nodes for the blocked job; with fractional jobs the free capacity is mostly holes (a 0.19
beside a 0.81, a 0.06 beside two 0.47s) spread over thousands of GPUs, and a 1-GPU job or a
large fraction waits although the holes together would hold it many times over. Compaction
looks at every GPU of the cluster instead of a few nodes, and moves fractions only *into
holes*, never onto a free GPU (that would move the hole, not close it).

For a blocked job asking ``s`` of one GPU (a fraction, or one whole GPU: ``s`` = 1):

* Target GPUs: on a node whose shape could hold the job (``stages.filter.STATIC``, not
  cordoned or too hot), a GPU with less than ``s`` free whose movable fractional jobs
  (``movable``) hold enough that, once they leave, ``s`` is free, with the node's CPUs and host
  memory (its free ones plus the leavers') enough for the job.
* Leavers on a target: its movable fractional jobs of a shape some hole elsewhere holds now
  (others could go nowhere), largest share first, until ``s`` is free (the fewest moves).
* Cost of a target: (highest priority moved, moves, lost work, share moved), smallest first;
  the first ``cfg.defrag.candidate_nodes`` targets are tried in that order and the first
  whose every leaver finds a hole wins (a bound on the plan's cost).
* Each leaver goes to a hole: the GPU, on another node where it fits now (every filter rule),
  with the least free share that holds it and is not a whole free GPU (best fit).

A plan is accepted only if the blocked job fits on the target's node afterwards. The view is
left as it was found (the moves are worked out, then undone); the caller applies them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.stages import share as SH
from libs.policy.stages.defrag_room import Pair, Work, fits, lost_work_s, move_in_view, undo
from libs.policy.stages.filter import (
    STATIC,
    f_cordon,
    f_thermal,
    is_fractional,
    shape_key,
    whole_gpus,
)
from libs.policy.types import RunningJob
from proto.jobs import JobSpec

Target = tuple[tuple, int, int, list[RunningJob]]  # cost, node, GPU, leavers


def need_of(spec: JobSpec) -> float | None:
    """The share of one GPU that must come free for ``spec``; None when compaction cannot
    serve it (no GPU, or more than one whole GPU: the per-node plan's case)."""
    if spec.gpus <= 0:
        return None
    if is_fractional(spec):
        return float(spec.gpus)
    return 1.0 if whole_gpus(spec) == 1 else None


def _fraction(r: RunningJob) -> bool:
    """A running job holding part of one GPU (not a CPU-only one)."""
    return r.spec.gpus > 0 and is_fractional(r.spec) and len(r.gpu_indices) == 1


def hole_for(
    job: RunningJob, view: ClusterView, cfg: PolicyConfig, avoid: int
) -> tuple[int, tuple[int, ...]] | None:
    """The hole ``job`` (fractional) packs into: on a node other than ``avoid`` where it fits,
    the GPU with the least free share that holds it and is not wholly free; or None."""
    ok = fits(job.spec, view, cfg)
    ok[avoid] = False
    cand = np.flatnonzero(ok)
    if len(cand) == 0:
        return None
    gfree = SH.free_for(job.spec, view, cfg)[cand]
    roomy = (gfree >= job.gpu_share - EPS) & (gfree < 1.0 - EPS)
    roomy &= view.gpu_mem_free_gb[cand] >= job.spec.gpu_mem_gb - EPS
    if not roomy.any():
        return None
    free = np.where(roomy, gfree, 2.0)
    k = int(np.argmin(free.min(axis=1)))
    return int(cand[k]), (int(np.argmin(free[k])),)


def targets(
    work: Work, spec: JobSpec, need: float, now: float, cfg: PolicyConfig, movable: Callable
) -> list[Target]:
    """Every target GPU for ``spec`` with its leavers, cheapest first (module docstring)."""
    v = work.view
    ok = np.ones(len(v.node_ids), dtype=bool)
    for _, rule in STATIC:
        ok &= rule(spec, v)
    ok &= f_cordon(spec, v) & f_thermal(spec, v, cfg)
    has_hole: dict[tuple, bool] = {}  # per shape: whether some hole holds it (a prefilter)

    def may_leave(r: RunningJob) -> bool:
        key = shape_key(r.spec)
        if key not in has_hole:
            has_hole[key] = hole_for(r, v, cfg, r.node_index) is not None
        return has_hole[key]

    out: list[Target] = []
    for n in np.flatnonzero(ok).tolist():
        free = v.gpu_free[n]
        if not (free[: int(v.gpu_total[n])] < need - EPS).any():
            continue  # every GPU holds the share already: CPUs or memory block it, not holes
        movers = [
            r for r in work.on_node.get(n, ()) if _fraction(r) and movable(r) and may_leave(r)
        ]
        if not movers:
            continue
        cpus, host = float(v.cpus_free[n]), float(v.host_mem_free_gb[n])
        for j in sorted({r.gpu_indices[0] for r in movers}):
            on = sorted((r for r in movers if r.gpu_indices[0] == j), key=lambda r: -r.gpu_share)
            got, leave = float(free[j]), []
            for r in on:
                if got >= need - EPS:
                    break
                leave.append(r)
                got += r.gpu_share
            if got < need - EPS or not leave:
                continue
            if cpus + sum(r.spec.cpus for r in leave) < spec.cpus - EPS:
                continue
            if host + sum(r.spec.host_mem_gb for r in leave) < spec.host_mem_gb - EPS:
                continue
            cost = (
                max(r.spec.priority for r in leave),
                len(leave),
                sum(lost_work_s(r, now, cfg) for r in leave),
                sum(r.gpu_share for r in leave),
                n,
                j,
            )
            out.append((cost, n, j, leave))
    out.sort(key=lambda t: t[0])
    return out


def compaction(
    work: Work,
    spec: JobSpec,
    *,
    now: float,
    cfg: PolicyConfig,
    movable: Callable[[RunningJob], bool],
    budget: int,
) -> tuple[int, list[Pair]] | None:
    """The cheapest compaction within ``budget`` moves after which ``spec`` fits: (the node it
    then fits on, the moves as (before, after) pairs in order), or None. ``work.view`` is left
    as it was found."""
    need = need_of(spec)
    if need is None or budget <= 0:
        return None
    v = work.view
    tried = 0
    for _, n, _j, leave in targets(work, spec, need, now, cfg, movable):
        if len(leave) > budget:
            continue
        if tried >= cfg.defrag.candidate_nodes:
            break
        tried += 1
        done: list[Pair] = []
        for r in leave:
            dest = hole_for(r, v, cfg, n)
            if dest is None:
                break
            done.append(move_in_view(v, r, *dest))
        ok = len(done) == len(leave) and bool(fits(spec, v, cfg)[n])
        undo(v, done)
        if ok:
            return n, done
    return None
