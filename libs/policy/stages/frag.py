"""Fragmentation, FGD's measure as a definition (Weng et al., "Beware of Fragmentation", ATC'23).

Why a measure of its own: a cluster can be far from full and still unable to start the jobs
that arrive, because what is free is in pieces the popular job shapes cannot use. FGD counts,
for a node and one task shape, the free GPU capacity the task could not use:

* the task cannot run on the node at all (GPU model not allowed, too few CPUs or too little host
  memory free, too few whole free GPUs for a k-GPU task, no GPU with its share free for a
  fractional one): every free GPU share of the node is a fragment;
* otherwise, each GPU whose free share is below ``min(task's GPUs, 1)`` is a fragment (its free
  share counts): a 0.3 free on a GPU is a fragment for a 0.5 task, not for a 0.2 one.

A node's expected fragmentation for a target workload (task shapes with their popularity) is
the sum over shapes of popularity x fragmentation; the cluster's is the sum over nodes. FGD
places a task where that expectation grows least (``libs.sim.baselines.fgd``).

The workload is learnt from what arrived (``Workload.learn``): one class per (GPU request,
allowed models), its CPUs and host memory the median of its tasks' (FGD takes the trace's
popular pod shapes; a class per exact CPU figure would multiply the classes for little).
GPU memory is not part of the measure (FGD's is GPU share, CPU and memory only).
Pure numpy: no I/O, no clock, no state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.stages.filter import model_allowed
from proto.jobs import JobSpec


@dataclass(frozen=True, slots=True)
class Workload:
    """Task classes and their popularity: ``gpus`` (< 1 = share of one GPU, 0 = CPU only),
    allowed GPU models (``()`` = any), CPUs and host memory; ``probs`` sums to 1."""

    gpus: np.ndarray  # float[C]
    models: tuple[tuple[str, ...], ...]  # per class
    cpus: np.ndarray  # float[C]
    host_mem_gb: np.ndarray  # float[C]
    probs: np.ndarray  # float[C]

    @classmethod
    def learn(cls, specs: Iterable[JobSpec]) -> Workload:
        """Classes by (GPUs, constraints), weighted by how many arrived; CPUs and memory are
        the class's medians."""
        groups: dict[tuple, list[JobSpec]] = {}
        for s in specs:
            groups.setdefault((float(s.gpus), tuple(s.constraints)), []).append(s)
        if not groups:
            raise ValueError("Workload.learn: no task to learn from")
        keys = sorted(groups, key=lambda k: (-len(groups[k]), k))
        n = np.array([len(groups[k]) for k in keys], dtype=float)
        return cls(
            gpus=np.array([k[0] for k in keys]),
            models=tuple(k[1] for k in keys),
            cpus=np.array([np.median([s.cpus for s in groups[k]]) for k in keys]),
            host_mem_gb=np.array([np.median([s.host_mem_gb for s in groups[k]]) for k in keys]),
            probs=n / n.sum(),
        )

    def as_config(self) -> tuple[tuple[float, tuple[str, ...], float, float, float], ...]:
        """The workload as plain data (``PolicyConfig.frag_workload``): one (GPUs, models,
        CPUs, host memory, probability) row per class."""
        return tuple(
            (float(g), m, float(c), float(h), float(p))
            for g, m, c, h, p in zip(
                self.gpus, self.models, self.cpus, self.host_mem_gb, self.probs, strict=True
            )
        )

    @classmethod
    def of(cls, rows: Sequence[tuple[float, tuple[str, ...], float, float, float]]) -> Workload:
        """The workload of ``as_config`` rows (probabilities normalised)."""
        if not rows:
            raise ValueError("Workload.of: no class")
        p = np.array([r[4] for r in rows], dtype=float)
        if (p < 0).any() or p.sum() <= 0:
            raise ValueError("Workload.of: probabilities must be >= 0 with a positive sum")
        return cls(
            gpus=np.array([r[0] for r in rows], dtype=float),
            models=tuple(tuple(r[1]) for r in rows),
            cpus=np.array([r[2] for r in rows], dtype=float),
            host_mem_gb=np.array([r[3] for r in rows], dtype=float),
            probs=p / p.sum(),
        )

    def allowed(self, view: ClusterView) -> np.ndarray:
        """bool[C, N]: whether each class may run on each node's GPU model."""
        per_model = np.array(
            [[model_allowed(m, model) for model in view.models] for m in self.models], dtype=bool
        ).reshape(len(self.models), len(view.models))
        return per_model[:, view.model_idx]


def node_fragmentation(
    gpu_free: np.ndarray,
    cpus_free: np.ndarray,
    host_free_gb: np.ndarray,
    allowed: np.ndarray,
    work: Workload,
) -> np.ndarray:
    """float[R]: expected fragmentation of R node states for ``work`` (see the module docstring).

    ``gpu_free``: float[R, G] free share of each GPU slot (0 for slots a node does not have);
    ``cpus_free``, ``host_free_gb``: float[R]; ``allowed``: bool[C, R] class x row.
    """
    total = gpu_free.sum(axis=1)  # [R]
    whole = (gpu_free >= 1.0 - EPS).sum(axis=1)  # [R]
    need = np.minimum(work.gpus, 1.0)  # [C]: what one GPU must have free for the class
    small = gpu_free[:, :, None] < need[None, None, :] - EPS  # [R, G, C]
    frag_if_runs = np.where(small, gpu_free[:, :, None], 0.0).sum(axis=1)  # [R, C]
    frac = work.gpus < 1.0 - EPS
    k = np.where(frac, 0, np.round(work.gpus)).astype(np.int64)
    cpu_only = work.gpus <= EPS  # needs no GPU: runs wherever its CPUs and memory are free
    share_ok = (~small & (gpu_free[:, :, None] > EPS)).any(axis=1)  # [R, C]
    gpu_ok = np.where(frac[None, :], share_ok, whole[:, None] >= k[None, :]) | cpu_only[None, :]
    runs = (
        gpu_ok
        & allowed.T
        & (cpus_free[:, None] >= work.cpus[None, :] - EPS)
        & (host_free_gb[:, None] >= work.host_mem_gb[None, :] - EPS)
    )
    per_class = np.where(runs, frag_if_runs, total[:, None])  # [R, C]
    return per_class @ work.probs


def cluster_fragmentation(view: ClusterView, work: Workload) -> float:
    """The cluster's expected fragmentation (GPUs): the sum over its nodes."""
    return float(fragmentation_of_view(view, work).sum())


def fragmentation_of_view(view: ClusterView, work: Workload) -> np.ndarray:
    """float[N]: each node's expected fragmentation for ``work``."""
    return node_fragmentation(
        view.gpu_free, view.cpus_free, view.host_mem_free_gb, work.allowed(view), work
    )


def placements(
    spec: JobSpec, view: ClusterView, fit: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every way to place ``spec`` on the nodes ``fit`` allows: (node per option, GPU slots
    per option as bool[O, G], share). A fractional task has one option per GPU with its share
    free (one per distinct free share on a node: equal GPUs give equal states); a k-GPU task
    one per node (its lowest k free GPUs: whole free GPUs are alike for the measure); a
    CPU-only task one per node, no GPU."""
    nodes = np.flatnonzero(fit)
    g = view.gpu_free.shape[1]
    if spec.gpus <= 0:
        return nodes, np.zeros((len(nodes), g), dtype=bool), 0.0
    free = view.gpu_free[nodes]
    if spec.gpus < 1.0 - EPS:
        ok = free >= spec.gpus - EPS
        # GPUs of a node with the same free share give the same node state: keep the first
        g_idx = np.arange(g)
        same = (free[:, :, None] == free[:, None, :]) & (g_idx[None, :] < g_idx[:, None])[None]
        ok &= ~(same & ok[:, None, :]).any(axis=2)
        rows, cols = np.nonzero(ok)
        slots = np.zeros((len(rows), g), dtype=bool)
        slots[np.arange(len(rows)), cols] = True
        return nodes[rows], slots, float(spec.gpus)
    k = round(spec.gpus)
    whole = free >= 1.0 - EPS
    slots = whole & (np.cumsum(whole, axis=1) <= k)
    return nodes, slots, 1.0


def growth(
    spec: JobSpec, view: ClusterView, fit: np.ndarray, work: Workload, allowed: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node, slots, fragmentation growth) of every option of ``placements``: the node's
    expected fragmentation after the task lands there minus before (FGD's gradient)."""
    nodes, slots, share = placements(spec, view, fit)
    if len(nodes) == 0:
        return nodes, slots, np.zeros(0)
    uniq, inv = np.unique(nodes, return_inverse=True)  # each node's "before" once
    before = node_fragmentation(
        view.gpu_free[uniq],
        view.cpus_free[uniq],
        view.host_mem_free_gb[uniq],
        allowed[:, uniq],
        work,
    )[inv]
    after_free = view.gpu_free[nodes] - slots * share
    cpus = view.cpus_free[nodes] - spec.cpus
    host = view.host_mem_free_gb[nodes] - spec.host_mem_gb
    after = node_fragmentation(after_free, cpus, host, allowed[:, nodes], work)
    return nodes, slots, after - before


def slot_tuple(row: np.ndarray) -> tuple[int, ...]:
    """The GPU slots of one option (``placements``) as indices."""
    return tuple(int(j) for j in np.flatnonzero(row))


def cpu_only_node(view: ClusterView, spec: JobSpec, fit: np.ndarray, work: Workload) -> int:
    """Where a task without GPUs does least harm: among the nodes ``fit`` allows, the least
    growth of fragmentation for ``work`` (its CPUs and memory may strand a node's GPUs), then
    the least free GPU share, then the fewest free CPUs."""
    nodes, _, g = growth(spec, view, fit, work, work.allowed(view))
    key = np.lexsort((view.cpus_free[nodes], view.gpu_free[nodes].sum(axis=1), np.round(g, 9)))
    return int(nodes[key[0]])
