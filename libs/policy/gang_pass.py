"""The pass's gang rows (``stages.gang`` is the definition): a gang is ranked with every other
job and walked in rank order; at its row it starts on several nodes (``try_gang``) or waits
on "Resources" (or "Reserved", when only reserved nodes could hold it) and, being blocked, may
be the job backfill protects: its reservation holds every node it would start on
(``reserve``), each a ``Reservation`` of its own, so the walk keeps later jobs off all of them
(``Pass.unreserved``). A job below may still go on a gang's reserved node when it ends before
the gang's start (``backfill_ok``: the plain EASY rule, since a gang's start needs whole nodes
and the partial-fit rule of ``backfill.delays`` is per node).

Also the booking helpers the scheduler and the pass share: a gang runs in the ``RunningSet``
as one ``RunningJob`` per part (``part_jobs``), each under its own id, so reservations see the
GPUs each node gets back and when. The slow-GPU guard does not hold gangs (they wait for
whole nodes already); the moves never stop one (``stages.preempt.protection``).
"""

from __future__ import annotations

import numpy as np

from libs.policy import backfill as B
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.fast.gang_offers import offers_now
from libs.policy.fast.reservations import running_set
from libs.policy.fast.shapes import per_shape
from libs.policy.placement import PlaceContext, place, to_allocation
from libs.policy.profiles import ProfileTable
from libs.policy.stages import gang as G
from libs.policy.stages import heat as H
from libs.policy.stages.filter import shape_key, whole_gpus
from libs.policy.types import PendingJob, Placement, Refusal, Reservation, RunningJob
from proto.jobs import JobSpec, with_changes
from proto.ledger import Allocation, Part, node_allocations


def gang_shapes(view: ClusterView, shape_specs: list) -> np.ndarray:
    """bool per request shape: a gang (``stages.gang.is_gang``)."""
    return np.array([G.is_gang(sp, view) for sp in shape_specs], dtype=bool)


def may_start(pending, q, view: ClusterView) -> bool:
    """A cheap necessary condition for some queued gang to start now: it asks at most the
    whole free GPUs of the cluster (the pass's own early exit, ``scheduler._fits_somewhere``,
    reads one node's largest free block, which no gang fits)."""
    total = int(view.whole_free.sum())
    if q is None:  # a PendingQueue: its shapes, with the gang flag memoised per shape list
        shape_of, _, specs = pending.shapes()
        if not len(specs):
            return False
        gangs = per_shape(view, "gang", specs, lambda sp: gang_shapes(view, sp))
        if not gangs.any():
            return False
        rows = gangs[shape_of]
        asks = per_shape(view, "gang-asks", specs, _asks)[shape_of]
        return bool((rows & (asks <= total)).any())
    return any(G.is_gang(p.spec, view) and round(p.spec.gpus) <= total for p in pending)


def _asks(shape_specs: list) -> np.ndarray:
    """int per request shape: the whole GPUs it asks (memoised per shape list: ``may_start``
    asks every pass)."""
    return np.array([round(sp.gpus) for sp in shape_specs], dtype=np.int64)


def switches(view: ClusterView) -> np.ndarray:
    """``stages.gang.switches``, memoised on the view's shape memo (node specs never change)."""
    hit = view.shape_memo.per_shape.get(("gang-switches",))
    if hit is None:
        hit = view.shape_memo.per_shape[("gang-switches",)] = G.switches(view)
    return hit


def runtimes(spec: JobSpec, view: ClusterView, profiles: ProfileTable) -> list[float]:
    return [profiles.runtime_s(spec, m) for m in view.models]


def gang_place(
    spec: JobSpec,
    view: ClusterView,
    profiles: ProfileTable,
    cfg: PolicyConfig,
    mask: np.ndarray | None = None,
) -> G.GangPlacement | None:
    """Where the gang starts now (cordoned, too hot and ``mask``-ed nodes left out), or None.

    The offers over the available nodes are the view's memo (``fast.gang_offers``, refreshed
    where nodes changed); a mask only lowers offers, so a shape the available nodes cannot
    hold is answered from the per-model sums alone, the usual answer on a busy cluster."""
    now = offers_now(spec, view, cfg)
    k = whole_gpus(spec)
    if not now.can_hold(k):
        return None
    offer = now.offer.copy() if mask is None else np.where(mask, now.offer, 0)
    if mask is not None and not G.can_hold(k, offer, view):
        return None
    sw = switches(view)
    plan = G.choose(k, offer, view, sw, runtimes(spec, view, profiles))
    return G.placement_of(plan, view, sw) if plan else None


def fits_now(spec: JobSpec, view: ClusterView, cfg: PolicyConfig) -> bool:
    """``gang_place(...) is not None`` on every node, without the choice (the memo's sums)."""
    return offers_now(spec, view, cfg).can_hold(whole_gpus(spec))


def ever_fits(spec: JobSpec, view: ClusterView) -> bool:
    """``stages.gang.ever_fits``, memoised per shape on the view's shape memo (it reads node
    specs only, which never change in a view)."""
    key = shape_key(spec)
    hit = view.shape_memo.gang_ever_fits.get(key)
    if hit is None:
        hit = view.shape_memo.gang_ever_fits[key] = G.ever_fits(spec, view)
    return hit


def gang_allocation(spec: JobSpec, res: G.GangPlacement, now: float, attempt: int) -> Allocation:
    """The ledger record of a gang placement: one record, every part (``proto.ledger``)."""
    host, cpu = G.per_gpu(spec)
    parts = tuple(
        Part(
            node=p.node_id,
            gpu_indices=p.gpu_indices,
            host_mem_gb=host * len(p.gpu_indices),
            cpus=cpu * len(p.gpu_indices),
        )
        for p in res.parts
    )
    first = parts[0]
    return Allocation(
        job_id=spec.id,
        node=first.node,
        gpu_indices=first.gpu_indices,
        gpu_share=1.0,
        gpu_mem_gb=spec.gpu_mem_gb,
        host_mem_gb=first.host_mem_gb,
        cpus=first.cpus,
        time=now,
        attempt=attempt,
        spec=spec,
        parts=parts,
    )


def allocation_of(
    spec: JobSpec, res: Placement, now: float, attempt: int
) -> tuple[Allocation, list[int]]:
    """A pass's start: its ledger record and the view rows it takes (a gang: all its nodes)."""
    if isinstance(res, G.GangPlacement):
        return gang_allocation(spec, res, now, attempt), [p.node_index for p in res.parts]
    return to_allocation(spec, res, now, attempt), [res.node_index]


def running_of(
    alloc: Allocation, spec: JobSpec, res: Placement, view: ClusterView, end: float
) -> list[RunningJob]:
    """What a pass's start adds to the running set (a gang: ``part_jobs``)."""
    if alloc.parts:
        return part_jobs(alloc, spec, view, end)
    return [RunningJob(spec, res.node_index, res.gpu_indices, res.gpu_share, end)]


def part_id(job_id: str, node: str) -> str:
    """A gang part's id in the ``RunningSet`` (one entry per node)."""
    return f"{job_id}{G.PART_SEP}{node}"


def part_jobs(
    alloc: Allocation, spec: JobSpec, view: ClusterView, expected_end: float
) -> list[RunningJob]:
    """One ``RunningJob`` per part of a gang's allocation, each its node's host memory and
    CPUs (what ``backfill.Release`` gives back there) under ``part_id``."""
    out = []
    for a in node_allocations(alloc):
        s = with_changes(spec, id=part_id(spec.id, a.node), host_mem_gb=a.host_mem_gb, cpus=a.cpus)
        out.append(RunningJob(s, view.index[a.node], a.gpu_indices, 1.0, expected_end))
    return out


def try_gang(p, i: int, job: PendingJob, key: tuple) -> None:
    """The pass's step for a gang row (``step.Pass.try_row``): start it now on the nodes no
    reservation holds, or record why it waits."""
    view, spec = p.view, job.spec
    mask = p.unreserved()
    res = None
    if p.cool is not None and H.heat_averse(spec, p.cfg):  # stages.heat: never moved, so
        cool = p.cool if mask is None else mask & p.cool  # nodes that did not run hot first
        res = gang_place(spec, view, p.profiles, p.cfg, cool)
        if (
            res is None
            and H.holds_off_risky(job, p.heat_waited(spec.id), p.cfg)
            and gang_place(spec, view, p.profiles, p.cfg, mask) is not None
        ):
            p.waiting[spec.id] = H.HOT_NODE  # it waits a while for nodes that did not run hot
            return
    if res is None:
        res = gang_place(spec, view, p.profiles, p.cfg, mask)
    if res is not None:
        p._start(job, res)
        return
    if mask is not None and fits_now(spec, view, p.cfg):
        why = "Reserved"  # it would start on nodes held for a blocked job
    elif ever_fits(spec, view):
        why = "Resources"
    else:
        why = "GpuCount"
    p._refused(i, job, key, Refusal(why), False)


def free_at(view: ClusterView, rel: B.RunningSet, now: float) -> np.ndarray:
    """float[N]: when each node is empty (``stages.gang.node_free_at``: its last expected end,
    now if that is past or it is empty), from the running set's last ends, which it keeps as
    jobs come and go (a walk over every node's jobs per blocked gang was a tenth of a Helios
    replay; tested equal to the definition, ``tests/policy/test_gangs.py``)."""
    return np.maximum(rel.last_end_array(len(view.node_ids)), now)


def reserve_head(p) -> None:
    """``step.Pass.reserve_head`` for a blocked gang: its first node is the head's
    reservation, the others go with the extra reservations (so every one is kept off)."""
    p.rel, p.rel_owned = running_set(p.rel, p.rel_owned, p.running, p.started)
    rs = reserve(p.head, p.view, p.rel, [], p.now, p.cfg)
    p.reservation = rs[0] if rs else None
    p.extras += [(p.head, r) for r in rs[1:]]


def reserve(
    job: PendingJob, view: ClusterView, rel: B.RunningSet, taken: list[int], now: float, cfg
) -> list[Reservation]:
    """The blocked gang's reservation (``stages.gang.reservation``) on nodes no earlier
    reservation holds (``taken``)."""
    usable = ~view.cordoned.copy()
    usable[taken] = False
    return G.reservation(job.spec, view, usable, free_at(view, rel, now))


def backfill_ok(
    job: PendingJob,
    r: Reservation,
    view: ClusterView,
    profiles: ProfileTable,
    cfg: PolicyConfig,
    ctx: PlaceContext,
    now: float,
) -> Placement | Refusal:
    """``job`` on a gang's reserved node ``r.node_index``, when it ends before the gang's start."""
    n = r.node_index
    only = np.zeros(len(view.node_ids), dtype=bool)
    only[n] = True
    res = place(job.spec, view, profiles, cfg, ctx=ctx, mask=only)
    if not isinstance(res, Placement):
        return Refusal("Reserved")
    runtime = profiles.runtime_s(job.spec, view.models[view.model_idx[n]]) * (1.0 - job.progress)
    return res if now + runtime <= r.start + EPS else Refusal("Reserved")
