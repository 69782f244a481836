"""Boot protection: a high-priority job does not wait for a node to boot (the definition).

Why: with power saving, an arrival that finds every awake GPU it could use taken waits one
boot (``PolicyConfig.resume_s``, 300 s) while a node that could hold it sleeps. That is the
whole of the high-priority p99 wait on an idle cluster (Philly at its natural load: p99 285-316
s against a 60 s target, docs/benchmarks.md). Priority protection cannot help: it acts after
``min_wait_s`` (600 s), and a victim needs a room awake now, which is what is missing.

The rule (``boot_plan``, rule ``BOOT_RULE``): a blocked job of priority >= ``boot_priority``
that has waited ``boot_min_wait_s``, for which a node that sleeps or boots could hold it
(``boot_would_serve``), may stop jobs that may move (priority <= its own - ``priority_gap``, the
protection rules of ``stages.preempt``) on one awake node. Each victim resumes on a node
that is awake and free (as priority protection's) or, failing that, on a node that sleeps or
boots (``wake``): the scheduler holds it as the victim's room and wakes it (``core_power``),
and the victim starts there once it is up: one boot and its save, inside ``resume_bound_s``
(the rule is off when ``resume_s + checkpoint_cost_s`` exceeds the bound). So the wait for
the boot moves from a high-priority job to lower-priority ones, at the cost of their saves.
The trade-off is priority protection's (work lost at most ``lost_per_wait`` x the blocked job's
GPU-seconds of wait), with the boot it saves counted as waited: without the plan it waits at
least that. Slurm's QOS preemption (``PreemptMode=REQUEUE``) with its power saving is the
model; Slurm preempts whenever the QOS allows and does not ask where the victim resumes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.stages import preempt as P
from libs.policy.stages.filter import is_fractional, whole_gpus
from libs.policy.stages.resume import static_ok
from libs.policy.types import PendingJob, RunningJob
from proto.jobs import JobSpec

BOOT_RULE = "boot-protection"


def boot_enabled(cfg: PolicyConfig) -> bool:
    """The rule is on, and a victim's boot and save fit inside its resume bound."""
    pc = cfg.preempt
    return (
        pc.boot_enabled
        and cfg.power_saving
        and cfg.resume_s + pc.checkpoint_cost_s <= pc.resume_bound_s
    )


def boot_would_serve(spec: JobSpec, view: ClusterView, asleep: np.ndarray) -> bool:
    """Whether a node that sleeps or boots (``asleep``, bool[N]) could hold ``spec`` by its
    shape and size: the job would wait for a boot, capacity exists."""
    need = 1.0 if is_fractional(spec) else float(whole_gpus(spec))
    return bool((static_ok(spec, view) & asleep & (view.gpu_total >= need - EPS)).any())


def boot_plan(
    blocked: Sequence[PendingJob],
    movers: Mapping[int, Sequence[RunningJob]],
    movable_gpus: np.ndarray,
    soon_free: np.ndarray,
    view: ClusterView,
    facts: Mapping[str, P.MoveFacts],
    now: float,
    cfg: PolicyConfig,
    asleep: np.ndarray,
    search: P.PlanSearch = P.DEFINITIONS,
    speed: np.ndarray | None = None,
) -> P.PriorityPlan | None:
    """The rule (module docstring) for the first job of ``blocked`` (in the order given) that
    it serves, or None. ``asleep``: bool[N], the nodes held only because they sleep or boot
    (with nothing else holding them: no room of another move). The rest as
    ``stages.preempt.priority_plan``'s arguments."""
    pc = cfg.preempt
    if not boot_enabled(cfg) or not movers or not asleep.any():
        return None
    at = P.NodeSearch(movers, movable_gpus, soon_free, view, facts, now, cfg, {})
    for pj in blocked:
        spec = pj.spec
        waited_s = now - pj.enqueued_at
        if spec.priority < pc.boot_priority or waited_s < pc.boot_min_wait_s:
            continue
        if spec.priority - pc.priority_gap < 0 or not boot_would_serve(spec, view, asleep):
            continue
        budget = pc.lost_per_wait * (waited_s + cfg.resume_s) * max(spec.gpus, 0.01)
        plan = P.job_plan(
            pj,
            budget,
            at,
            search,
            speed,
            wake=asleep,
            rule=BOOT_RULE,
            budget_words="its wait and the boot it saves",
        )
        if plan is not None:
            return plan
    return None
