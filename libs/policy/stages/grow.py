"""Grow back: a shrunk elastic job takes its node's GPUs back once nobody needs them (issue 16).

A shrink (``stages.shrink``) gives a burst its GPUs at once; before this rule the shrunk job
never grew again and ran the rest of its weeks at half speed (Philly 500 with the issue-16
service: about 1,160 JCT-hours per seed were two 8-GPU jobs shrunk to 4). A grow is the same
move the other way: the job checkpoints, its attempt ends, and it waits again *resized* to
more GPUs of the same node (``shrink.resized``, the runtime scaled by the same linear rule),
its room held there, so it restarts as soon as its save is done. Both drivers apply it as they
apply a shrink (``MoveOrder.shrink_to`` larger than the job holds; live, the checkpoint
command's ``shrink_to`` and the ``Preempted``'s ``resize_gpus``).

The rule (``grow_size``, ``grow_plan``): a running job grows when all of these hold:

* it was shrunk by a move and runs below the size it asked (``asked_gpus``: the size it held
  when it was first shrunk, which the scheduler's move book keeps); it never grows beyond that
  (nor beyond ``Elastic.max_gpus``): growing is giving back, never more than the user asked;
* it may be moved now (``stages.preempt.protection``: not moved within ``min_interval_s``,
  its attempt ran ``min_run_s``), which is the first half of the hysteresis;
* the cluster is quiet: no replica of a service waits and no burst move was made within
  ``grow_quiet_s`` (the caller's ``quiet``), the second half: a burst that just shrank the job
  is likely to want the GPUs again, and a grow that is undone costs two checkpoints;
* its own node is usable (not cordoned, which includes every room a move holds there, not at
  the thermal limit) and has whole GPUs free with the job's memory; it grows onto those only;
* no waiting job could start on those GPUs (``fits_after_release`` with nothing released, and
  the static rules): the pass ran first, so such a job waits for a reservation or a shape, and
  a job that starts is worth more than one that speeds up;
* the work it saves beats the move's cost: remaining runtime x (1 - held / new) > the save and
  the restore (``2 x checkpoint_cost_s``), the same cost ``stages.preempt.lost_gpu_s`` counts.

One grow per node per step (each holds its node as its room). Pure: no state, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.filters import static_mask
from libs.policy.stages import preempt as P
from libs.policy.types import PendingJob, RunningJob

GROW_RULE = "grow-back"
WANTED = "waiting job "  # how a refusal for a waiting job begins: the one that read the queue

# A grow the rule decides: (the running job, the GPUs it resumes on, the reason)
Grow = tuple[RunningJob, int, str]


def grow_bound(job: RunningJob, asked_gpus: int) -> int:
    """The most GPUs ``job`` may grow to: the size it asked, within ``Elastic.max_gpus``; 0
    when it is not an elastic whole-GPU training job."""
    spec = job.spec
    if spec.elastic is None or spec.kind == "inference" or job.gpu_share < 1.0 - EPS:
        return 0
    return min(int(asked_gpus), int(spec.elastic.max_gpus))


def free_gpus_for(job: RunningJob, view: ClusterView) -> int:
    """Whole GPUs of ``job``'s node that are free and hold its memory per GPU."""
    i = job.node_index
    if view.whole_free[i] < 1:  # the view's count of whole free GPUs: none, no need to look
        return 0
    ok = view.gpu_exists[i] & (view.gpu_free[i] >= 1.0 - EPS)
    ok &= view.gpu_mem_free_gb[i] >= job.spec.gpu_mem_gb - EPS
    return int(np.count_nonzero(ok))


def saved_s(remaining_s: float, held_gpus: int, to_gpus: int) -> float:
    """Wall seconds a grow from ``held_gpus`` to ``to_gpus`` saves on ``remaining_s`` of work
    (linear scaling, ``stages.shrink``)."""
    return max(0.0, remaining_s) * (1.0 - held_gpus / to_gpus)


def wanted_by_waiting(i: int, view: ClusterView, waiting: Sequence[PendingJob]) -> str:
    """The id of a waiting job that could start on node ``i``'s free resources now ("" none)."""
    for pj in waiting:
        if static_mask(pj.spec, view)[i] and P.fits_after_release(pj.spec, view, i, ()):
            return pj.spec.id
    return ""


def grow_size(
    job: RunningJob,
    asked_gpus: int,
    view: ClusterView,
    waiting: Sequence[PendingJob],
    facts: P.MoveFacts | None,
    now: float,
    cfg: PolicyConfig,
) -> tuple[int, str]:
    """(the size ``job`` grows to now, or 0; why, or why not): the rule of the module
    docstring for one job, the cluster's quiet taken as given."""
    held = len(job.gpu_indices)
    bound = grow_bound(job, asked_gpus)
    if bound <= held:
        return 0, "not below the size it asked"
    why = P.protection(job, facts, now, cfg.preempt)
    if why:
        return 0, why
    i = job.node_index
    if view.cordoned[i] or view.temp_c[i] >= cfg.thermal_max_c:
        return 0, "its node is held or hot"
    to = min(bound, held + free_gpus_for(job, view))
    if to <= held:
        return 0, "no free GPU on its node"
    gain_s = saved_s(job.expected_end - now, held, to)
    cost_s = 2.0 * cfg.preempt.checkpoint_cost_s
    if gain_s <= cost_s:
        return 0, f"saves {gain_s:.0f} s <= the move's {cost_s:.0f} s"
    other = wanted_by_waiting(i, view, waiting)  # last: the one check that walks the queue
    if other:
        return 0, f"{WANTED}{other} could start on those GPUs"
    node = view.node_ids[i]
    return to, (
        f"{GROW_RULE}: {job.spec.id} grows from {held} to {to} GPUs on {node} (asked {bound}); "
        f"saves {gain_s:.0f} s of its remaining run > the move's {cost_s:.0f} s; no waiting job "
        f"fits there and no burst for {cfg.preempt.grow_quiet_s:.0f} s"
    )


def grow_plan(
    shrunk: Mapping[str, int],
    jobs: Mapping[str, RunningJob],
    view: ClusterView,
    waiting: Sequence[PendingJob],
    facts: Mapping[str, P.MoveFacts],
    now: float,
    cfg: PolicyConfig,
    *,
    quiet: bool,
) -> list[Grow]:
    """The grows decided now: for each shrunk running job (``shrunk``: job id -> the size it
    asked; ``jobs``: the running jobs not being moved), in id order, at most one per node;
    none unless ``quiet`` (no replica waits, no burst within ``grow_quiet_s``)."""
    if not cfg.preempt.grow_enabled or not quiet or not shrunk:
        return []
    out: list[Grow] = []
    nodes: set[int] = set()
    for jid in sorted(shrunk):
        job = jobs.get(jid)
        if job is None or job.node_index in nodes:
            continue
        to, why = grow_size(job, shrunk[jid], view, waiting, facts.get(jid), now, cfg)
        if to:
            out.append((job, to, why))
            nodes.add(job.node_index)
    return out
