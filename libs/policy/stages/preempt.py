"""Preempt: which running jobs may be moved, and the priority-protection rule (the definitions).

A move is a checkpoint and a requeue: the job stops at its last checkpoint, keeps its progress
and waits again with a resume deadline (``PreemptConfig.resume_bound_s``, 30 min by default,
the field report's "resume within 30 minutes"). Both drivers apply a move the same way: the
simulator charges the checkpoint time, the live placer sends ``node.<node>.checkpoint``.

**Protected jobs** (``protection``: never moved, whoever asks; the reason says why):

* a job that is neither checkpointable nor elastic (it would lose its work),
* an inference job (a service: moving it drops requests),
* a job moved less than ``min_interval_s`` ago (nothing thrashes), or one whose current attempt
  started less than ``min_run_s`` ago (it has barely started: moving it gains nothing),
* a job whose resume bound the move could break (``resume_feasible``): it must fit somewhere
  else now, or on a node where enough running work is expected to end within the bound.

**Priority protection** (``priority_plan``, rule ``PRIORITY_RULE``): the best-ranked blocked
job with priority >= ``protect_priority`` that has waited ``min_wait_s`` may stop running jobs
of priority <= its own - ``priority_gap`` on ONE node, the cheapest such set (lowest priority,
then least lost work first), when the work lost (``lost_gpu_s``: the save and the restore, and
a share of the attempt's run, over the victims' GPUs) is at most ``lost_per_wait`` x the
GPU-seconds the blocked job has already waited. That is the trade-off, printed in the reason.
Each stopped victim's room is on a GPU model no slower than the one it leaves (``speed``, as
the burst and short-wait rules ask: a victim should not finish a long run on a slower GPU),
with the victim's host memory and CPUs free (``stages.resume.resume_rooms``).
Slurm's ``PreemptType=preempt/qos`` with ``PreemptMode=REQUEUE`` is the model; the bound on
lost work is Mosaic's own (Slurm preempts whenever the QOS allows).

**Short-wait protection** (``stages.short_wait``) is the sibling rule for short jobs stuck
behind long ones; it reuses ``protection``, ``lost_gpu_s``, ``candidate_nodes`` and
``node_victims`` and returns a ``PriorityPlan`` with its own reason.

**Elastic jobs shrink instead of stopping** (``stages.shrink``): a victim that is elastic gives
back only the GPUs the blocked job still needs, down to its ``min_gpus``, and resumes at once
on the rest of the same node (its room is that node); it is stopped whole only when no size
it may take frees enough.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig, PreemptConfig
from libs.policy.stages.filter import is_fractional, whole_gpus
from libs.policy.stages.gang import is_part
from libs.policy.stages.resume import (  # noqa: F401 (fits_after_release: re-exported)
    Release,
    fits_after_release,
    gpus_held,
    resume_rooms,
    static_ok,
    whole_free_within,
)
from libs.policy.stages.victims import (  # noqa: F401 (re-exported: the rules read them here)
    DEFINITIONS,
    PlanSearch,
    node_victims,
    shrink_to_fit,
)
from libs.policy.types import PendingJob, RunningJob
from proto.jobs import JobSpec

PRIORITY_RULE = "priority-protection"
PRIORITY_LEVELS = 10  # JobSpec.priority is 0-9 (proto.validation)


@dataclass(frozen=True, slots=True)
class MoveFacts:
    """What the scheduler knows of a running job's history, for the protection rules."""

    started_at: float  # when its current attempt started (Mosaic clock)
    last_moved_at: float | None = None  # when it was last preempted or migrated


@dataclass(frozen=True, slots=True)
class Victim:
    """A running job a plan stops, and the work it loses."""

    job_id: str
    node: str
    lost_gpu_s: float
    shrink_to: int = 0  # elastic: resumes at once on this many GPUs of ``node`` (0: stopped)


@dataclass(frozen=True, slots=True)
class PriorityPlan:
    """Stop ``victims`` on ``node`` so that ``for_job`` can start there; ``reason`` prints it."""

    for_job: str
    node: str
    victims: tuple[Victim, ...]
    reason: str
    rooms: tuple[tuple[str, str], ...] = ()  # (victim, node it resumes on)
    lease_until_s: float | None = None  # a swap: for_job holds node until then (stages.lease)


def ever_movable(spec: JobSpec) -> bool:
    """Checkpointable or elastic and not inference: a job a move may ever stop (the static
    part of ``protection``; the jobs a plan considers at all, ``moves.could_ever_move``, and
    the short jobs a swap may lease a node to, ``stages.lease``)."""
    return spec.kind != "inference" and (spec.checkpointable or spec.elastic is not None)


def protection(job: RunningJob, facts: MoveFacts | None, now: float, pc: PreemptConfig) -> str:
    """Why ``job`` may not be moved now ("" when it may). Resume feasibility is separate
    (``resume_feasible``): it needs the cluster."""
    spec = job.spec
    if is_part(spec.id):  # one node's part of a gang (stages.gang)
        return "gang part (a job over several nodes is never preempted)"
    if spec.kind == "inference":
        return "inference job (a service is never preempted)"
    if not (spec.checkpointable or spec.elastic is not None):
        return "neither checkpointable nor elastic"
    if facts is not None:
        if facts.last_moved_at is not None and now - facts.last_moved_at < pc.min_interval_s:
            ago = now - facts.last_moved_at
            return f"moved {ago:.0f} s ago (window {pc.min_interval_s:.0f} s)"
        if now - facts.started_at < pc.min_run_s:
            return f"started {now - facts.started_at:.0f} s ago (min run {pc.min_run_s:.0f} s)"
    return ""


def time_protected(facts: MoveFacts | None, now: float, pc: PreemptConfig) -> bool:
    """Whether ``protection``'s two windows (moved within ``min_interval_s``, started within
    ``min_run_s``) hold now: the same comparisons, without the reason's words. The only part
    of ``protection`` that changes with time, and it only ends (once False, False later)."""
    if facts is None:
        return False
    if facts.last_moved_at is not None and now - facts.last_moved_at < pc.min_interval_s:
        return True
    return now - facts.started_at < pc.min_run_s


def lost_gpu_s(job: RunningJob, facts: MoveFacts | None, now: float, pc: PreemptConfig) -> float:
    """GPU-seconds a move costs the job: the checkpoint's save and the restore after it
    (``checkpoint_cost_s`` each, over its GPUs), plus ``at_risk_share`` of the attempt's run
    (capped at ``lost_work_cap_s``): a save may miss the last steps, and a job that ran longer
    has more to lose if it fails. The job saves on the move itself (``libs.runtime``), so its
    progress is kept: the run is not counted lost whole."""
    ran_s = max(0.0, now - facts.started_at) if facts is not None else 0.0
    at_risk_s = pc.at_risk_share * min(ran_s, pc.lost_work_cap_s)
    return gpus_held(job) * (2.0 * pc.checkpoint_cost_s + at_risk_s)


def may_move(
    job: RunningJob,
    facts: Mapping[str, MoveFacts],
    view: ClusterView,
    soon_free: np.ndarray,
    now: float,
    cfg: PolicyConfig,
    *,
    exclude: int | None = None,
) -> str:
    """Every rule at once: "" when ``job`` may be moved now, else why not. ``soon_free``:
    ``whole_free_within`` for the resume bound."""
    why = protection(job, facts.get(job.spec.id), now, cfg.preempt)
    if why:
        return why
    if resume_rooms((job,), view, soon_free, cfg, exclude=exclude) is None:
        bound = cfg.preempt.resume_bound_s
        return f"could not resume within {bound:.0f} s (no room for it elsewhere)"
    return ""


def movable_predicate(
    facts: Mapping[str, MoveFacts],
    view: ClusterView,
    running: Sequence[RunningJob],
    now: float,
    cfg: PolicyConfig,
) -> Callable[[RunningJob], bool]:
    """``may_move`` as the predicate planners take (the defragmenter, the thermal guard)."""
    pc = cfg.preempt
    soon = whole_free_within(
        view, running, now, pc.resume_bound_s if pc.resume_counts_ends else -1.0
    )
    return lambda job: not may_move(job, facts, view, soon, now, cfg)


def usable_nodes(spec: JobSpec, view: ClusterView, cfg: PolicyConfig) -> np.ndarray:
    """bool[N]: nodes that could hold ``spec`` now, free or not: its static rules, not
    cordoned (rooms held for other moves included), not too hot."""
    return static_ok(spec, view) & ~view.cordoned & ~(view.temp_c >= cfg.thermal_max_c)


def candidate_nodes(ok: np.ndarray, free_gpus: np.ndarray, most: int) -> list[int]:
    """The nodes (indices ``ok``) a plan tries, at most ``most``: those with the most GPUs
    free already (the fewest to stop), then in index order. A bound by design: a plan is
    a search per node, and on a large cluster most nodes that could hold the job are as good
    as one another."""
    if len(ok) <= most:
        return ok.tolist()
    order = np.lexsort((ok, -free_gpus[ok]))
    return ok[order[:most]].tolist()


def priority_plan(
    blocked: Sequence[PendingJob],
    movers: Mapping[int, Sequence[RunningJob]],
    movable_gpus: np.ndarray,
    soon_free: np.ndarray,
    view: ClusterView,
    facts: Mapping[str, MoveFacts],
    now: float,
    cfg: PolicyConfig,
    search: PlanSearch = DEFINITIONS,
    speed: np.ndarray | None = None,
) -> PriorityPlan | None:
    """The priority-protection rule (module docstring) for the best-ranked eligible job of
    ``blocked`` (in rank order), or None when no plan passes the trade-off. ``movers``: per
    node index, its running jobs that are checkpointable or elastic and not inference (the
    only ones a plan may stop); ``movable_gpus``: float[PRIORITY_LEVELS, N], the GPUs they
    hold per priority and node (a cheap bound: a node where no plan can exist is skipped);
    ``soon_free``: ``whole_free_within`` the resume bound.

    Per job, the nodes are tried cheapest plan first; the first whose victims can all resume
    within the bound (``resume_rooms``) is the plan. ``search``: who runs ``node_victims`` and
    ``resume_rooms`` (the definitions, or a memo of them: ``PlanSearch``). ``speed``
    (float[M, C], ``ModelTables.speed``): rooms only on models no slower than the victim's
    (the scheduler always passes it; None keeps any model, for tests of the search alone)."""
    pc = cfg.preempt
    if not pc.enabled or not movers:
        return None
    at = NodeSearch(movers, movable_gpus, soon_free, view, facts, now, cfg, {})
    for pj in blocked:
        spec = pj.spec
        waited_s = now - pj.enqueued_at
        top = spec.priority - pc.priority_gap
        if spec.priority < pc.protect_priority or waited_s < pc.min_wait_s or top < 0:
            continue
        budget = pc.lost_per_wait * waited_s * max(spec.gpus, 0.01)
        plan = job_plan(pj, budget, at, search, speed)
        if plan is not None:
            return plan
    return None


@dataclass(frozen=True, slots=True)
class NodeSearch:
    """What a plan for one blocked job searches: the movers and their GPUs per node, the room
    within the bound, the cluster, and the victims by cost per (node, priority bound), shared
    by the jobs of one look (``job_plan``)."""

    movers: Mapping[int, Sequence[RunningJob]]
    movable_gpus: np.ndarray
    soon_free: np.ndarray
    view: ClusterView
    facts: Mapping[str, MoveFacts]
    now: float
    cfg: PolicyConfig
    # a node's victims by cost, per priority bound: the same for every blocked job of this
    # look that tries the node with that bound (they are ordered by time, not by the job)
    by_node: dict[tuple[int, int], list[tuple[float, float, RunningJob]]]


def job_plan(
    pj: PendingJob,
    budget: float,
    at: NodeSearch,
    search: PlanSearch = DEFINITIONS,
    speed: np.ndarray | None = None,
    *,
    wake: np.ndarray | None = None,
    rule: str = PRIORITY_RULE,
    budget_words: str = "its wait",
) -> PriorityPlan | None:
    """The cheapest plan for ``pj`` whose work lost is within ``budget`` (GPU-seconds): it
    stops jobs of priority <= its own - ``priority_gap`` on one node, each victim with a room
    (``resume_rooms``; with ``wake``, bool[N], also on those nodes, sleeping or booting:
    ``stages.boot``), or None. ``rule`` and ``budget_words`` (what the budget is) word the
    plan's reason."""
    spec, view, pc = pj.spec, at.view, at.cfg.preempt
    facts, now, soon_free = at.facts, at.now, at.soon_free
    waited_s = now - pj.enqueued_at
    top = spec.priority - pc.priority_gap
    free_gpus = view.gpu_free.sum(axis=1)
    need = spec.gpus if is_fractional(spec) else float(whole_gpus(spec))
    ok = usable_nodes(spec, view, at.cfg)
    ok &= free_gpus + at.movable_gpus[: top + 1].sum(axis=0) >= need - EPS
    options: list[tuple[float, int, list[Release]]] = []
    for i in candidate_nodes(np.flatnonzero(ok), free_gpus, pc.candidate_nodes):
        cands = at.by_node.get((i, top))
        if cands is None:
            cands = at.by_node[(i, top)] = [
                (r.spec.priority, lost_gpu_s(r, facts.get(r.spec.id), now, pc), r)
                for r in at.movers.get(i, ())
                if r.spec.priority <= top and not protection(r, facts.get(r.spec.id), now, pc)
            ]
            cands.sort(key=lambda c: (c[0], c[1], c[2].spec.id))
        victims = search.victims(pj, i, cands, view, pc.max_per_pass)
        if victims is None:
            continue
        cost = sum(c[1] for c in cands[: len(victims)])  # the victims: a prefix of cands
        if cost <= budget:
            options.append((cost, i, victims))
    options.sort(key=lambda o: (o[0], o[1]))
    room_total = float(soon_free.sum())
    for cost, i, victims in options:
        stopped = [r for r, keep in victims if not keep]  # a shrunk one resumes on node i
        held = sum(gpus_held(r) for r in stopped)
        if room_total - soon_free[i] < held - EPS:  # no room for them all, whatever the fit
            continue
        rooms = search.rooms(stopped, view, soon_free, at.cfg, i, speed)
        if rooms is None and wake is not None:  # a room on a node that is still to boot
            rooms = resume_rooms(
                stopped, view, soon_free, at.cfg, exclude=i, speed=speed, wake=wake
            )
        if rooms is not None:
            rooms.update({r.spec.id: i for r, keep in victims if keep})
            words = (rule, budget_words)
            plan = _plan(
                pj, view.node_ids[i], victims, cost, budget, waited_s, facts, now, pc, words
            )
            to = tuple((j, view.node_ids[n]) for j, n in sorted(rooms.items()))
            return dataclasses.replace(plan, rooms=to)
    return None


def _plan(
    pj: PendingJob,
    node: str,
    victims: list[Release],
    cost: float,
    budget: float,
    waited_s: float,
    facts: Mapping[str, MoveFacts],
    now: float,
    pc: PreemptConfig,
    words: tuple[str, str] = (PRIORITY_RULE, "its wait"),
) -> PriorityPlan:
    spec = pj.spec
    rule, budget_words = words

    def what(r: RunningJob, keep: int) -> str:
        how = f", shrunk to {keep} GPUs" if keep else ""
        return f"{r.spec.id} (priority {r.spec.priority}{how})"

    names = ", ".join(what(r, keep) for r, keep in victims)
    reason = (
        f"{rule}: {spec.id} (priority {spec.priority}, waited {waited_s:.0f} s) "
        f"needs {spec.gpus:g} GPUs on {node}; stopping {names} loses {cost:.0f} GPU-s "
        f"<= {pc.lost_per_wait:g} x {budget_words} ({budget:.0f} GPU-s)"
    )
    out = tuple(
        Victim(r.spec.id, node, lost_gpu_s(r, facts.get(r.spec.id), now, pc), keep)
        for r, keep in victims
    )
    return PriorityPlan(for_job=spec.id, node=node, victims=out, reason=reason)
