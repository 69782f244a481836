"""Where a moved job can go, for the defragmenter's plan (``stages.defrag``): the fit of a job
now (every rule of ``stages.filter``), its GPU slots, the best-fit destination of a moved job,
the room that moving CPU-only jobs makes, and the copy of the view a plan works on.

The second level (``cpu_room``): a moved job that fits nowhere may still go to a node where only
CPUs or host memory are short, when movable CPU-only jobs there can leave for other nodes now
(they need no GPU room, only CPUs, which GPU-poor nodes often have spare). One level only: a
plan stays a few moves, and its cost a few passes over the nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.stages import share as SH
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
from libs.policy.types import RunningJob
from proto.jobs import JobSpec
from proto.ledger import Allocation

Pair = tuple[RunningJob, RunningJob]  # a job before and after a tentative move


def fits(spec: JobSpec, view: ClusterView, cfg: PolicyConfig) -> np.ndarray:
    """bool[N]: nodes that could take ``spec`` now (every filter rule of ``stages.filter``)."""
    ok = f_free_gpus(spec, view) & f_host_memory(spec, view) & f_cpus(spec, view)
    ok &= f_cordon(spec, view) & f_thermal(spec, view, cfg)
    for _, rule in STATIC:
        ok &= rule(spec, view)
    return ok


def gpus_fit(spec: JobSpec, view: ClusterView, cfg: PolicyConfig) -> np.ndarray:
    """bool[N]: nodes where ``spec``'s GPUs fit now, whatever their free CPUs and memory."""
    ok = f_free_gpus(spec, view) & f_cordon(spec, view) & f_thermal(spec, view, cfg)
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


class Work:
    """The copy of the view a plan is worked out on, and who runs where in it."""

    def __init__(self, view: ClusterView, running: Sequence[RunningJob], cfg: PolicyConfig):
        self.view = view.copy()
        self.cfg = cfg
        self.on_node: dict[int, list[RunningJob]] = {}
        for r in running:
            self.on_node.setdefault(r.node_index, []).append(r)
        self._where: tuple[int, dict[tuple, np.ndarray]] = (-1, {})

    def placeable(self, r: RunningJob) -> bool:
        """Whether ``r`` might move now: its GPUs fit on some node other than its own (CPUs and
        memory free there, or to be made free by ``cpu_room``; ``_relocate`` checks which).
        Per shape, until the view changes."""
        gen, where = self._where
        if gen != self.view.gen:
            where = {}
            self._where = (self.view.gen, where)
        key = shape_key(r.spec)
        m = where.get(key)
        if m is None:
            m = where[key] = gpus_fit(r.spec, self.view, self.cfg)
        return int(m.sum()) - int(m[r.node_index]) > 0

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


def holding(spec: JobSpec, view: ClusterView, node: int) -> RunningJob:
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
    job: RunningJob, view: ClusterView, cfg: PolicyConfig, avoid: Sequence[int]
) -> tuple[int, tuple[int, ...]] | None:
    """Where a moved job goes now (no node of ``avoid``): best fit, so it fills holes, not
    free nodes."""
    ok = fits(job.spec, view, cfg)
    ok[list(avoid)] = False
    cand = np.flatnonzero(ok)
    if len(cand) == 0:
        return None
    if job.spec.gpus <= 0:  # CPU-only: where its CPUs strand the fewest free GPUs
        n = int(cand[np.lexsort((view.cpus_free[cand], view.gpu_free[cand].sum(axis=1)))[0]])
    elif is_fractional(job.spec):  # best fit among the GPUs it may share (stages.share)
        gfree = SH.free_for(job.spec, view, cfg)[cand]
        roomy = (gfree >= job.gpu_share - EPS) & (
            view.gpu_mem_free_gb[cand] >= job.spec.gpu_mem_gb - EPS
        )
        free = np.where(roomy, gfree, 2.0)
        if not roomy.any():
            return None
        k = int(np.argmin(free.min(axis=1)))
        return int(cand[k]), (int(np.argmin(free[k])),)
    else:
        n = int(cand[np.argmin(view.whole_free[cand])])
    return n, slots_for(job.spec, view, n, job.gpu_share)


def move_in_view(view: ClusterView, before: RunningJob, node: int, gpus: tuple[int, ...]) -> Pair:
    """Move ``before`` to ``gpus`` of ``node`` in ``view``; (before, after)."""
    after = RunningJob(before.spec, node, gpus, before.gpu_share, before.expected_end)
    view.release(allocation_of(before, view))
    view.allocate(allocation_of(after, view))
    return before, after


def undo(view: ClusterView, done: Sequence[Pair]) -> None:
    """Undo ``move_in_view`` pairs, last first."""
    for before, after in reversed(done):
        view.release(allocation_of(after, view))
        view.allocate(allocation_of(before, view))


def cpu_room(
    job: RunningJob, work: Work, avoid: Sequence[int], movable: Callable, taken: set[str]
) -> tuple[int, tuple[int, ...], list[Pair]] | None:
    """A node for ``job`` (none of ``avoid``) where its GPUs fit and CPUs or memory come free
    when movable CPU-only jobs there (none of ``taken``) leave for other nodes now: (node,
    slots, the CPU-only jobs' moves, applied to ``work.view``), or None (view unchanged)."""
    v, cfg, spec = work.view, work.cfg, job.spec
    ok = gpus_fit(spec, v, cfg)
    ok[list(avoid)] = False
    ok &= (v.cpus_free < spec.cpus - EPS) | (v.host_mem_free_gb < spec.host_mem_gb - EPS)
    for d in np.flatnonzero(ok)[: cfg.defrag.candidate_nodes].tolist():
        cpu_short = spec.cpus - float(v.cpus_free[d])
        mem_short = spec.host_mem_gb - float(v.host_mem_free_gb[d])
        leave: list[RunningJob] = []
        for r in sorted(work.on_node.get(d, ()), key=lambda r: (-r.spec.cpus, r.spec.id)):
            if cpu_short <= EPS and mem_short <= EPS:
                break
            if r.spec.gpus <= 0 and r.spec.id not in taken and movable(r):
                leave.append(r)
                cpu_short -= r.spec.cpus
                mem_short -= r.spec.host_mem_gb
        if cpu_short > EPS or mem_short > EPS:
            continue
        done: list[Pair] = []
        for r in leave:
            dest = destination(r, v, cfg, [*avoid, d])
            if dest is None:
                break
            done.append(move_in_view(v, r, *dest))
        if len(done) == len(leave) and fits(spec, v, cfg)[d]:
            return d, slots_for(spec, v, d, job.gpu_share), done
        undo(v, done)
    return None
