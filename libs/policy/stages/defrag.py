"""Defragment, the definition: which running jobs to move so that a blocked job can start.

A job can be blocked although enough GPU capacity is free in total: two free GPUs on one node
and two on another while a 4-GPU job waits, or halves of GPUs that no waiting shape can use.
``plan_moves`` answers with the cheapest set of moves after which the blocked job fits on one
node, each moved job fitting, right now, somewhere other than the node being cleared. The live
defragmenter (``services/defrag``) sends the moves as intents (the placer commits or refuses
each, rule 2), and the simulator applies them; both call this function.

How a plan is chosen, per blocked job (in the order given: the caller ranks them):

* Candidate nodes: those whose shape could hold the job (``stages.filter.STATIC``), not
  cordoned or too hot, with enough GPUs that could come free (free, or held only by movable
  jobs whose GPUs fit elsewhere now) and CPUs and memory to match, ordered by the share already
  free on those GPUs (fewer moves); the first ``cfg.defrag.candidate_nodes`` are tried (a bound
  on the plan's cost).
* On a node, the GPUs to free: for a fractional job, each GPU (its cheapest jobs leave until the
  share is free); for a k-GPU job, each NVLink group of k GPUs (pairs ``(2i, 2i+1)``, or the
  node's reported topology: label ``nvlink_pairs`` = ``"0-1,2-3,..."``; groups of 4 are two
  pairs ``(4i..4i+3)``; 8 = the node), then the k GPUs whose jobs are cheapest to move. Every job
  holding one of those GPUs moves; then more of the node's jobs move while host memory or CPUs
  are short, CPU-only jobs first (they need no GPU room elsewhere), then the cheapest.
* Each moved job goes where it fits now (never the node being cleared): a fractional job to
  the GPU with the least free share that holds it (fractions pack), a whole-GPU job to the node
  with the fewest free GPUs that holds it, on a free NVLink group when there is one, a CPU-only
  job where it strands the fewest free GPUs; or, when it fits nowhere, where only CPUs or memory
  are short and movable CPU-only jobs can leave first (``stages.defrag_room.cpu_room``, one
  level: those moves come first in the plan).
* Cost of a plan: (highest priority moved, moves, not on an NVLink group, lost work), smallest
  first: lowest priority and least lost work first, few moves, whole pairs for 2- and 4-GPU
  jobs.

Only jobs with ``movable(job)`` true move. The view is never modified: the plan is worked out
on a copy, in which each planned blocked job then holds its place (so the next blocked job's
plan cannot take it). Lost work of a move: the time since the job's last checkpoint, or since
its start when it cannot checkpoint. ``RunningJob`` knows neither, so the start is estimated as
``expected_end - est_runtime_s`` and the last checkpoint as the last multiple of
``cfg.defrag.checkpoint_interval_s`` since then (fields ``started_at`` and
``last_checkpoint_at`` on ``RunningJob`` would make it exact).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.stages.compact import compaction
from libs.policy.stages.defrag_room import (
    Pair,
    Work,
    allocation_of,
    cpu_room,
    destination,
    fits,
    holding,
    lost_work_s,
    nvlink_groups,
    share_of,
    undo,
)
from libs.policy.stages.filter import STATIC, f_cordon, f_thermal, is_fractional, whole_gpus
from libs.policy.types import PendingJob, RunningJob
from proto.jobs import JobSpec

__all__ = ["Move", "allocation_of", "fits", "lost_work_s", "nvlink_groups", "plan_moves"]


@dataclass(frozen=True, slots=True)
class Move:
    """Move running job ``job_id`` from ``node_from`` to ``gpu_indices_to`` of ``node_to`` to make
    room for ``for_job``; ``lost_work_s``: work the job redoes; ``reason``: printable why."""

    job_id: str
    node_from: str
    node_to: str
    gpu_indices_to: tuple[int, ...]
    for_job: str
    lost_work_s: float
    reason: str


@dataclass(slots=True)
class _Plan:
    cost: tuple
    moves: list[Move]
    target: int  # the node cleared for the blocked job


def _gpu_sets(spec: JobSpec, view: ClusterView, node: int, cost_of: Callable) -> list:
    """Candidate GPU sets to free on ``node``: (set, on an NVLink group)."""
    g = int(view.gpu_total[node])
    if is_fractional(spec):
        return [((j,), True) for j in range(g)]
    k = whole_gpus(spec)
    sets = [(tuple(grp), True) for grp in nvlink_groups(view, node, k)]
    cheapest = tuple(sorted(range(g), key=lambda j: (cost_of(j), j))[:k])
    if all(tuple(sorted(cheapest)) != tuple(sorted(s)) for s, _ in sets):
        sets.append((cheapest, k not in (2, 4)))
    return sets


def _try_set(
    work: Work,
    spec: JobSpec,
    node: int,
    gpus: tuple[int, ...],
    aligned: bool,
    ctx: tuple[float, PolicyConfig, Callable[[RunningJob], bool], str],
) -> _Plan | None:
    """Free ``gpus`` (and enough host memory and CPUs) on ``node``; the plan, or None. Leaves
    ``work`` as it found it."""
    now, cfg, movable, _ = ctx
    v = work.view
    share = share_of(spec)
    here = list(work.on_node.get(node, ()))
    key = _order_key(now, cfg)
    if is_fractional(spec):
        (j,) = gpus
        # the GPU's movable jobs leave, cheapest first, until the share is free (others stay)
        on_gpu = sorted((r for r in here if j in r.gpu_indices and movable(r)), key=key)
        out, free = [], float(v.gpu_free[node, j])
        mem = float(v.gpu_mem_free_gb[node, j])
        for r in on_gpu:
            if free >= share - EPS and mem >= spec.gpu_mem_gb - EPS:
                break
            out.append(r)
            free += r.gpu_share
            mem += r.spec.gpu_mem_gb
    else:
        out = sorted((r for r in here if set(r.gpu_indices) & set(gpus)), key=key)
    # jobs without a GPU first (they free CPUs and memory and need no GPU room elsewhere),
    # only those that fit elsewhere now
    rest = [r for r in here if r not in out and movable(r) and work.placeable(r)]
    rest.sort(key=lambda r: (r.spec.gpus > 0, key(r)))
    host = float(v.host_mem_free_gb[node]) + sum(r.spec.host_mem_gb for r in out)
    cpus = float(v.cpus_free[node]) + sum(r.spec.cpus for r in out)
    for r in rest:  # host memory or CPUs short: the cheapest others leave too
        if host >= spec.host_mem_gb - EPS and cpus >= spec.cpus - EPS:
            break
        out.append(r)
        host += r.spec.host_mem_gb
        cpus += r.spec.cpus
    if not all(movable(r) for r in out):
        return None
    moved = _relocate(work, out, node, ctx)
    plan = None
    if moved is not None:
        if fits(spec, v, cfg)[node]:
            why = f"frees {v.node_ids[node]} GPUs {list(gpus)} for {ctx[3]}"
            moves = [_move(b, a, v, ctx, why) for b, a in moved]
            cost = (
                max(b.spec.priority for b, _ in moved),
                len(moves),
                not aligned,
                sum(m.lost_work_s for m in moves),
            )
            plan = _Plan(cost, moves, node)
        undo(v, moved)
    return plan


def _move(before: RunningJob, after: RunningJob, view: ClusterView, ctx: tuple, why: str) -> Move:
    now, cfg, _, for_job = ctx
    return Move(
        job_id=before.spec.id,
        node_from=view.node_ids[before.node_index],
        node_to=view.node_ids[after.node_index],
        gpu_indices_to=after.gpu_indices,
        for_job=for_job,
        lost_work_s=lost_work_s(before, now, cfg),
        reason=why,
    )


def _relocate(work: Work, out: list[RunningJob], node: int, ctx: tuple) -> list[Pair] | None:
    """Move ``out`` off ``node`` in ``work.view`` (largest first: the hardest to place), each
    where it fits now or where CPU-only jobs make room (``cpu_room``): the moves in the order
    applied (``undo`` restores the view), or None (the view unchanged)."""
    _, cfg, movable, _ = ctx
    v = work.view
    for r in out:  # off the node first: a destination is never the node being cleared
        v.release(allocation_of(r, v))
    done: list[Pair] = []
    taken = {r.spec.id for r in out}
    for r in sorted(out, key=lambda r: -r.spec.gpus):
        dest = destination(r, v, cfg, [node])
        if dest is None:
            room = cpu_room(r, work, [node], movable, taken)
            if room is None:
                undo(v, done)
                placed = {b.spec.id for b, _ in done}
                for q in out:
                    if q.spec.id not in placed:
                        v.allocate(allocation_of(q, v))
                return None
            dest = room[:2]
            done.extend(room[2])
            taken.update(b.spec.id for b, _ in room[2])
        after = RunningJob(r.spec, dest[0], dest[1], r.gpu_share, r.expected_end)
        v.allocate(allocation_of(after, v))
        done.append((r, after))
    return done


def _order_key(now: float, cfg: PolicyConfig) -> Callable[[RunningJob], tuple]:
    """Which jobs move first: lowest priority, then least lost work, then id (deterministic)."""
    return lambda r: (r.spec.priority, lost_work_s(r, now, cfg), r.spec.id)


def _candidates(
    work: Work, spec: JobSpec, nodes: np.ndarray, movable: Callable, cfg: PolicyConfig
) -> list[int]:
    """The nodes worth clearing for ``spec``, most promising first: those with enough GPUs
    that could come free (free, or held only by movable jobs that fit elsewhere now), ordered
    by the share already free on the GPUs that could serve it (fewer moves)."""
    v = work.view
    placeable = work.placeable
    need = share_of(spec)
    k = 1 if is_fractional(spec) else whole_gpus(spec)
    scored: list[tuple[float, int]] = []
    for n in nodes.tolist():
        free = v.gpu_free[n, : int(v.gpu_total[n])]
        reach = free.copy()
        cpus, host = float(v.cpus_free[n]), float(v.host_mem_free_gb[n])
        for r in work.on_node.get(n, ()):
            if movable(r) and placeable(r):
                reach[list(r.gpu_indices)] += r.gpu_share
                cpus, host = cpus + r.spec.cpus, host + r.spec.host_mem_gb
        ok = reach >= need - EPS
        if ok.sum() < k or cpus < spec.cpus - EPS or host < spec.host_mem_gb - EPS:
            continue
        scored.append((-float(np.sort(free[ok])[::-1][:k].sum()), n))
    return [n for _, n in sorted(scored)]


def _plan_one(work: Work, job: PendingJob, ctx: tuple, budget: int) -> _Plan | None:
    """The cheapest plan for one blocked job within ``budget`` moves, or None."""
    now, cfg, movable, _ = ctx
    spec = job.spec
    v = work.view
    shape_ok = np.ones(len(v.node_ids), dtype=bool)
    for _, rule in STATIC:
        shape_ok &= rule(spec, v)
    shape_ok &= f_cordon(spec, v) & f_thermal(spec, v, cfg)
    nodes = np.flatnonzero(shape_ok)
    if len(nodes) == 0:
        return None
    order = _candidates(work, spec, nodes, movable, cfg)
    best: _Plan | None = None
    key = _order_key(now, cfg)
    for n in order[: cfg.defrag.candidate_nodes]:
        here = work.on_node.get(n, [])

        def cost_of(j: int, _here=here) -> tuple:
            on = [r for r in _here if j in r.gpu_indices]
            if any(not movable(r) for r in on):
                return (math.inf,)
            return (len(on), *(key(r)[:2] for r in on))

        for gpus, aligned in _gpu_sets(spec, v, n, cost_of):
            plan = _try_set(work, spec, n, gpus, aligned, ctx)
            ok = plan is not None and len(plan.moves) <= budget
            if ok and (best is None or plan.cost < best.cost):
                best = plan
    return best


def _compact(work: Work, spec: JobSpec, ctx: tuple, budget: int) -> _Plan | None:
    """No node can be cleared for ``spec``: the compaction rule (``stages.compact``), as a
    plan."""
    now, cfg, movable, _ = ctx
    got = compaction(work, spec, now=now, cfg=cfg, movable=movable, budget=budget)
    if got is None:
        return None
    node, moved = got
    v = work.view
    why = f"compacts fractions off {v.node_ids[node]} for {ctx[3]}"
    moves = [_move(b, a, v, ctx, why) for b, a in moved]
    return _Plan((0,), moves, node)


def plan_moves(
    view: ClusterView,
    running: Sequence[RunningJob],
    blocked: Sequence[PendingJob],
    *,
    now: float,
    cfg: PolicyConfig,
    movable: Callable[[RunningJob], bool],
    max_moves: int,
) -> list[Move]:
    """The moves that let the blocked jobs start, cheapest first (see the module docstring).

    A blocked job that fits now needs no move (it holds its place in the plan's copy); one that
    no plan within the remaining ``max_moves`` frees gets none. Together, the moves never
    over-allocate a destination, and after all of them each planned job fits where its plan
    cleared room. ``view`` is not modified.
    """
    work = Work(view, running, cfg)
    v = work.view
    out: list[Move] = []
    moved: set[str] = set()

    def may_move(r: RunningJob) -> bool:  # a job moves at most once in a plan
        return r.spec.id not in moved and movable(r)

    for job in blocked:
        spec = job.spec
        if spec.gpus <= 0:
            continue  # a CPU-only job: GPUs are not what blocks it
        ok = fits(spec, v, cfg)
        if ok.any():
            n = int(np.flatnonzero(ok)[0])
            v.allocate(allocation_of(holding(spec, v, n), v))  # it holds its place in the copy
            continue
        budget = max_moves - len(out)
        if budget <= 0 or v.gpu_free.sum() < float(spec.gpus) - EPS:
            continue  # not enough free in total: moving jobs cannot make room
        ctx = (now, cfg, may_move, spec.id)
        plan = _plan_one(work, job, ctx, budget) or _compact(work, spec, ctx, budget)
        if plan is None or not plan.moves:
            continue
        by_id = {r.spec.id: r for rs in work.on_node.values() for r in rs}
        for m in plan.moves:
            work.move(by_id[m.job_id], v.index[m.node_to], m.gpu_indices_to)
        v.allocate(allocation_of(holding(spec, v, plan.target), v))
        out.extend(plan.moves)
        moved.update(m.job_id for m in plan.moves)
    return out
