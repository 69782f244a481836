"""Burst capacity: a service's replica that the pass could not place gets room at once (issue 16).

When a service's load crosses its target, the scaler (``stages.scale``) asks for replicas and
the same instant's pass places what fits. Capacity is taken in this order:

1. **Free capacity, free fractions included**: the pass itself. A fractional replica joins a
   partially used GPU wherever the share stage allows it (``stages.share``: every job there
   stays within its slowdown bound), so a free fraction is used before anyone is moved.
2. **Shrinking elastic training jobs** (``stages.shrink``): they give back GPUs and resume at
   once on the rest of their node.
   A fractional replica's plan frees a whole GPU (``whole_probe``): the free fractions left
   are those the share stage refused.
3. **Stopping checkpointable training jobs**: they save, wait again first in line, and must be
   able to resume elsewhere within ``PreemptConfig.resume_bound_s`` (``resume_rooms``), the
   promise every move keeps, on a GPU model no slower for them than the one they leave
   (``stages.resume.no_slower``): a room on a T4 let a job of weeks stopped on an A100 finish
   there at half speed (Philly 500 with the issue-16 service, seed 1: the 9 stopped 1-GPU
   jobs, most resumed on T4s, lost 1,709 h of JCT between them, a quarter of what the service
   cost training). No such room: nobody is stopped and the replica waits.

A waiting replica ranks ahead of training (``service_boost``, ``service_rank_boost``): it never
ends, so it could never backfill below a blocked training job's reservation.

The rule (``burst_plan``, ``BURST_RULE``): for each blocked replica (a queued job with
``spec.service``) in rank order, the plan frees room on ONE node by moving training jobs that
may move (``stages.preempt.protection``: never an inference job, never a job that is neither
checkpointable nor elastic, never one moved or started too recently, never a gang part) and
whose priority is at most the replica's (a service never stops more important work), at most
``max_per_pass`` of them. Unlike priority protection there is no ``min_wait_s`` and no
lost-work trade-off: a latency target is missed from the first second a burst is unanswered,
so waiting would be the miss itself. Among the nodes' plans the one taken is, in order:

* a plan that only shrinks (nothing stopped) over one that stops a job,
* then the lowest highest-priority among its victims,
* then the least work lost (``lost_gpu_s``), then the node's index (deterministic).

Pure: the moves are ``stages.preempt.PriorityPlan`` records with this rule's reason, applied by
both drivers as every move is (``core_moves``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig, PreemptConfig
from libs.policy.filters import static_mask
from libs.policy.stages import preempt as P
from libs.policy.stages.filter import is_fractional, whole_gpus
from libs.policy.stages.shrink import shrink_floor
from libs.policy.types import PendingJob, RunningJob
from proto.jobs import with_changes

BURST_RULE = "burst-capacity"

# (stops some job, highest victim priority, GPU-seconds lost, node index): smaller is better
PlanKey = tuple[bool, int, float, int]


def service_boost(inference: np.ndarray, cfg: PolicyConfig) -> np.ndarray | None:
    """float per queue row (``inference``: the queue's column, 2.0 for a service's replica):
    ``service_rank_boost`` for a replica, 0 for any other job; None when no row is a replica.
    Why: a replica never ends, so it can never backfill below a blocked training job's
    reservation; ranked first, it takes free capacity before the reservation is made, and a
    blocked one is the head the burst rule makes room for."""
    if cfg.service_rank_boost == 0.0 or not (inference > 1.5).any():
        return None
    return np.where(inference > 1.5, cfg.service_rank_boost, 0.0)


def whole_probe(replica: PendingJob) -> PendingJob:
    """What a plan must free for ``replica``: a fractional one asks a whole GPU. Had a fraction
    it may share been free, the pass would have placed it there (the share stage's rule, which
    a plan's fit test does not ask); a GPU the plan empties holds it beside nobody."""
    if not is_fractional(replica.spec):
        return replica
    spec = with_changes(replica.spec, gpus=1.0)
    return PendingJob(spec, replica.enqueued_at, replica.attempt, replica.progress)


def eligible(
    replica: PendingJob,
    movers: Sequence[RunningJob],
    facts: Mapping[str, P.MoveFacts],
    now: float,
    pc: PreemptConfig,
) -> list[RunningJob]:
    """The running jobs of one node a burst for ``replica`` may move: not protected, not
    inference (``protection`` refuses it too), priority at most the replica's."""
    top = replica.spec.priority
    return [
        r
        for r in movers
        if r.spec.kind != "inference"
        and r.spec.priority <= top
        and not P.protection(r, facts.get(r.spec.id), now, pc)
    ]


def shrink_only(
    replica: PendingJob, view: ClusterView, i: int, cands: Sequence[RunningJob], most: int
) -> list[P.Release] | None:
    """A plan on node ``i`` that only shrinks elastic jobs (``cands`` in cost order), each by as
    little as lets the replica fit beside the others, or to its floor when no size alone is
    enough; None when even every one of them (at most ``most``) at its floor is not enough."""
    chosen: list[P.Release] = []
    for r in cands:
        floor = shrink_floor(r.spec)
        if floor is None or r.gpu_share < 1.0 - EPS:
            continue
        if len(chosen) >= most:
            break
        keep = P.shrink_to_fit(replica.spec, view, i, chosen, r) or floor
        chosen.append((r, keep))
        if P.fits_after_release(replica.spec, view, i, chosen):
            return chosen
    return None


def plan_key(victims: Sequence[P.Release], lost: float, i: int) -> PlanKey:
    """How a plan ranks among the nodes' plans (module docstring): smaller first."""
    stops = any(keep == 0 for _, keep in victims)
    return (stops, max(r.spec.priority for r, _ in victims), lost, i)


def node_plans(
    replica: PendingJob,
    i: int,
    cands: Sequence[RunningJob],
    view: ClusterView,
    facts: Mapping[str, P.MoveFacts],
    now: float,
    pc: PreemptConfig,
) -> list[tuple[PlanKey, list[P.Release]]]:
    """The plans on node ``i``: the shrink-only one (if any), and the cheapest set in
    (priority, lost work) order where each victim shrinks when a size is enough
    (``stages.preempt.node_victims``), else stops."""

    def lost(r: RunningJob) -> float:
        return P.lost_gpu_s(r, facts.get(r.spec.id), now, pc)

    order = sorted(cands, key=lambda r: (r.spec.priority, lost(r), r.spec.id))
    out: list[tuple[PlanKey, list[P.Release]]] = []
    shrink = shrink_only(replica, view, i, order, pc.max_per_pass)
    if shrink is not None:
        out.append((plan_key(shrink, sum(lost(r) for r, _ in shrink), i), shrink))
    ranked = [(float(r.spec.priority), lost(r), r) for r in order]
    general = P.node_victims(replica, i, ranked, view, pc.max_per_pass)
    if general is not None:
        out.append((plan_key(general, sum(lost(r) for r, _ in general), i), general))
    return out


def burst_plan(
    blocked: Sequence[PendingJob],
    movers: Mapping[int, Sequence[RunningJob]],
    soon_free: np.ndarray,
    view: ClusterView,
    facts: Mapping[str, P.MoveFacts],
    now: float,
    cfg: PolicyConfig,
    speed: np.ndarray | None = None,
) -> P.PriorityPlan | None:
    """The burst rule (module docstring) for the first replica of ``blocked`` (rank order) that
    some node's plan can make room for, or None. ``movers``: per node index, the running jobs
    that could ever move (``moves.could_ever_move``) and are not being moved; ``soon_free``:
    ``stages.preempt.whole_free_within`` the resume bound; ``speed`` (float[M, C], the view's
    ``scores.ModelTables.speed``): a stopped victim resumes no slower than it ran."""
    pc = cfg.preempt
    if not pc.burst_enabled or not movers:
        return None
    free_gpus = view.gpu_free.sum(axis=1)
    usable = ~view.cordoned & ~(view.temp_c >= cfg.thermal_max_c)
    room_total = float(soon_free.sum())
    for blocked_pj in blocked:
        if not blocked_pj.spec.service:
            continue
        pj = whole_probe(blocked_pj)
        need = float(whole_gpus(pj.spec))
        ok = static_mask(pj.spec, view) & usable
        cands = {
            i: eligible(pj, ms, facts, now, pc) for i, ms in movers.items() if ok[i] and len(ms)
        }
        held = np.zeros(len(view.node_ids))
        for i, cs in cands.items():
            held[i] = sum(P.gpus_held(r) for r in cs)
        nodes = np.flatnonzero(ok & (held > 0) & (free_gpus + held >= need - EPS))
        options: list[tuple[PlanKey, list[P.Release]]] = []
        for i in P.candidate_nodes(nodes, free_gpus, pc.candidate_nodes):
            options += node_plans(pj, i, cands[i], view, facts, now, pc)
        for key, victims in sorted(options, key=lambda o: o[0]):
            i = key[3]
            stopped = [r for r, keep in victims if not keep]  # a shrunk one resumes on node i
            if room_total - soon_free[i] < sum(P.gpus_held(r) for r in stopped) - EPS:
                continue
            rooms = P.resume_rooms(stopped, view, soon_free, cfg, exclude=i, speed=speed)
            if rooms is None:
                continue
            rooms.update({r.spec.id: i for r, keep in victims if keep})
            return _plan(blocked_pj, view.node_ids[i], victims, rooms, view, facts, now, pc)
    return None


def _plan(
    pj: PendingJob,
    node: str,
    victims: Sequence[P.Release],
    rooms: Mapping[str, int],
    view: ClusterView,
    facts: Mapping[str, P.MoveFacts],
    now: float,
    pc: PreemptConfig,
) -> P.PriorityPlan:
    spec = pj.spec

    def what(r: RunningJob, keep: int) -> str:
        how = f"shrunk to {keep} GPUs" if keep else "stopped"
        return f"{r.spec.id} (priority {r.spec.priority}, {how})"

    out = tuple(
        P.Victim(r.spec.id, node, P.lost_gpu_s(r, facts.get(r.spec.id), now, pc), keep)
        for r, keep in victims
    )
    lost = sum(v.lost_gpu_s for v in out)
    names = ", ".join(what(r, keep) for r, keep in victims)
    reason = (
        f"{BURST_RULE}: replica {spec.id} of service {spec.service} (priority {spec.priority}) "
        f"needs {spec.gpus:g} GPUs and no free capacity holds it; on {node}: {names}, "
        f"losing {lost:.0f} GPU-s (shrinks before stops, then lowest priority, least lost work)"
    )
    to = tuple((j, view.node_ids[n]) for j, n in sorted(rooms.items()))
    plan = P.PriorityPlan(for_job=spec.id, node=node, victims=out, reason=reason)
    return dataclasses.replace(plan, rooms=to)
