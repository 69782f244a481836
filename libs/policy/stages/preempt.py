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
Slurm's ``PreemptType=preempt/qos`` with ``PreemptMode=REQUEUE`` is the model; the bound on
lost work is Mosaic's own (Slurm preempts whenever the QOS allows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig, PreemptConfig
from libs.policy.stages.filter import STATIC, frac_slot_ok, is_fractional, whole_gpus
from libs.policy.types import PendingJob, RunningJob
from proto.jobs import JobSpec

PRIORITY_RULE = "priority-protection"


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


@dataclass(frozen=True, slots=True)
class PriorityPlan:
    """Stop ``victims`` on ``node`` so that ``for_job`` can start there; ``reason`` prints it."""

    for_job: str
    node: str
    victims: tuple[Victim, ...]
    reason: str


def gpus_held(job: RunningJob) -> float:
    return job.gpu_share * len(job.gpu_indices)


def protection(job: RunningJob, facts: MoveFacts | None, now: float, pc: PreemptConfig) -> str:
    """Why ``job`` may not be moved now ("" when it may). Resume feasibility is separate
    (``resume_feasible``): it needs the cluster."""
    spec = job.spec
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


def lost_gpu_s(job: RunningJob, facts: MoveFacts | None, now: float, pc: PreemptConfig) -> float:
    """GPU-seconds a move costs the job: the checkpoint's save and the restore after it
    (``checkpoint_cost_s`` each, over its GPUs), plus ``at_risk_share`` of the attempt's run
    (capped at ``lost_work_cap_s``): a save may miss the last steps, and a job that ran longer
    has more to lose if it fails. The job saves on the move itself (``libs.runtime``), so its
    progress is kept: the run is not counted lost whole."""
    ran_s = max(0.0, now - facts.started_at) if facts is not None else 0.0
    at_risk_s = pc.at_risk_share * min(ran_s, pc.lost_work_cap_s)
    return gpus_held(job) * (2.0 * pc.checkpoint_cost_s + at_risk_s)


def _static_ok(spec: JobSpec, view: ClusterView) -> np.ndarray:
    ok = np.ones(len(view.node_ids), dtype=bool)
    for _, f in STATIC:
        ok &= f(spec, view)
    return ok


def fits_after_release(
    spec: JobSpec, view: ClusterView, i: int, released: Sequence[RunningJob]
) -> bool:
    """Would ``spec`` fit on node ``i`` once ``released`` (jobs on that node) stopped? Only the
    node's free resources are considered (the static rules are the caller's)."""
    free = view.gpu_free[i].copy()
    mem = view.gpu_mem_free_gb[i].copy()
    host = float(view.host_mem_free_gb[i])
    cpus = float(view.cpus_free[i])
    for r in released:
        for g in r.gpu_indices:
            free[g] += r.gpu_share
            mem[g] += r.spec.gpu_mem_gb
        host += r.spec.host_mem_gb
        cpus += r.spec.cpus
    if host < spec.host_mem_gb - EPS or cpus < spec.cpus - EPS:
        return False
    exists = view.gpu_exists[i]
    if is_fractional(spec):
        ok = exists & (free >= spec.gpus - EPS) & (mem >= spec.gpu_mem_gb - EPS)
        return bool(ok.any())
    whole = exists & (free >= 1.0 - EPS)
    return int(whole.sum()) >= whole_gpus(spec)


def resume_feasible(
    job: RunningJob,
    view: ClusterView,
    running: Iterable[RunningJob],
    now: float,
    cfg: PolicyConfig,
    *,
    exclude: int | None = None,
) -> bool:
    """Could ``job`` start again within the resume bound if moved now? Yes when it fits on
    some other available node now, or on a node where the running work expected to end
    within the bound frees enough (``RunningJob.expected_end``). ``exclude``: the node being
    cleared (its room is for someone else); the node the job leaves never counts."""
    spec = job.spec
    ok = _static_ok(spec, view) & ~view.cordoned & ~(view.temp_c >= cfg.thermal_max_c)
    if exclude is not None:
        ok[exclude] = False
    ok[job.node_index] = False
    if not ok.any():
        return False
    if (ok & f_free_now(spec, view)).any():
        return True
    by_node: dict[int, list[RunningJob]] = {}
    horizon = now + cfg.preempt.resume_bound_s
    for r in running:
        if r.expected_end <= horizon and ok[r.node_index]:
            by_node.setdefault(r.node_index, []).append(r)
    return any(fits_after_release(spec, view, i, rs) for i, rs in by_node.items())


def f_free_now(spec: JobSpec, view: ClusterView) -> np.ndarray:
    """bool[N]: nodes whose free GPUs, host memory and CPUs hold ``spec`` now."""
    if is_fractional(spec):
        gpu = frac_slot_ok(spec, view).any(axis=1)
    else:
        gpu = view.whole_free >= whole_gpus(spec)
    host = view.host_mem_free_gb >= spec.host_mem_gb - EPS
    return gpu & host & (view.cpus_free >= spec.cpus - EPS)


def resume_all_feasible(
    victims: Sequence[RunningJob],
    view: ClusterView,
    running: Iterable[RunningJob],
    now: float,
    cfg: PolicyConfig,
    *,
    exclude: int,
) -> bool:
    """``resume_feasible`` for a plan's victims together: each whole-GPU victim (widest first)
    takes its room on another node as it fits now (the room it takes is not there for the
    next); a victim that finds none must pass ``resume_feasible``'s within-the-bound test on
    its own. Fractional victims are checked one by one."""
    whole = view.whole_free.astype(float).copy()
    host = view.host_mem_free_gb.copy()
    cpus = view.cpus_free.copy()
    avail = ~view.cordoned & ~(view.temp_c >= cfg.thermal_max_c)
    avail[exclude] = False
    run = list(running)
    for v in sorted(victims, key=lambda r: -gpus_held(r)):
        spec = v.spec
        if is_fractional(spec):
            if not resume_feasible(v, view, run, now, cfg, exclude=exclude):
                return False
            continue
        ok = avail & _static_ok(spec, view) & (whole >= whole_gpus(spec))
        ok &= (host >= spec.host_mem_gb - EPS) & (cpus >= spec.cpus - EPS)
        ok[v.node_index] = False
        hit = np.flatnonzero(ok)
        if len(hit):
            i = int(hit[np.argmin(whole[hit])])  # best fit: keep big holes for big jobs
            whole[i] -= whole_gpus(spec)
            host[i] -= spec.host_mem_gb
            cpus[i] -= spec.cpus
        elif not resume_feasible(v, view, run, now, cfg, exclude=exclude):
            return False
    return True


def may_move(
    job: RunningJob,
    facts: Mapping[str, MoveFacts],
    view: ClusterView,
    running: Iterable[RunningJob],
    now: float,
    cfg: PolicyConfig,
    *,
    exclude: int | None = None,
) -> str:
    """Every rule at once: "" when ``job`` may be moved now, else why not."""
    why = protection(job, facts.get(job.spec.id), now, cfg.preempt)
    if why:
        return why
    if not resume_feasible(job, view, running, now, cfg, exclude=exclude):
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
    return lambda job: not may_move(job, facts, view, running, now, cfg)


def _node_victims(
    blocked: PendingJob,
    i: int,
    candidates: list[tuple[float, float, RunningJob]],
    view: ClusterView,
    most: int,
) -> list[RunningJob] | None:
    """The fewest cheapest victims (at most ``most``) on node ``i`` after which ``blocked``
    fits, or None."""
    chosen: list[RunningJob] = []
    for _, _, r in candidates[:most]:
        chosen.append(r)
        if fits_after_release(blocked.spec, view, i, chosen):
            return chosen
    return None


def priority_plan(
    blocked: Sequence[PendingJob],
    movers: Mapping[int, Sequence[RunningJob]],
    running: Iterable[RunningJob],
    view: ClusterView,
    facts: Mapping[str, MoveFacts],
    now: float,
    cfg: PolicyConfig,
) -> PriorityPlan | None:
    """The priority-protection rule (module docstring) for the best-ranked eligible job of
    ``blocked`` (in rank order), or None when no plan passes the trade-off. ``movers``: per
    node index, its running jobs that are checkpointable or elastic and not inference (the
    only ones a plan may stop); ``running``: every running job (for resume bounds)."""
    pc = cfg.preempt
    if not pc.enabled or not movers:
        return None
    for pj in blocked:
        spec = pj.spec
        waited_s = now - pj.enqueued_at
        if spec.priority < pc.protect_priority or waited_s < pc.min_wait_s:
            continue
        top = spec.priority - pc.priority_gap
        # per node, the GPUs movers of priority <= top hold: a cheap bound that skips nodes
        # where no plan can exist
        freeable = np.zeros(len(view.node_ids))
        for i, rs in movers.items():
            freeable[i] = sum(gpus_held(r) for r in rs if r.spec.priority <= top)
        need = spec.gpus if is_fractional(spec) else float(whole_gpus(spec))
        ok = _static_ok(spec, view) & ~view.cordoned & ~(view.temp_c >= cfg.thermal_max_c)
        ok &= view.gpu_free.sum(axis=1) + freeable >= need - EPS
        budget = pc.lost_per_wait * waited_s * max(spec.gpus, 0.01)
        best: tuple[float, int, list[RunningJob]] | None = None
        for i in np.flatnonzero(ok).tolist():
            cands = [
                (r.spec.priority, lost_gpu_s(r, facts.get(r.spec.id), now, pc), r)
                for r in movers.get(i, ())
                if r.spec.priority <= top and not protection(r, facts.get(r.spec.id), now, pc)
            ]
            cands.sort(key=lambda c: (c[0], c[1], c[2].spec.id))
            victims = _node_victims(pj, i, cands, view, pc.max_per_pass)
            if victims is None:
                continue
            cost = sum(lost_gpu_s(r, facts.get(r.spec.id), now, pc) for r in victims)
            if cost > budget or (best is not None and cost >= best[0]):
                continue
            if not resume_all_feasible(victims, view, running, now, cfg, exclude=i):
                continue  # the victims could not all resume within the bound: not this node
            best = (cost, i, victims)
        if best is None:
            continue
        cost, i, victims = best
        node = view.node_ids[i]
        names = ", ".join(f"{r.spec.id} (priority {r.spec.priority})" for r in victims)
        reason = (
            f"{PRIORITY_RULE}: {spec.id} (priority {spec.priority}, waited {waited_s:.0f} s) "
            f"needs {spec.gpus:g} GPUs on {node}; stopping {names} loses {cost:.0f} GPU-s "
            f"<= {pc.lost_per_wait:g} x its wait ({budget:.0f} GPU-s)"
        )
        out = tuple(
            Victim(r.spec.id, node, lost_gpu_s(r, facts.get(r.spec.id), now, pc)) for r in victims
        )
        return PriorityPlan(for_job=spec.id, node=node, victims=out, reason=reason)
    return None
