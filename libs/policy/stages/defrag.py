"""Defragment, the definition: which running jobs to move so that a blocked job can start.

A job can be blocked although enough GPU capacity is free in total: two free GPUs on one node
and two on another while a 4-GPU job waits, or halves of GPUs that no waiting shape can use.
``plan_moves`` answers with the cheapest set of moves after which the blocked job fits on one
node, each moved job fitting, right now, somewhere other than the node being cleared. The live
defragmenter (``services/defrag``) sends the moves as intents (the placer commits or refuses
each, rule 2), and the simulator applies them; both call this function.

How a plan is chosen, per blocked job (in the order given: the caller ranks them):

* Candidate nodes: those whose shape could hold the job (``stages.filter.STATIC``), not
  cordoned or too hot, ordered by how much GPU capacity is free or held by movable jobs (the
  most first); the first ``cfg.defrag.candidate_nodes`` are tried (a bound on the plan's cost).
* On a node, the GPUs to free: for a fractional job, each GPU (its cheapest jobs leave until the
  share is free); for a k-GPU job, each NVLink group of k GPUs (pairs ``(2i, 2i+1)``, or the
  node's reported topology: label ``nvlink_pairs`` = ``"0-1,2-3,..."``; groups of 4 are two
  pairs ``(4i..4i+3)``; 8 = the node), then the k GPUs whose jobs are cheapest to move. Every job
  holding one of those GPUs moves; then more of the node's jobs move, cheapest first, while host
  memory or CPUs are short.
* Each moved job goes where it fits now (never the node being cleared): a fractional job to
  the GPU with the least free share that holds it (fractions pack), a whole-GPU job to the node
  with the fewest free GPUs that holds it, on a free NVLink group when there is one.
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
from libs.policy.stages.filter import (
    STATIC,
    f_cordon,
    f_cpus,
    f_free_gpus,
    f_host_memory,
    f_thermal,
    is_fractional,
    shape_key,
    whole_gpus,
)
from libs.policy.types import PendingJob, RunningJob
from proto.jobs import JobSpec
from proto.ledger import Allocation


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


def fits(spec: JobSpec, view: ClusterView, cfg: PolicyConfig) -> np.ndarray:
    """bool[N]: nodes that could take ``spec`` now (every filter rule of ``stages.filter``)."""
    ok = f_free_gpus(spec, view) & f_host_memory(spec, view) & f_cpus(spec, view)
    ok &= f_cordon(spec, view) & f_thermal(spec, view, cfg)
    for _, rule in STATIC:
        ok &= rule(spec, view)
    return ok


def lost_work_s(job: RunningJob, now: float, cfg: PolicyConfig) -> float:
    """Work ``job`` redoes if stopped now: since its last checkpoint, or its start (estimated
    from ``expected_end - est_runtime_s``; see the module docstring)."""
    end = job.expected_end
    start = end - job.spec.est_runtime_s if math.isfinite(end) else now
    ran = max(0.0, now - start)
    if job.spec.checkpointable or job.spec.elastic is not None:
        return ran % cfg.defrag.checkpoint_interval_s
    return ran


def nvlink_groups(view: ClusterView, node: int, k: int) -> list[tuple[int, ...]]:
    """GPU groups of size ``k`` on ``node`` that NVLink joins: pairs from the node's label
    ``nvlink_pairs`` ("0-1,2-3") or ``(2i, 2i+1)``; 4 = two consecutive pairs; the whole node
    when k is its size. Other sizes have no group (any k GPUs)."""
    g = int(view.gpu_total[node])
    if k == g:
        return [tuple(range(g))]
    label = view.nodes[node].labels.get("nvlink_pairs", "")
    pairs = [tuple(int(x) for x in p.split("-")) for p in label.split(",") if "-" in p]
    pairs = pairs or [(2 * i, 2 * i + 1) for i in range(g // 2)]
    if k == 2:
        return [p for p in pairs if len(p) == 2]
    if k == 4:
        return [pairs[i] + pairs[i + 1] for i in range(0, len(pairs) - 1, 2)]
    return []


def allocation_of(job: RunningJob, view: ClusterView) -> Allocation:
    """What ``job`` holds, as the ledger record the view is moved with."""
    s = job.spec
    return Allocation(
        job_id=s.id,
        node=view.node_ids[job.node_index],
        gpu_indices=job.gpu_indices,
        gpu_share=job.gpu_share,
        gpu_mem_gb=s.gpu_mem_gb,
        host_mem_gb=s.host_mem_gb,
        cpus=s.cpus,
        time=0.0,
        spec=s,
    )


@dataclass(slots=True)
class _Plan:
    cost: tuple
    moves: list[Move]
    target: int  # the node cleared for the blocked job


class _Work:
    """The copy of the view a plan is worked out on, and who runs where in it."""

    def __init__(self, view: ClusterView, running: Sequence[RunningJob]) -> None:
        self.view = view.copy()
        self.on_node: dict[int, list[RunningJob]] = {}
        for r in running:
            self.on_node.setdefault(r.node_index, []).append(r)

    def move(self, job: RunningJob, node: int, gpus: tuple[int, ...]) -> None:
        v = self.view
        v.release(allocation_of(job, v))
        self.on_node[job.node_index].remove(job)
        moved = RunningJob(job.spec, node, gpus, job.gpu_share, job.expected_end)
        v.allocate(allocation_of(moved, v))
        self.on_node.setdefault(node, []).append(moved)


def share_of(spec: JobSpec) -> float:
    """The share a job holds on each of its GPUs."""
    return float(spec.gpus) if is_fractional(spec) else 1.0


def _holding(spec: JobSpec, view: ClusterView, node: int) -> RunningJob:
    """A blocked job as it will run on ``node``: the next plan must leave it its place."""
    share = share_of(spec)
    return RunningJob(spec, node, slots_for(spec, view, node, share), share, math.inf)


def slots_for(spec: JobSpec, view: ClusterView, node: int, share: float) -> tuple[int, ...]:
    """GPU slots on ``node`` for ``spec`` (it fits there): a fraction on the fullest GPU that
    holds it; k whole GPUs on a free NVLink group if one is free, else the lowest free ones."""
    free = view.gpu_free[node]
    if spec.gpus <= 0:  # CPU-only: no GPU slot
        return ()
    if is_fractional(spec):
        ok = (free >= share - EPS) & (view.gpu_mem_free_gb[node] >= spec.gpu_mem_gb - EPS)
        cand = np.flatnonzero(ok & view.gpu_exists[node])
        return (int(cand[np.argmin(free[cand])]),)
    k = whole_gpus(spec)
    whole = [j for j in range(int(view.gpu_total[node])) if free[j] >= 1.0 - EPS]
    for grp in nvlink_groups(view, node, k):
        if all(free[j] >= 1.0 - EPS for j in grp):
            return tuple(grp)
    return tuple(whole[:k])


def destination(
    job: RunningJob, view: ClusterView, cfg: PolicyConfig, avoid: int
) -> tuple[int, tuple[int, ...]] | None:
    """Where a moved job goes now (not ``avoid``): best fit, so it fills holes, not free nodes."""
    ok = fits(job.spec, view, cfg)
    ok[avoid] = False
    cand = np.flatnonzero(ok)
    if len(cand) == 0:
        return None
    if job.spec.gpus <= 0:  # CPU-only: where its CPUs strand the fewest free GPUs
        n = int(cand[np.lexsort((view.cpus_free[cand], view.gpu_free[cand].sum(axis=1)))[0]])
    elif is_fractional(job.spec):
        free = np.where(view.gpu_free[cand] >= job.gpu_share - EPS, view.gpu_free[cand], 2.0)
        n = int(cand[np.argmin(free.min(axis=1))])
    else:
        n = int(cand[np.argmin(view.whole_free[cand])])
    return n, slots_for(job.spec, view, n, job.gpu_share)


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
    work: _Work,
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
    rest = sorted((r for r in here if r not in out and movable(r)), key=key)
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
    moves = _relocate(work, out, node, ctx, f"frees {v.node_ids[node]} GPUs {list(gpus)}")
    plan = None
    if moves is not None and fits(spec, v, cfg)[node]:
        cost = (
            max((r.spec.priority for r in out), default=-1),
            len(out),
            not aligned,
            sum(m.lost_work_s for m in moves),
        )
        plan = _Plan(cost, moves, node)
    _undo(work, out, moves)
    return plan


def _relocate(
    work: _Work, out: list[RunningJob], node: int, ctx: tuple, why: str
) -> list[Move] | None:
    """Take ``out`` off ``node`` and place each elsewhere in ``work.view`` (largest first: the
    hardest to place); the moves, or None when one fits nowhere (``_undo`` restores either)."""
    now, cfg, _, for_job = ctx
    v = work.view
    for r in out:  # off the node first: a destination is never the node being cleared
        v.release(allocation_of(r, v))
    moves: list[Move] = []
    for r in sorted(out, key=lambda r: -r.spec.gpus):
        dest = destination(r, v, cfg, avoid=node)
        if dest is None:
            _undo(work, out, moves)
            return None
        after = RunningJob(r.spec, dest[0], dest[1], r.gpu_share, r.expected_end)
        v.allocate(allocation_of(after, v))
        moves.append(
            Move(
                job_id=r.spec.id,
                node_from=v.node_ids[node],
                node_to=v.node_ids[dest[0]],
                gpu_indices_to=dest[1],
                for_job=for_job,
                lost_work_s=lost_work_s(r, now, cfg),
                reason=f"{why} for {for_job}",
            )
        )
    return moves


def _undo(work: _Work, out: list[RunningJob], moves: list[Move] | None) -> None:
    """Put ``work.view`` back as it was before ``_relocate(work, out, ...)``."""
    if moves is None:
        return  # _relocate restored it already
    v = work.view
    by_id = {r.spec.id: r for r in out}
    for m in moves:
        r = by_id[m.job_id]
        after = RunningJob(r.spec, v.index[m.node_to], m.gpu_indices_to, r.gpu_share, 0.0)
        v.release(allocation_of(after, v))
    for r in out:
        v.allocate(allocation_of(r, v))


def _order_key(now: float, cfg: PolicyConfig) -> Callable[[RunningJob], tuple]:
    """Which jobs move first: lowest priority, then least lost work, then id (deterministic)."""
    return lambda r: (r.spec.priority, lost_work_s(r, now, cfg), r.spec.id)


def _candidates(
    work: _Work, spec: JobSpec, nodes: np.ndarray, movable: Callable, cfg: PolicyConfig
) -> list[int]:
    """The nodes worth clearing for ``spec``, most promising first: those with enough GPUs
    that could come free (free, or held only by movable jobs that fit elsewhere now), ordered
    by the share already free on the GPUs that could serve it (fewer moves)."""
    v = work.view
    where: dict[tuple, np.ndarray] = {}  # a moved job's shape -> nodes it fits on now

    def placeable(r: RunningJob) -> bool:
        key = shape_key(r.spec)
        if key not in where:
            where[key] = fits(r.spec, v, cfg)
        m = where[key]
        return int(m.sum()) - int(m[r.node_index]) > 0

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


def _plan_one(work: _Work, job: PendingJob, ctx: tuple, budget: int) -> _Plan | None:
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
    work = _Work(view, running)
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
            v.allocate(allocation_of(_holding(spec, v, n), v))  # it holds its place in the copy
            continue
        budget = max_moves - len(out)
        if budget <= 0 or v.gpu_free.sum() < float(spec.gpus) - EPS:
            continue  # not enough free in total: moving jobs cannot make room
        plan = _plan_one(work, job, (now, cfg, may_move, spec.id), budget)
        if plan is None or not plan.moves:
            continue
        by_id = {r.spec.id: r for rs in work.on_node.values() for r in rs}
        for m in plan.moves:
            work.move(by_id[m.job_id], v.index[m.node_to], m.gpu_indices_to)
        v.allocate(allocation_of(_holding(spec, v, plan.target), v))
        out.extend(plan.moves)
        moved.update(m.job_id for m in plan.moves)
    return out
