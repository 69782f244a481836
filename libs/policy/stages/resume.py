"""Resume: where a moved job can start again within its bound (the definitions).

A move is safe only when every job it stops can resume somewhere else before its resume
deadline (``PreemptConfig.resume_bound_s``): free now, or on a node where running work is
expected to end within the bound. ``whole_free_within`` is that room per node, and
``resume_rooms`` hands each victim its own share of it (so two victims never count the same
GPUs). Every rule that moves jobs reads these: priority protection (``stages.preempt``),
burst capacity (``stages.burst``), the defragmenter and the thermal guard's migrations.
A rule may also ask that a victim resume no slower than it ran (``no_slower``: priority
protection, short-wait and the burst rule, whose victims would otherwise finish a long job on
a slow GPU, or be held off it by the slow-GPU guard past the bound). ``fits_after_release``
and ``room_placement`` are the other side of a move: the job it is for, on the node it clears.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from libs.policy.backfill import fits_slots
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.filters import static_mask
from libs.policy.scores import CLASS_INDEX
from libs.policy.stages import share as SH
from libs.policy.stages.filter import frac_slot_ok, is_fractional, whole_gpus
from libs.policy.stages.heat import heat_averse
from libs.policy.types import Placement, RunningJob
from proto.jobs import JobSpec

# A running job a plan releases, and how: (job, shrink_to), 0 = stopped whole
# (``stages.preempt.Victim``).
Release = tuple[RunningJob, int]


def gpus_held(job: RunningJob) -> float:
    return job.gpu_share * len(job.gpu_indices)


def static_ok(spec: JobSpec, view: ClusterView) -> np.ndarray:
    """Nodes whose shape could ever hold ``spec`` (``filters.static_mask``: the filter stage's
    static rules, memoised per request shape), as a copy the caller may change."""
    return static_mask(spec, view).copy()


def whole_free_within(
    view: ClusterView, running: Iterable[RunningJob], now: float, bound_s: float
) -> np.ndarray:
    """float[N]: whole GPUs each node has free now, plus those held by running jobs expected
    to end within ``bound_s`` (``RunningJob.expected_end``; a negative bound: none, free now
    only, ``PreemptConfig.resume_counts_ends``): the room a moved job could resume in before
    its deadline. Host memory and CPUs are checked by ``resume_rooms``, free now."""
    soon = view.whole_free.astype(float)
    if bound_s < 0:
        return soon
    horizon = now + bound_s
    for r in running:
        if r.expected_end <= horizon and r.gpu_share >= 1.0 - EPS:
            soon[r.node_index] += len(r.gpu_indices)
    return soon


def no_slower(job: RunningJob, view: ClusterView, speed: np.ndarray) -> np.ndarray:
    """bool[N]: nodes whose GPU model runs ``job``'s class at least as fast as the node it
    runs on (``speed``: float[M, C], ``scores.ModelTables.speed`` of the view's models)."""
    c = CLASS_INDEX.get(job.spec.workload_class, CLASS_INDEX["other"])
    per_model = speed[:, c]
    return per_model[view.model_idx] >= per_model[view.model_idx[job.node_index]] - EPS


def resume_rooms(
    victims: Sequence[RunningJob],
    view: ClusterView,
    soon_free: np.ndarray,
    cfg: PolicyConfig,
    *,
    exclude: int | None = None,
    avoid: np.ndarray | None = None,
    speed: np.ndarray | None = None,
    wake: np.ndarray | None = None,
) -> dict[str, int] | None:
    """Where each of ``victims`` starts again (job id -> node index), so that all of them can
    resume within the bound if moved now; None when one cannot. Never the node a victim leaves
    nor ``exclude`` (the node being cleared), nor the nodes ``avoid`` marks (bool[N]). Each
    victim, widest first, takes its room from
    ``soon_free`` (``whole_free_within``), best fit, so two victims never count the same GPUs;
    a fractional one needs a GPU slot with its share free now, or a whole GPU. A room also
    needs the victim's host memory and CPUs free now (not counted from expected ends: those
    are estimates, as ``resume_counts_ends`` says of GPUs). The scheduler holds these rooms
    for the victims while they save (``core.Scheduler``'s room holds).
    With ``speed`` (float[M, C]), each victim's room is ``no_slower`` than where it runs.
    ``wake`` (bool[N]): nodes held only because they sleep or boot that may be rooms too (the
    victim resumes there once the node is up, one boot inside the bound: ``stages.boot``)."""
    soon = soon_free.copy()
    # host memory and CPUs free now (a room needs them too: on the seed cluster's T4 nodes,
    # 64 GB of host memory ran out while GPUs were still free, and such a "room" never took
    # its victim back; traced on full Philly, six resumes of 5,440-37,638 s)
    host, cpus = view.host_mem_free_gb.astype(float), view.cpus_free.astype(float)
    avail = ~view.cordoned if wake is None else ~view.cordoned | wake
    avail &= ~(view.temp_c >= cfg.thermal_max_c)
    if exclude is not None:
        avail[exclude] = False
    if avoid is not None:
        avail &= ~avoid
    rooms: dict[str, int] = {}
    for v in sorted(victims, key=lambda r: (-gpus_held(r), r.spec.id)):
        spec = v.spec
        ok = avail & static_ok(spec, view)
        ok &= (host >= spec.host_mem_gb - EPS) & (cpus >= spec.cpus - EPS)
        if speed is not None:
            ok &= no_slower(v, view, speed)
        ok[v.node_index] = False
        i = -1
        if is_fractional(spec):  # a GPU slot with its share free, else a whole GPU
            slot = np.flatnonzero(ok & frac_slot_ok(spec, view).any(axis=1))
            i = int(slot[0]) if len(slot) else -1
        if i < 0:
            need = 1.0 if is_fractional(spec) else float(whole_gpus(spec))
            hit = np.flatnonzero(ok & (soon >= need - EPS))
            if not len(hit):
                return None
            if view.heat_risky[hit].any() and heat_averse(spec, cfg):  # stages.heat: cool first
                cool = hit[~view.heat_risky[hit]]
                hit = cool if len(cool) else hit
            i = int(hit[np.argmin(soon[hit])])  # best fit: keep big holes for big jobs
            soon[i] -= need
        host[i] -= spec.host_mem_gb
        cpus[i] -= spec.cpus
        rooms[spec.id] = i
    return rooms


def movable_gpus(movers: Mapping[int, Sequence[RunningJob]], n_nodes: int) -> np.ndarray:
    """float[N]: the GPUs ``movers`` hold per node (a node's bound on what a plan frees)."""
    movable = np.zeros(n_nodes)
    for i, rs in movers.items():
        movable[i] = sum(gpus_held(r) for r in rs)
    return movable


def fits_after_release(
    spec: JobSpec, view: ClusterView, i: int, released: Sequence[RunningJob | Release]
) -> bool:
    """Would ``spec`` fit on node ``i`` once ``released`` (jobs on that node) stopped, or shrank
    (a ``(job, shrink_to)`` pair: it keeps its first ``shrink_to`` GPUs, its host memory and
    CPUs)? Only the node's free resources are considered (the static rules are the caller's)."""
    g = int(view.gpu_total[i])
    free = view.gpu_free[i, :g].tolist()
    mem = view.gpu_mem_free_gb[i, :g].tolist()
    host = float(view.host_mem_free_gb[i])
    cpus = float(view.cpus_free[i])
    for item in released:
        r, keep = item if isinstance(item, tuple) else (item, 0)
        for j in r.gpu_indices[keep:]:
            free[j] += r.gpu_share
            mem[j] += r.spec.gpu_mem_gb
        if not keep:
            host += r.spec.host_mem_gb
            cpus += r.spec.cpus
    return fits_slots(spec, free, mem, host, cpus)


def room_placement(
    spec: JobSpec, view: ClusterView, i: int, cfg: PolicyConfig | None = None
) -> Placement | None:
    """Where a job that moves made room for starts: on node ``i``, the node they cleared (held
    for it meanwhile, ``core.Scheduler``'s room hold, so no other job takes the room first).
    A gang takes the lowest-numbered whole free GPUs with its memory, as ``placement.place``
    does; a fraction the best-fit GPU. None while it does not fit there yet (the moved jobs'
    checkpoints are still being saved)."""
    if not static_mask(spec, view)[i] or not fits_after_release(spec, view, i, ()):
        return None
    free, mem = view.gpu_free[i], view.gpu_mem_free_gb[i]
    slots = view.gpu_exists[i] & (mem >= spec.gpu_mem_gb - EPS)
    if is_fractional(spec):
        free = free if cfg is None else SH.free_for(spec, view, cfg)[i]  # stages.share
        ok = np.flatnonzero(slots & (free >= spec.gpus - EPS))
        if len(ok) == 0:
            return None
        g = int(ok[np.argmin(free[ok])])
        return Placement(i, view.node_ids[i], (g,), float(spec.gpus), 0.0, {})
    ok = np.flatnonzero(slots & (free >= 1.0 - EPS))
    k = whole_gpus(spec)
    return Placement(i, view.node_ids[i], tuple(int(g) for g in ok[:k]), 1.0, 0.0, {})
