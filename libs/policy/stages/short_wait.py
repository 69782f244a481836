"""Short-wait protection: a short job stuck behind long ones may stop one of them (issue 15).

Why: on a loaded cluster mean JCT is set by short jobs (on Philly 88 % of the jobs run under
1 h) that arrive in a burst when every GPU holds a job of hours. Shortest-first ranking
(``stages.rank``'s ``w_short``) puts them first in line, but first in line still waits for
a long job to end. Gavel's rounds and Tiresias' least-attained-service queues preempt for
them; this is the bounded version: it fires only when a short job's slowdown is already
large (or its deadline is at stake), only against much longer jobs that may move, and only
when the work lost is small.

**Eligible blocked job** (``eligible_rows``, in numpy over the queue's table): not a service's
replica nor inference; expected remaining runtime on the fastest GPU model present
(``remaining_best_s``, the rank's own measure of length) at most ``short_max_s``; waited at
least ``wait_bound_s`` = max(``min_wait_s``, ``short_wait_factor`` x that remaining), i.e.
slowdown (wait + run) / run at least 1 + ``short_wait_factor``; or, with a deadline, inside
its deadline window (``act_times_s``): from ``deadline_margin_s`` before its latest start
that meets the deadline on the fastest model to that start. Without the window a job whose
deadline leaves under 3 x its runtime (most of the filler's, 1.5-4 x) was helped, if at all,
only once its deadline was lost (full Philly: 2,738 of 3,377 misses were jobs under 1 h
that started too late).

**Eligible victim** (``victim_ok``): every protection of ``stages.preempt.protection`` (never a
gang part, an inference job, one neither checkpointable nor elastic, one moved within
``min_interval_s`` or started within ``min_run_s``); priority at most the blocked job's; and
long: remaining runtime on the fastest model (``victim_remaining_best_s``) above
``short_max_s`` and at least ``short_victim_factor`` x the blocked job's remaining. A nearly
done job is never stopped: waiting for it costs less than moving it.

**A plan** (``job_plan``, rule ``SHORT_RULE``): the cheapest victim set on ONE node
(``preempt.node_victims``, least lost work first, elastic ones shrunk when that is enough),
whose stopped victims can all resume within ``resume_bound_s`` on a GPU model no slower for
them (``resume.resume_rooms`` with ``speed``), when the GPU-seconds lost (``preempt.lost_gpu_s``)
are at most ``lost_per_wait`` (priority protection's, 1: break-even) x the blocked job's
GPUs x min(waited, delay saved: the victims' earliest expected end). **A look**
(``short_plans``) makes several plans, most slowed first, each node used once (a plan's node
and its victims' rooms are off limits to the next), at most ``most`` moves.

**On a full cluster, the swap** (``swap_wait_s``). With no room elsewhere (first 20k Philly
jobs: 16 of 15,961 plans found one) the victims resume on their own node once the short
job has run there: allowed only when that run plus a save and a restore is within
``resume_bound_s`` (the node held for them meanwhile), when the stopped victims' waits
together are at most ``lost_per_wait`` x what the short job gains, and on a lease that ends
with the bound (``stages.lease``: a wrong estimate cannot keep the victims waiting).

**Thrash and starvation.** A victim waits again with its progress, first in line
(``PreemptConfig.resume_credit_s``), its resume room held (``core_moves``'s rooms). It cannot
preempt back by this rule (it is long) and cannot be stopped again for ``min_interval_s``
(1 h): a long job loses at most one save/restore per hour to this rule; the short job is
never its victim (only its lease's end stops it). Constants chosen once from these arguments,
not fitted: ``short_max_s`` 1 h (the rank's short term is >= 0.8 below it),
``short_wait_factor`` 2 (act at slowdown 3), ``short_victim_factor`` 4 (gain a long job's
worth of order, not swap near equals under noisy estimates). Both drivers apply a plan as
every move (``core_moves``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig, PreemptConfig
from libs.policy.queue_arrays import COLUMNS
from libs.policy.scores import CLASS_INDEX
from libs.policy.stages import lease as L
from libs.policy.stages import preempt as P
from libs.policy.stages.filter import is_fractional, whole_gpus
from libs.policy.stages.resume import movable_gpus, resume_rooms
from libs.policy.types import PendingJob, RunningJob
from proto.jobs import JobSpec

SHORT_RULE = "short-wait"
_COLS = ("prio", "enq", "est", "prog", "deadline", "cls", "inference")
_COL = {c: COLUMNS.index(c) for c in _COLS}


def remaining_best_s(est_s: np.ndarray, prog: np.ndarray, cls: np.ndarray, best: np.ndarray):
    """Expected remaining runtime on the fastest model present, per job (the rank's length):
    est x (1 - progress) / the fastest speed of its workload class (``best``: float[C])."""
    return est_s * np.clip(1.0 - prog, 0.0, 1.0) / best[cls.astype(np.int64)]


def wait_bound_s(remaining_s: np.ndarray, pc: PreemptConfig) -> np.ndarray:
    """How long a short job waits before this rule acts for it: ``short_wait_factor`` x its
    remaining runtime (a slowdown bound), and at least ``min_wait_s``."""
    return np.maximum(pc.min_wait_s, pc.short_wait_factor * remaining_s)


def deadline_margin_s(pc: PreemptConfig) -> float:
    """How long before a deadline job's latest start the rule acts for it: one look's interval
    (``interval_s``: the next look may come that much later) and the victims' save
    (``checkpoint_cost_s``: the node frees only then)."""
    return pc.interval_s + pc.checkpoint_cost_s


def act_times_s(
    table: np.ndarray, best: np.ndarray, pc: PreemptConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per queue row: (remaining_s on the fastest model, slow_at: when it reaches its wait
    bound, dl_from and dl_to: the deadline window, NaN without a deadline). The window ends
    at the latest start that still meets the deadline on the fastest model and opens
    ``deadline_margin_s`` before (at the enqueue at the earliest): a deadline job of 1.5 x
    its runtime's slack (the least the traces' filler draws) would lose its deadline long
    before its wait bound of 2 x its runtime."""
    rem = remaining_best_s(
        table[:, _COL["est"]], table[:, _COL["prog"]], table[:, _COL["cls"]], best
    )
    enq = table[:, _COL["enq"]]
    dl_to = table[:, _COL["deadline"]] - rem
    dl_from = np.maximum(enq, dl_to - deadline_margin_s(pc))
    return rem, enq + wait_bound_s(rem, pc), dl_from, dl_to


def short_rows(table: np.ndarray, rem: np.ndarray, pc: PreemptConfig) -> np.ndarray:
    """bool per queue row: a job the rule may ever act for (not inference, at most
    ``short_max_s`` left on the fastest model, ``rem``), whatever its wait."""
    return (table[:, _COL["inference"]] < 0.5) & (rem <= pc.short_max_s)


def eligible_rows(
    table: np.ndarray, now: float, best: np.ndarray, pc: PreemptConfig
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, remaining_s): the queue rows (``table``: ``PendingQueue.table()``) this rule may
    act for now (module docstring): short, past its wait bound or in its deadline window
    (``act_times_s``), and each one's remaining runtime on the fastest model."""
    if not len(table):
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    rem, slow_at, dl_from, dl_to = act_times_s(table, best, pc)
    rows = np.flatnonzero(acting_now(short_rows(table, rem, pc), slow_at, dl_from, dl_to, now))
    return rows, rem[rows]


def acting_now(
    short: np.ndarray, slow_at: np.ndarray, dl_from: np.ndarray, dl_to: np.ndarray, now: float
) -> np.ndarray:
    """bool per row: the rule may act for it now: short (``short_rows``), and past its wait
    bound or inside its deadline window (``act_times_s``; NaN compares False)."""
    with np.errstate(invalid="ignore"):
        return short & ((now >= slow_at) | ((now >= dl_from) & (now <= dl_to)))


def owed_s(
    table: np.ndarray, best: np.ndarray, pc: PreemptConfig, looked_s: float, due_s: float
) -> np.ndarray:
    """The instants the rule owes a look, one per queued short job not looked at since it
    became eligible: the first of its wait bound and its deadline window's opening
    (``act_times_s``) after the last look (``looked_s``), no sooner than the rule may look
    again (``due_s``, ``interval_s`` after the last look)."""
    if not len(table):
        return np.zeros(0)
    rem, slow_at, dl_from, dl_to = act_times_s(table, best, pc)
    with np.errstate(invalid="ignore"):
        dl = np.where((dl_from <= dl_to) & (dl_from > looked_s), dl_from, np.inf)
    at = np.minimum(np.where(slow_at > looked_s, slow_at, np.inf), dl)
    owed = short_rows(table, rem, pc) & np.isfinite(at)
    return np.maximum(at[owed], due_s)


def next_due_s(
    table: np.ndarray,
    now: float,
    best: np.ndarray,
    pc: PreemptConfig,
    looked_s: float,
    due_s: float,
) -> float | None:
    """The next instant after ``now`` the rule owes a look (its wake-up): the earliest of
    ``owed_s``; one owed at or before ``now`` (the rule could not look now: the other rules
    took ``max_per_pass``) is owed one ``interval_s`` from now. None when no queued short job
    is owed one. Why: on a full quiet cluster nothing else may happen for hours, and a short
    job at its bound should not wait for the next arrival or end. ``fast.short_due`` keeps
    the answer across instants (tested equal)."""
    due = owed_s(table, best, pc, looked_s, due_s)
    if not len(due):
        return None
    return float(np.where(due > now, due, now + max(pc.interval_s, 1.0)).min())


def own_and_fastest(
    workload_class: str, view: ClusterView, i: int, speed: np.ndarray
) -> tuple[float, float]:
    """(node ``i``'s GPU model's speed for ``workload_class``, the fastest model's): how this
    rule converts a runtime between a node and the fastest model (``speed``: float[M, C])."""
    c = CLASS_INDEX.get(workload_class, CLASS_INDEX["other"])
    return float(speed[view.model_idx[i], c]), float(speed[:, c].max())


def victim_remaining_best_s(job: RunningJob, view: ClusterView, speed: np.ndarray, now: float):
    """A running job's expected remaining runtime as if on the fastest model present: the time
    to its expected end, times its GPU's speed over the fastest (``speed``: float[M, C])."""
    own, fastest = own_and_fastest(job.spec.workload_class, view, job.node_index, speed)
    return max(0.0, job.expected_end - now) * own / max(fastest, EPS)


def victim_ok(
    r: RunningJob,
    blocked: PendingJob,
    remaining_s: float,
    view: ClusterView,
    speed: np.ndarray,
    facts: Mapping[str, P.MoveFacts],
    now: float,
    pc: PreemptConfig,
) -> bool:
    """May ``r`` be stopped for ``blocked`` (remaining ``remaining_s``)? Module docstring."""
    if r.spec.priority > blocked.spec.priority:
        return False
    if P.protection(r, facts.get(r.spec.id), now, pc):
        return False
    long_s = max(pc.short_max_s + EPS, pc.short_victim_factor * remaining_s)
    return victim_remaining_best_s(r, view, speed, now) >= long_s


def saved_delay_s(victims: Sequence[P.Release], now: float) -> float:
    """The most a plan saves the blocked job: the victims' earliest expected end."""
    return min(max(0.0, r.expected_end - now) for r, _ in victims)


def swap_wait_s(
    spec: JobSpec,
    remaining_s: float,
    stopped: int,
    view: ClusterView,
    i: int,
    speed: np.ndarray,
    pc: PreemptConfig,
) -> float | None:
    """How long stopped victims wait to resume on node ``i`` itself, after the short job has
    run there (its remaining at node ``i``'s speed, plus a save and a restore); None when that
    breaks the resume bound (``resume_bound_s``), nothing is stopped, or the short job could
    not be stopped at its lease's end (``preempt.ever_movable``: the promise would rest on
    its estimate alone)."""
    if not stopped or not P.ever_movable(spec):
        return None
    own, fastest = own_and_fastest(spec.workload_class, view, i, speed)
    wait_s = remaining_s * fastest / max(own, EPS) + 2.0 * pc.checkpoint_cost_s
    return wait_s if wait_s <= pc.resume_bound_s else None


def fits_now(spec: JobSpec, view: ClusterView, ok: np.ndarray, free_gpus: np.ndarray) -> bool:
    """Does ``spec`` fit now on a node ``ok`` marks? Then it waits for a hold or boot: no move."""
    need = spec.gpus if is_fractional(spec) else float(whole_gpus(spec))
    return any(
        P.fits_after_release(spec, view, i, ())
        for i in np.flatnonzero(ok & (free_gpus >= need - EPS))
    )


def short_plans(
    blocked: Sequence[tuple[PendingJob, float]],
    movers: Mapping[int, Sequence[RunningJob]],
    soon_free: np.ndarray,
    view: ClusterView,
    facts: Mapping[str, P.MoveFacts],
    now: float,
    cfg: PolicyConfig,
    speed: np.ndarray,
    most: int,
    misses: int = 4,
    search: P.PlanSearch = P.DEFINITIONS,
    movable: np.ndarray | None = None,
) -> list[P.PriorityPlan]:
    """The rule's plans for one look: for ``blocked`` ((job, remaining_s), most slowed first),
    each job's plan (``job_plan``) in turn, at most ``most`` moves in all, stopping once
    ``misses`` jobs in a row that were searched had none (the cluster offers nothing for the
    rest either: the same nodes, the same victims). A job that fits now is skipped, not
    searched. Each node is used once per look: a plan's node and every node a victim resumes
    on (each a whole-node room hold) are off limits to the later plans, so no two plans count
    the same GPUs, stop the same job or promise the same room; each plan keeps its own
    budget. Why several: a burst of short jobs was served one plan per ``interval_s``.
    ``search``: who runs ``node_victims`` and ``resume_rooms`` (``preempt.PlanSearch``: the
    definitions, or ``fast.plans.PlanMemo``); ``movable``: float[N], the GPUs ``movers`` hold
    per node (``movable_gpus``), when the caller keeps it."""
    pc = cfg.preempt
    out: list[P.PriorityPlan] = []
    if not pc.short_enabled or not movers or most <= 0:
        return out
    free_gpus = view.gpu_free.sum(axis=1)
    if movable is None:
        movable = movable_gpus(movers, len(view.node_ids))
    used = np.zeros(len(view.node_ids), dtype=bool)
    missed = 0
    for pj, rem_s in blocked:
        if most <= 0 or missed >= misses:
            break
        ok = P.usable_nodes(pj.spec, view, cfg) & ~used
        if fits_now(pj.spec, view, ok, free_gpus):
            continue
        plan = job_plan(
            pj, rem_s, ok, movers, movable, soon_free, used, view, facts, now, cfg, speed, most,
            search,
        )  # fmt: skip
        if plan is None:
            missed += 1
            continue
        missed = 0
        out.append(plan)
        most -= len(plan.victims)
        used[view.index[plan.node]] = True
        for _, node in plan.rooms:
            used[view.index[node]] = True
    return out


def job_plan(
    pj: PendingJob,
    rem_s: float,
    ok: np.ndarray,
    movers: Mapping[int, Sequence[RunningJob]],
    movable: np.ndarray,
    soon_free: np.ndarray,
    used: np.ndarray,
    view: ClusterView,
    facts: Mapping[str, P.MoveFacts],
    now: float,
    cfg: PolicyConfig,
    speed: np.ndarray,
    most: int,
    search: P.PlanSearch = P.DEFINITIONS,
) -> P.PriorityPlan | None:
    """The rule (module docstring) for one blocked job ``pj`` (``rem_s`` left on the fastest
    model) on the nodes ``ok`` marks, or None. ``movers``: per node index, the running jobs
    that could ever move and are not being moved, ``movable``: the GPUs they hold per node;
    ``soon_free``: ``whole_free_within`` the resume bound; ``used``: nodes no victim may
    resume on (earlier plans' nodes and rooms); ``speed``: float[M, C] of the view's models;
    ``most``: the moves it may order; ``search``: as in ``short_plans``."""
    pc = cfg.preempt
    spec = pj.spec
    waited_s = now - pj.enqueued_at
    free_gpus = view.gpu_free.sum(axis=1)
    need = spec.gpus if is_fractional(spec) else float(whole_gpus(spec))
    ok = ok & (free_gpus + movable >= need - EPS)
    # (lost GPU-s, node, victims, budget, what the short job gains: min(waited, saved))
    options: list[tuple[float, int, list[P.Release], float, float]] = []
    for i in P.candidate_nodes(np.flatnonzero(ok), free_gpus, pc.candidate_nodes):
        cands = [
            (0.0, P.lost_gpu_s(r, facts.get(r.spec.id), now, pc), r)
            for r in movers.get(i, ())
            if victim_ok(r, pj, rem_s, view, speed, facts, now, pc)
        ]
        cands.sort(key=lambda c: (c[1], c[2].spec.id))
        victims = search.victims(pj, i, cands, view, most)
        if victims is None:
            continue
        cost = sum(c[1] for c in cands[: len(victims)])  # the victims: a prefix of cands
        gain_s = min(waited_s, saved_delay_s(victims, now))
        budget = pc.lost_per_wait * max(spec.gpus, 0.01) * gain_s
        if cost <= budget:
            options.append((cost, i, victims, budget, gain_s))
    options.sort(key=lambda o: (o[0], o[1]))
    avoid = used if used.any() else None
    for cost, i, victims, budget, gain_s in options:
        stopped = [r for r, keep in victims if not keep]  # a shrunk one resumes on node i
        if avoid is None:  # what the memo answers (it knows nothing of earlier plans' nodes)
            rooms = search.rooms(stopped, view, soon_free, cfg, i, speed)
        else:
            rooms = resume_rooms(stopped, view, soon_free, cfg, exclude=i, avoid=avoid, speed=speed)
        after, lease = "", None
        if rooms is None:  # a full cluster: no room elsewhere; the swap, if it keeps the bound
            after_s = swap_wait_s(spec, rem_s, len(stopped), view, i, speed, pc)
            if after_s is None or after_s * len(stopped) > pc.lost_per_wait * gain_s:
                continue  # the victims together would wait longer than it gains
            rooms = {r.spec.id: i for r in stopped}
            lease = L.lease_until_s(now, pc)
            after = f"; they resume there after it, in about {after_s:.0f} s (on a lease)"
        rooms.update({r.spec.id: i for r, keep in victims if keep})
        reason = _reason(pj, view.node_ids[i], victims, cost, budget, waited_s, rem_s, pc)
        out = tuple(
            P.Victim(r.spec.id, view.node_ids[i], P.lost_gpu_s(r, facts.get(r.spec.id), now, pc), k)
            for r, k in victims
        )
        to = tuple((j, view.node_ids[n]) for j, n in sorted(rooms.items()))
        return P.PriorityPlan(
            spec.id, view.node_ids[i], out, reason + after, rooms=to, lease_until_s=lease
        )
    return None


def _reason(
    pj: PendingJob,
    node: str,
    victims: list[P.Release],
    cost: float,
    budget: float,
    waited_s: float,
    remaining_s: float,
    pc: PreemptConfig,
) -> str:
    def what(r: RunningJob, keep: int) -> str:
        how = f", shrunk to {keep} GPUs" if keep else ""
        return f"{r.spec.id} (priority {r.spec.priority}{how})"

    names = ", ".join(what(r, keep) for r, keep in victims)
    return (
        f"{SHORT_RULE}: {pj.spec.id} (about {remaining_s:.0f} s left, waited {waited_s:.0f} s "
        f">= {pc.short_wait_factor:g} x its run) needs {pj.spec.gpus:g} GPUs on {node}; "
        f"stopping {names} (each >= {pc.short_victim_factor:g} x longer) loses {cost:.0f} GPU-s "
        f"<= {pc.lost_per_wait:g} x min(its wait, the delay saved) x its GPUs ({budget:.0f} GPU-s)"
    )
