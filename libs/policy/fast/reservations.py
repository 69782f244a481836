"""Reserve and backfill: the blocked jobs' reservations (EASY backfill, memoised on the view
across passes) and backfill onto a reserved node only when it cannot delay its job."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from libs.policy import backfill as B
from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.filters import shape_key
from libs.policy.placement import PlaceContext, place
from libs.policy.profiles import ProfileTable
from libs.policy.types import PendingJob, Placement, Refusal, Reservation, RunningJob


def reserve_head(
    head: PendingJob,
    view: ClusterView,
    rel: B.RunningSet | None,
    rel_owned: bool,
    running: Sequence[RunningJob] | B.RunningSet,
    started: list[RunningJob],
    now: float,
    cfg: PolicyConfig,
) -> tuple[Reservation | None, B.RunningSet | None, bool]:
    """``backfill.reserve`` for the head, memoised on the view across passes: the same head and
    shape, no change to the view since (``view.gen``; running jobs only start and end through
    allocate/release) and the same number of running jobs give the same reservation, as long
    as its start is not in the past (an overrun job counts as ending ``now``, and a later
    ``now`` can only move starts that were before it)."""
    n_run = len(running) + len(started)
    key = (head.spec.id, shape_key(head.spec), view.gen, n_run, cfg)
    hit = view.memo.reservation
    if hit is not None and hit[0] == key and (hit[1] is None or hit[1].start >= now):
        return hit[1], rel, rel_owned
    rel, rel_owned = running_set(rel, rel_owned, running, started)
    res = B.reserve(head.spec.id, head.spec, view, rel, now=now, cfg=cfg)
    view.memo.reservation = (key, res)
    return res, rel, rel_owned


def protected(
    head: PendingJob | None,
    reservation: Reservation | None,
    extras: list[tuple[PendingJob, Reservation]],
) -> list[tuple[PendingJob, Reservation]]:
    """Every (blocked job, reservation) of the pass, the head's first."""
    out = [(head, reservation)] if head is not None and reservation is not None else []
    return out + extras


def reserve_extra(
    job: PendingJob,
    view: ClusterView,
    rel: B.RunningSet,
    taken: list[int],
    n_run: int,
    now: float,
    cfg: PolicyConfig,
) -> Reservation | None:
    """``backfill.reserve`` for a blocked job below the head, on a node no earlier
    reservation holds; memoised on the view like the head's (same job, shape, view state,
    running count and taken nodes)."""
    memo = view.memo.reservation_extra
    key = (shape_key(job.spec), view.gen, n_run, tuple(taken), cfg)
    hit = memo.get(job.spec.id)
    if hit is not None and hit[0] == key and (hit[1] is None or hit[1].start >= now):
        return hit[1]
    if len(memo) > 4 * max(1, cfg.reservations):
        memo.clear()  # only the current few blocked jobs matter
    exclude = np.zeros(len(view.node_ids), dtype=bool)
    exclude[taken] = True
    res = B.reserve(job.spec.id, job.spec, view, rel, now=now, cfg=cfg, exclude=exclude)
    memo[job.spec.id] = (key, res)
    return res


def running_set(
    rel: B.RunningSet | None,
    owned: bool,
    running: Sequence[RunningJob] | B.RunningSet,
    started: list[RunningJob],
) -> tuple[B.RunningSet, bool]:
    """The running jobs plus those started in this pass, without mutating the caller's set
    (owned: ours, to add the pass's later starts to). Nothing started yet: the caller's own
    set, not owned, whose per-node lists and first ends are already built."""
    if owned and rel is not None:
        return rel, True
    if isinstance(running, B.RunningSet) and not started:
        return running, False
    if isinstance(running, B.RunningSet):
        return B.RunningSet(started, base=running), True
    return B.RunningSet([*running, *started]), True


def try_reserved_node(
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
