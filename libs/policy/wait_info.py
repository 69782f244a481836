"""Why a pending job waits, with numbers: its rank, its score terms (``sprio``), the node
closest to holding it and what that node lacks, and its reservation's expected start.

Apart from the pass on purpose: nothing here is on the critical path. A driver asks for it when
someone asks (``mosaic explain``) or for a bounded number of audit records per cycle; the pass
itself only records each tried job's reason (``core.Scheduler.reason_of``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from libs.policy import filters as F
from libs.policy.cluster import EPS
from libs.policy.daynight import in_force, kind_boost
from libs.policy.priority import score_arrays
from libs.policy.queue import QueueArrays
from libs.policy.types import PendingJob
from proto.decisions import WaitNumbers

if TYPE_CHECKING:
    from libs.policy.core import Scheduler


def queue_rank(sched: Scheduler, row: int, score: float) -> int:
    """1 + how many queued jobs rank before row ``row`` with ``score`` (higher score first,
    then earlier enqueued, then earlier queued: the pass's order). Jobs not scored yet (no pass
    reached them since they queued) rank after every scored one."""
    q = sched.queue
    s, e, seq = np.nan_to_num(q.cached_scores(), nan=-np.inf), q.enq(), q.seq()
    s0, e0, q0 = score, e[row], seq[row]
    before = (s > s0) | ((s == s0) & ((e < e0) | ((e == e0) & (seq < q0))))
    return 1 + int(np.count_nonzero(before))


def closest_node(sched: Scheduler, job: PendingJob) -> tuple[str | None, str]:
    """(the node that could hold the job that lacks the least now, what it lacks in words).

    Among nodes that could hold it empty (shape, memory, constraints), the one with the most
    free GPU capacity; cordoned nodes count only when no other could."""
    view, spec = sched.view, job.spec
    fits: dict[tuple, bool] = {}  # per node shape: could a node of it hold the job empty
    ok = []
    for i, n in enumerate(view.nodes):
        shape = (n.gpu_model, n.gpu_count, n.gpu_mem_gb, n.host_mem_gb, n.cpus)
        hit = fits.get(shape)
        if hit is None:
            hit = fits[shape] = F.never_fits(spec, [n]) is None
        if hit:
            ok.append(i)
    if not ok:
        return None, "no node could ever hold it"
    open_ = [i for i in ok if not view.cordoned[i]]
    pool = open_ or ok
    frac = F.is_fractional(spec)
    free = view.gpu_free if frac else view.whole_free
    best = max(pool, key=lambda i: (float(np.max(free[i])) if frac else float(free[i]), -i))
    node = view.node_ids[best]
    if not open_:
        return node, "cordoned (or down, or asleep)"
    if frac:
        have = float(np.max(view.gpu_free[best]))
        if have + EPS < spec.gpus:
            return node, f"a GPU with {spec.gpus:g} free (best has {have:g})"
    else:
        have_w = int(view.whole_free[best])
        need = F.whole_gpus(spec)
        if have_w < need:
            return node, f"{need - have_w} more free GPUs ({have_w} of {need} free)"
    host, cpus = float(view.host_mem_free_gb[best]), float(view.cpus_free[best])
    if host + EPS < spec.host_mem_gb:
        return node, f"host memory: {spec.host_mem_gb:g} GB asked, {host:g} GB free"
    if cpus + EPS < spec.cpus:
        return node, f"CPUs: {spec.cpus:g} asked, {cpus:g} free"
    return node, "nothing now: the policy holds the job back (see its reason)"


def explain_wait(sched: Scheduler, job: PendingJob, now: float) -> WaitNumbers:
    """The wait of queued ``job`` now (see the module docstring)."""
    q = sched.queue
    row = q.position(job.spec.id)
    one = QueueArrays.from_jobs([job])
    cfg, period = sched.daynight.at(now)  # the day/night period in force, as the pass ranks
    fresh, terms, reg = score_arrays(
        one,
        now=now,
        load=sched.view.load(),
        tenant_usage=sched.usage,
        capacity=sched.view,
        cfg=cfg,
        profiles=sched.profiles,
        n_tenants=q.tenant_count(sched.usage),
    )
    shown = {k: round(float(v[0]), 6) for k, v in terms.items()}
    boost = kind_boost(one.inference, cfg)
    if boost is not None:  # the score the period adds to its kind (libs.policy.daynight)
        shown["day_night"] = round(float(boost[0]), 6)
    node, lacks = closest_node(sched, job)
    resv_node, start = None, None
    last = sched.last
    if last is not None:
        for r in (last.reservation, *last.extra_reservations):
            if r is not None and r.job_id == job.spec.id:
                resv_node, start = r.node_id, float(r.start)
    # its score as the pass orders by (kept for the rank epoch), or as of now if no pass has
    # scored it yet
    score = float(q.cached_scores()[row])
    if not np.isfinite(score):
        score = float(fresh[0])
    return WaitNumbers(
        rank=queue_rank(sched, row, score),
        queued=len(q),
        score=round(score, 6),
        terms=shown,
        regime=reg,
        period=period,
        policy=in_force(cfg, reg),
        best_node=node,
        lacks=lacks,
        reservation_node=resv_node,
        expected_start_s=start,
    )
