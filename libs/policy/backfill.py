"""EASY backfill: a reservation for the blocked head job, and the rule that protects it.

The head job (highest rank that cannot start for lack of free resources) reserves the node where
it can start earliest, computed from running jobs' expected end times. A job below it may still
start now if it cannot delay that start: it lands on another node, or, on the reserved node, it
ends before the reserved start or leaves the head job's earliest start unchanged (it uses GPUs
the reservation does not need). Expected end times are estimates; a job that overran counts as
ending now.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from libs.policy import fast as K
from libs.policy import filters as F
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.types import Reservation, RunningJob
from proto.jobs import JobSpec


@dataclass(frozen=True, slots=True)
class Release:
    """Resources a running job gives back at ``end`` on one node."""

    end: float
    gpu_indices: tuple[int, ...]
    share: float
    gpu_mem_gb: float
    host_mem_gb: float
    cpus: float

    @classmethod
    def of(cls, r: RunningJob, now: float) -> Release:
        s = r.spec
        end = max(r.expected_end, now)
        return cls(end, r.gpu_indices, r.gpu_share, s.gpu_mem_gb, s.host_mem_gb, s.cpus)


class RunningSet:
    """Running jobs grouped by node, for reservations. Keep one alive across passes (``add`` /
    ``remove`` as jobs start and end) and a reservation costs a few nodes' worth of work
    instead of a walk over every running job. ``Release`` lists are built and sorted lazily per
    node; an overrun job (expected end in the past) counts as ending ``now``."""

    def __init__(self, running: Iterable[RunningJob] = (), base: RunningSet | None = None) -> None:
        """``base``: a set this one extends without copying or changing it (a pass adds the
        jobs it starts to an overlay over the caller's set)."""
        self._base = base
        self._by_node: dict[int, dict[str, RunningJob]] = {}
        self._node_of: dict[str, int] = {}
        self._built: dict[int, list[RunningJob]] = {}
        self._first: dict[int, float] | None = None  # node -> earliest expected end, lazily
        self._first_arr: np.ndarray | None = None  # the same per node index, inf where none
        self._last_arr: np.ndarray | None = None  # ``last_end_array``, lazily
        by_node, node_of = self._by_node, self._node_of
        for r in running:  # the body of ``add``, inlined: built once per pass from a list
            n = r.node_index
            d = by_node.get(n)
            if d is None:
                d = by_node[n] = {}
            d[r.spec.id] = r
            node_of[r.spec.id] = n

    def add(self, r: RunningJob) -> None:
        self._by_node.setdefault(r.node_index, {})[r.spec.id] = r
        self._node_of[r.spec.id] = r.node_index
        self._built.pop(r.node_index, None)
        if self._first is not None:
            old = self._first.get(r.node_index, float("inf"))
            self._first[r.node_index] = m = min(old, r.expected_end)
            self._set_first(r.node_index, m)
        last = self._last_arr
        if last is not None:
            if r.node_index < len(last):
                last[r.node_index] = max(last[r.node_index], r.expected_end)
            else:
                self._last_arr = None

    def remove(self, job_id: str) -> RunningJob:
        n = self._node_of.pop(job_id)
        self._built.pop(n, None)
        r = self._by_node[n].pop(job_id)
        if self._first is not None and self._first.get(n) == r.expected_end:
            # the node's earliest end may have moved later: recompute that node only
            d = self._by_node[n]
            if self._base is not None:
                self._first = self._first_arr = None
            elif d:
                self._first[n] = m = min(j.expected_end for j in d.values())
                self._set_first(n, m)
            else:
                del self._first[n]
                self._set_first(n, float("inf"))
        last = self._last_arr
        if last is not None and n < len(last) and last[n] == r.expected_end:
            if self._base is not None:  # the base's jobs there: rebuild when next asked
                self._last_arr = None
            else:  # the node's last end may have moved earlier: that node only
                d = self._by_node[n]
                last[n] = max((j.expected_end for j in d.values()), default=-np.inf)
        return r

    def _set_first(self, node: int, end: float) -> None:
        arr = self._first_arr
        if arr is not None:
            if node < len(arr):
                arr[node] = end
            else:
                self._first_arr = None

    def __len__(self) -> int:
        return len(self._node_of) + (len(self._base) if self._base is not None else 0)

    def __iter__(self) -> Iterator[RunningJob]:
        if self._base is not None:
            yield from self._base
        for d in self._by_node.values():
            yield from d.values()

    def on_node(self, node: int) -> list[RunningJob]:
        """Running jobs on ``node`` sorted by expected end."""
        hit = self._built.get(node)
        if hit is None:
            own = self._by_node.get(node)
            if not own and self._base is not None:
                hit = self._base.on_node(node)  # nothing added on this node: share the base's
            else:
                jobs = list(own.values()) if own else []
                if self._base is not None:
                    jobs += self._base.on_node(node)
                hit = sorted(jobs, key=_end)
            self._built[node] = hit
        return hit

    def first_ends(self) -> dict[int, float]:
        """node -> earliest expected end of its running jobs (nodes without jobs absent);
        kept up to date by ``add``/``remove`` once built. Treat as read-only."""
        if self._first is None:
            first: dict[int, float] = {} if self._base is None else dict(self._base.first_ends())
            for n, d in self._by_node.items():
                if d:
                    m = min(r.expected_end for r in d.values())
                    first[n] = min(m, first.get(n, m))
            self._first = first
        return self._first

    def first_end_array(self, n_nodes: int) -> np.ndarray:
        """float[n_nodes]: ``first_ends`` as an array (inf for a node without jobs), kept up to
        date with it by ``add``/``remove`` once built: a reservation reads it whole, and a set
        kept across passes changes on a node or two between them. Read-only."""
        arr = self._first_arr
        if arr is None or len(arr) != n_nodes:
            arr = np.full(n_nodes, float("inf"))
            first = self.first_ends()
            if first:
                k = len(first)
                arr[np.fromiter(first.keys(), np.int64, k)] = np.fromiter(first.values(), float, k)
            self._first_arr = arr
        return arr

    def last_end_array(self, n_nodes: int) -> np.ndarray:
        """float[n_nodes]: the last expected end of each node's running jobs (-inf for a node
        without jobs), when the node is empty (a gang's reservation, ``gang_pass.free_at``);
        kept up to date by ``add``/``remove`` once built, as ``first_end_array``. Read-only."""
        arr = self._last_arr
        if arr is None or len(arr) != n_nodes:
            if self._base is None:
                arr = np.full(n_nodes, -np.inf)
            else:
                arr = self._base.last_end_array(n_nodes).copy()
            for n, d in self._by_node.items():
                if d and n < n_nodes:
                    arr[n] = max(float(arr[n]), max(r.expected_end for r in d.values()))
            self._last_arr = arr
        return arr

    def first_end(self, node: int) -> float:
        return self.first_ends().get(node, float("inf"))

    def get(self, node: int, now: float) -> list[Release]:
        return [Release.of(r, now) for r in self.on_node(node)]


def _end(r: RunningJob) -> float:
    return r.expected_end


def fits_slots(spec: JobSpec, free, mem, host: float, cpus: float) -> bool:
    """Would ``spec`` fit one node with these free GPU shares and GPU memory (per slot), host
    memory and CPUs? Plain Python on a node's few GPU slots (faster than numpy at this size);
    ``stages.preempt`` asks it of a node as it would be once some jobs stopped."""
    if host < spec.host_mem_gb - EPS or cpus < spec.cpus - EPS:
        return False
    if F.is_fractional(spec):
        need, need_mem = spec.gpus - EPS, spec.gpu_mem_gb - EPS
        return any(f >= need and m >= need_mem for f, m in zip(free, mem, strict=True))
    return sum(1 for f in free if f >= 1.0 - EPS) >= F.whole_gpus(spec)


def _earliest_start_jobs(
    spec: JobSpec, view: ClusterView, node: int, jobs: Sequence[RunningJob], now: float
) -> float:
    """When ``spec`` could start on ``node`` as the running jobs there end, in order of
    expected end (inf if never): the reservation's inner loop. An overrun job counts as
    ending ``now``."""
    g = int(view.gpu_total[node])
    free = view.gpu_free[node, :g].tolist()
    mem = view.gpu_mem_free_gb[node, :g].tolist()
    host = float(view.host_mem_free_gb[node])
    cpus = float(view.cpus_free[node])
    if fits_slots(spec, free, mem, host, cpus):
        return now
    if not F.is_fractional(spec):
        # whole GPUs: count fully free GPUs as releases cross 1.0 instead of rescanning
        k, one = F.whole_gpus(spec), 1.0 - EPS
        need_host, need_cpus = spec.host_mem_gb - EPS, spec.cpus - EPS
        whole = sum(1 for f in free if f >= one)
        for r in jobs:
            s = r.spec
            for j in r.gpu_indices:
                was = free[j]
                free[j] = was + r.gpu_share
                if was < one <= free[j]:
                    whole += 1
            host += s.host_mem_gb
            cpus += s.cpus
            if whole >= k and host >= need_host and cpus >= need_cpus:
                return max(r.expected_end, now)
        return float("inf")
    for r in jobs:
        s = r.spec
        for j in r.gpu_indices:
            free[j] += r.gpu_share
            mem[j] += s.gpu_mem_gb
        host += s.host_mem_gb
        cpus += s.cpus
        if fits_slots(spec, free, mem, host, cpus):
            return max(r.expected_end, now)
    return float("inf")


def _earliest_start_memo(
    spec: JobSpec,
    view: ClusterView,
    node: int,
    jobs: list[RunningJob],
    now: float,
    memo: dict,
) -> float:
    """``_earliest_start_jobs``, memoised per node for one request shape (``memo``: node ->
    (node_gen, jobs, unclamped start), the shape's entry of the view's memo) while the node
    is unchanged (``view.node_gen``) and its running jobs are the same list
    (``RunningSet.on_node`` builds a new one when they change): a reservation is searched
    again whenever anything in the cluster changed, yet most nodes it visits did not. ``now``
    only clamps the answer (an overrun job ends ``now``), so the memo keeps the unclamped
    one."""
    gen = view.node_gen[node]
    hit = memo.get(node)
    if hit is None or hit[0] != gen or hit[1] is not jobs:
        t = _earliest_start_jobs(spec, view, node, jobs, -np.inf)
        hit = memo[node] = (int(gen), jobs, t)
    t = hit[2]
    return now if t == -np.inf else max(t, now)


def reserve(
    job_id: str,
    spec: JobSpec,
    view: ClusterView,
    running: Iterable[RunningJob] | RunningSet,
    *,
    now: float,
    cfg: PolicyConfig,
    exclude: np.ndarray | None = None,
) -> Reservation | None:
    """The earliest (node, start) for the blocked ``spec``; None when no eligible node ever frees
    enough (e.g. every eligible node is cordoned). ``exclude`` (bool[N]): nodes another
    reservation already holds."""
    rel = running if isinstance(running, RunningSet) else RunningSet(running)
    # eligible: nodes that could hold it and are neither cordoned nor hot (F.available: the
    # cordon and thermal filters, memoised on the view), and not ``exclude``. One that fits
    # now (F.fit_now: memoised per shape until the view changes; the pass already asked it
    # for this job) starts it now: the lowest such node. Otherwise a node needs at least its
    # first release: visit nodes by that lower bound and stop once it is no better than the
    # best exact start found. Ties go to the lowest node index whatever the visiting order:
    # the visiting order moves with ``now`` (an overdue job counts as ending now), the answer
    # must not, or a reservation memoised in an earlier pass (fast.reservations.reserve_head) would
    # differ from a fresh one
    n_nodes = len(view.node_ids)
    now_node, lbs, nodes = K.reserve_candidates(
        F.static_mask(spec, view),
        F.available(view, cfg),
        _no_exclusion(view) if exclude is None else exclude,
        F.fit_now(spec, view, cfg),
        rel.first_end_array(n_nodes),
        float(now),
    )
    best: tuple[float, int] | None = None
    if now_node >= 0:
        best = (now, int(now_node))
    else:
        memo = view.memo.earliest_start.setdefault(F.shape_key(spec), {})
        for lb, n in zip(lbs.tolist(), nodes.tolist(), strict=True):
            if best is not None and (lb, n) > best:
                break
            t = _earliest_start_memo(spec, view, n, rel.on_node(n), now, memo)
            if t < float("inf") and (best is None or (t, n) < best):
                best = (t, n)
    if best is None:
        return None
    return Reservation(job_id, best[1], view.node_ids[best[1]], best[0])


def _no_exclusion(view: ClusterView) -> np.ndarray:
    """bool[N] all False, kept on the view (read-only)."""
    hit = view.shape_memo.no_exclusion
    if hit is None:
        hit = view.shape_memo.no_exclusion = np.zeros(len(view.node_ids), dtype=bool)
        hit.setflags(write=False)
    return hit


def delays(
    head: JobSpec,
    reservation: Reservation,
    view: ClusterView,
    releases: Sequence[Release],
    candidate: Release,
    *,
    now: float,
) -> bool:
    """Would starting ``candidate`` now on the reserved node (not yet allocated in ``view``;
    it holds its resources until ``candidate.end``) push the head job's start later?"""
    if candidate.end <= reservation.start + EPS:
        return False
    n = reservation.node_index
    g = int(view.gpu_total[n])
    free = view.gpu_free[n, :g].tolist()
    mem = view.gpu_mem_free_gb[n, :g].tolist()
    for j in candidate.gpu_indices:
        free[j] -= candidate.share
        mem[j] -= candidate.gpu_mem_gb
    host = float(view.host_mem_free_gb[n]) - candidate.host_mem_gb
    cpus = float(view.cpus_free[n]) - candidate.cpus
    for r in releases:  # sorted by end (RunningSet.get)
        if r.end > reservation.start + EPS:
            break
        for j in r.gpu_indices:
            free[j] += r.share
            mem[j] += r.gpu_mem_gb
        host += r.host_mem_gb
        cpus += r.cpus
    return not fits_slots(head, free, mem, host, cpus)
