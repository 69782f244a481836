"""Tiresias' queues kept up to date event by event, so that no pass sorts the whole queue.

Why: on the full Philly trace the waiting queue grows to thousands of jobs, and every instant
Tiresias sorted it (twice: the pass and the preemption step) and scanned every waiting and
running job for the next instant its queues change: work proportional to the queue at every
event, quadratic over a bursty trace (20,000 jobs: 200 s on 1,024 GPUs). The definitions do
not change here, only when they are evaluated:

- A waiting job's queue is fixed while it waits (its service does not grow), except by a
  STARVELIMIT promotion, so the waiting jobs are kept in one list per queue, sorted by
  (arrival, idx): the scan order is the lists in turn, no sort.
- A promotion happens at the first look after ``enqueue_s + STARVE_FACTOR x run_s``: a heap of
  those instants, popped at each look (the exact test of ``Tiresias.queue_of`` decides, so a
  float rounding at the edge is decided as before).
- The next demotion of a running job is ``start + (boundary - service at start) / GPUs``,
  fixed for the attempt: a heap of those too. The instant handed to the engine is the exact
  expression ``Tiresias.next_move_s`` always computed, evaluated on the heap's front entries
  only (those within ``NEAR_S`` of the best found: any could be the minimum after rounding).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterator

from libs.sim.cluster import EPS
from libs.sim.state import PENDING, SimJob

NEAR_S = 1e-3  # heap entries this close to the front are evaluated exactly (rounding is ~1e-9)


class TiresiasQueues:
    """The waiting jobs per queue, and the next instants a promotion or demotion is due."""

    def __init__(self, boundaries_gpu_s: tuple[float, ...], starve_factor: float):
        self.boundaries = boundaries_gpu_s
        self.starve_factor = starve_factor
        self.waiting: list[list[tuple[float, int]]] = [[] for _ in range(len(boundaries_gpu_s) + 1)]
        self.queue_of: dict[int, int] = {}  # waiting job idx -> its queue
        self.jobs: dict[int, SimJob] = {}  # waiting jobs
        self._promote: list[tuple[float, int, float]] = []  # (due at, idx, enqueue_s)
        self._due: dict[int, tuple[float, float]] = {}  # popped, not yet promoted: (due, enq)
        self._demote: list[tuple[float, int, int, float]] = []  # (about when, idx, token, b)

    # ----- waiting jobs -------------------------------------------------------------------
    def queue_for_service(self, served_gpu_s: float) -> int:
        return sum(served_gpu_s >= b - EPS for b in self.boundaries)

    def add(self, job: SimJob, served_gpu_s: float) -> None:
        """``job`` waits again with this service (GPU-seconds since its last promotion)."""
        q = self.queue_for_service(served_gpu_s)
        self.jobs[job.idx] = job
        self.queue_of[job.idx] = q
        bisect.insort(self.waiting[q], (job.submit_s, job.idx))
        if job.run_s > 0:
            due_s = job.enqueue_s + self.starve_factor * job.run_s  # as next_move_s computes it
            heapq.heappush(self._promote, (due_s, job.idx, job.enqueue_s))

    def remove(self, job: SimJob) -> None:
        q = self.queue_of.pop(job.idx, None)
        if q is None:
            return
        del self.jobs[job.idx]
        lst = self.waiting[q]
        del lst[bisect.bisect_left(lst, (job.submit_s, job.idx))]
        self._due.pop(job.idx, None)

    def in_order(self) -> Iterator[SimJob]:
        """The waiting jobs in Tiresias' order: queue, then arrival, then idx."""
        jobs = self.jobs
        for lst in self.waiting:
            for _, idx in lst:
                yield jobs[idx]

    def _live(self, idx: int, enqueue_s: float) -> SimJob | None:
        job = self.jobs.get(idx)
        return job if job is not None and job.enqueue_s == enqueue_s else None

    def promote_due(self, now: float) -> list[SimJob]:
        """Move every waiting job past STARVELIMIT at ``now`` to the top queue; returned so the
        policy restarts their service count (``Tiresias.queue_of``'s test, exactly)."""
        heap = self._promote
        while heap and heap[0][0] <= now + NEAR_S:
            due_s, idx, enq = heapq.heappop(heap)
            if self._live(idx, enq) is not None:
                self._due[idx] = (due_s, enq)
        promoted: list[SimJob] = []
        for idx, (_, enq) in list(self._due.items()):
            job = self._live(idx, enq)
            if job is None or job.state != PENDING:
                del self._due[idx]
            elif now - job.enqueue_s > self.starve_factor * job.run_s:
                del self._due[idx]
                promoted.append(job)
                q = self.queue_of[idx]
                if q:
                    lst = self.waiting[q]
                    del lst[bisect.bisect_left(lst, (job.submit_s, idx))]
                    bisect.insort(self.waiting[0], (job.submit_s, idx))
                    self.queue_of[idx] = 0
        return promoted

    def next_promotion_s(self, now: float) -> float:
        """The earliest STARVELIMIT instant after ``now`` (inf: none)."""
        heap = self._promote
        while heap and heap[0][0] <= now:
            due_s, idx, enq = heapq.heappop(heap)
            if self._live(idx, enq) is not None:
                self._due[idx] = (due_s, enq)
        soon = math.inf
        while heap and self._live(heap[0][1], heap[0][2]) is None:
            heapq.heappop(heap)
        if heap:
            soon = heap[0][0]
        for idx, (due_s, enq) in self._due.items():  # popped early at a look (NEAR_S)
            if due_s > now and self._live(idx, enq) is not None:
                soon = min(soon, due_s)
        return soon

    # ----- running jobs -------------------------------------------------------------------
    def started(self, job: SimJob, served_gpu_s: float, now: float) -> None:
        """A running attempt: when its service would cross each boundary above it."""
        if job.spec.gpus <= 0:
            return
        for b in self.boundaries:
            if b > served_gpu_s + EPS:
                at = now + (b - served_gpu_s) / job.spec.gpus
                heapq.heappush(self._demote, (at, job.idx, job.token, b))

    def next_demotion_s(self, exact: Callable[[int, int, float], float | None]) -> float:
        """The earliest instant a running job's service crosses a boundary (inf: none).

        ``exact(idx, token, boundary)``: the instant by ``Tiresias.next_move_s``'s own
        expression, or None when the entry is stale (the attempt ended or is checkpointing) or
        the boundary is already crossed; such entries are dropped for good (service only grows
        during an attempt). Entries are evaluated front first until the next one is more than
        ``NEAR_S`` after the best found (its exact instant cannot be earlier).
        """
        heap = self._demote
        soon = math.inf
        keep = []
        while heap and heap[0][0] <= soon + NEAR_S:  # a later entry cannot beat soon
            e = heapq.heappop(heap)
            at = exact(e[1], e[2], e[3])
            if at is not None:
                keep.append(e)
                soon = min(soon, at)
        for e in keep:
            heapq.heappush(heap, e)
        return soon
