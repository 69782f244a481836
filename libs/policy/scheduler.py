"""One scheduling pass, shared by the live placer and the simulator: rank, place in rank order,
protect the blocked head job with a reservation (EASY backfill), stop when nothing more fits.

The view passed in is UPDATED IN PLACE: every assignment in ``CycleResult.assignments`` has
already been allocated on it (pass ``view.copy()`` for a dry run).

Cheap when the queue is long and the cluster full: a pass stops as soon as no GPU share is free,
jobs whose request exceeds the largest free block are refused with scalar checks (no numpy), a
request shape that failed once in a pass is not tried again (the pass only takes resources, so
it cannot fit later in the same pass), backfill looks at most ``cfg.backfill_depth`` jobs below
the head, and the reservation is only computed when a backfill decision needs it (or when
``want_reservation``). When no pending request fits the largest free block at all, the pass
returns at once without ranking (``CycleResult.rank`` is None, every job waits on "Resources").

For long replays keep a ``PendingQueue`` (libs.policy.queue) and a ``RunningSet``
(libs.policy.backfill) alive across passes and pass ``reasons=False``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from libs.policy import backfill as B
from libs.policy import filters as F
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.placement import PlaceContext, place, to_allocation
from libs.policy.priority import rank_arrays, regime
from libs.policy.profiles import ProfileTable
from libs.policy.queue import QueueArrays
from libs.policy.scores import SizeMix
from libs.policy.types import (
    CycleResult,
    PendingJob,
    Placement,
    Refusal,
    Reservation,
    RunningJob,
)


def _shape(spec) -> tuple:
    return (spec.gpus, spec.gpu_mem_gb, spec.host_mem_gb, spec.cpus, spec.constraints)


def schedule(
    pending: Sequence[PendingJob],
    view: ClusterView,
    running: Sequence[RunningJob] | B.RunningSet,
    *,
    now: float,
    tenant_usage: Mapping[str, np.ndarray | float],
    profiles: ProfileTable,
    cfg: PolicyConfig,
    want_reservation: bool = False,
    reasons: bool = True,
) -> CycleResult:
    """Start what can start now. ``running`` feeds the reservation (expected ends).

    ``reasons=False`` skips filling ``waiting`` for jobs the pass never looked at (the simulator
    does not need them); jobs that were tried always get their reason.
    """
    load = view.load()
    if not pending:
        return CycleResult([], None, {}, regime(load, cfg))
    q = QueueArrays.from_jobs(pending)
    max_whole = int(view.whole_free.max()) if len(view.node_ids) else 0
    max_share = float(view.gpu_free.max()) if view.gpu_free.size else 0.0
    frac = q.gpus < 1.0 - EPS
    fits_somewhere = (frac & (q.gpus <= max_share + EPS)).any() or (
        ~frac & (q.gpus <= max_whole + EPS)
    ).any()
    if not fits_somewhere and not want_reservation:
        # no request fits in the largest free block: nothing can start, skip ranking
        waiting = {p.spec.id: "Resources" for p in pending} if reasons else {}
        return CycleResult([], None, waiting, regime(load, cfg), None)
    rr = rank_arrays(
        q,
        now=now,
        load=load,
        tenant_usage=tenant_usage,
        capacity=view,
        cfg=cfg,
        profiles=profiles,
    )
    assignments: list[tuple[PendingJob, Placement]] = []
    waiting: dict[str, str] = {}
    mix = SizeMix.from_requests(q.gpus, SizeMix.of(cfg.size_mix))
    ctx: PlaceContext | None = None
    failed: dict[tuple, str] = {}
    can_ever: dict[tuple, bool] = {}
    head: PendingJob | None = None  # the blocked job backfill protects
    reservation: Reservation | None = None
    rel: B.RunningSet | None = running if isinstance(running, B.RunningSet) else None
    rel_owned = False  # True once we copied ``running`` into our own RunningSet
    started: list[RunningJob] = []
    behind_head = 0
    reserved_tried = False
    order = rr.order
    stop_at = len(order)
    for pos, i in enumerate(order):
        job = pending[int(i)]
        spec = job.spec
        if max_share < EPS or len(assignments) >= cfg.max_places_per_pass:
            stop_at = pos
            break
        if head is not None:
            if not cfg.backfill:
                stop_at = pos
                break
            behind_head += 1
            if behind_head > cfg.backfill_depth:
                stop_at = pos
                break
        key = _shape(spec)
        why = failed.get(key)
        if why is None and (
            spec.gpus > max_share + EPS if F.is_fractional(spec) else F.whole_gpus(spec) > max_whole
        ):
            why = "Resources"  # scalar pre-check: larger than any free block
            ever = can_ever.get(key)
            if ever is None:
                ever = can_ever[key] = bool(F.static_mask(spec, view).any())
            if not ever:
                why = None  # let place() report the precise never-fits reason
        if why is not None:
            waiting[spec.id] = why
            if head is None and why == "Resources":
                head = job
            continue
        if ctx is None:
            ctx = PlaceContext.build(view, profiles, cfg, mix)
        if head is not None and reservation is None and not reserved_tried:
            reserved_tried = True  # computed only now that a job behind the head may start
            rel, rel_owned = _running_set(rel, rel_owned, running, started)
            reservation = B.reserve(head.spec.id, head.spec, view, rel, now=now, cfg=cfg)
        mask = None
        if reservation is not None:
            mask = np.ones(len(view.node_ids), dtype=bool)
            mask[reservation.node_index] = False
        res = place(spec, view, profiles, cfg, ctx=ctx, mask=mask)
        if isinstance(res, Refusal) and reservation is not None and res.reason == "Reserved":
            res = _try_reserved_node(job, head, reservation, view, profiles, cfg, ctx, rel, now)
        if isinstance(res, Placement):
            alloc = to_allocation(spec, res, now, job.attempt)
            view.allocate(alloc)
            assignments.append((job, res))
            end = now + profiles.runtime_s(spec, view.models[view.model_idx[res.node_index]]) * (
                1.0 - job.progress
            )
            rj = RunningJob(spec, res.node_index, res.gpu_indices, res.gpu_share, end)
            started.append(rj)
            if rel is not None and rel_owned:
                rel.add(rj)
            max_whole = int(view.whole_free.max())
            max_share = float(view.gpu_free.max())
            continue
        waiting[spec.id] = res.reason
        if res.reason != "Reserved":
            failed[key] = res.reason
        if head is None and res.reason == "Resources":
            head = job
    if head is not None and reservation is None and want_reservation:
        rel, rel_owned = _running_set(rel, rel_owned, running, started)
        reservation = B.reserve(head.spec.id, head.spec, view, rel, now=now, cfg=cfg)
    if reasons:
        for i in order[stop_at:]:
            sid = pending[int(i)].spec.id
            if sid not in waiting:
                waiting[sid] = "Priority" if head is not None else "Resources"
    return CycleResult(assignments, reservation, waiting, rr.regime, rr)


def _running_set(
    rel: B.RunningSet | None,
    owned: bool,
    running: Sequence[RunningJob] | B.RunningSet,
    started: list[RunningJob],
) -> tuple[B.RunningSet, bool]:
    """The running jobs plus those started in this pass, without mutating the caller's set."""
    if owned and rel is not None:
        return rel, True
    if isinstance(running, B.RunningSet):
        return B.RunningSet(started, base=running), True
    return B.RunningSet([*running, *started]), True


def _try_reserved_node(
    job: PendingJob,
    head: PendingJob | None,
    reservation: Reservation,
    view: ClusterView,
    profiles: ProfileTable,
    cfg: PolicyConfig,
    ctx: PlaceContext,
    rel: B.RunningSet | None,
    now: float,
) -> Placement | Refusal:
    """Backfill onto the reserved node only if it cannot delay the head job."""
    n = reservation.node_index
    only = np.zeros(len(view.node_ids), dtype=bool)
    only[n] = True
    res = place(job.spec, view, profiles, cfg, ctx=ctx, mask=only)
    if not isinstance(res, Placement) or head is None:
        return Refusal("Reserved")
    runtime = profiles.runtime_s(job.spec, view.models[view.model_idx[n]]) * (1.0 - job.progress)
    cand = B.Release(
        now + runtime,
        res.gpu_indices,
        res.gpu_share,
        job.spec.gpu_mem_gb,
        job.spec.host_mem_gb,
        job.spec.cpus,
    )
    if B.delays(
        head.spec, reservation, view, rel.get(n, now) if rel is not None else [], cand, now=now
    ):
        return Refusal("Reserved")
    return res
