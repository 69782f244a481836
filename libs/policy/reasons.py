"""Why each queued job waits (``squeue``'s REASON), kept so that it does not flap.

The pass records a reason for every job it tried (``CycleResult.waiting``). A pass between
backfills stops at the first blocked job, so the jobs below it keep the reason their last
backfill pass gave them (else their REASON would flap between passes while nothing changed); a
backfill pass walks as far as it can, so a job it did not reach waits on Priority. A job waiting
for capacity while a node that could hold it boots waits on NodeWaking.

Changes are tracked (``changes``) so a driver that publishes reasons sends only what changed: a
queue of 100,000 that stands still costs nothing. Tracking starts with the first ``changes``
call: until then every queued job counts as changed (none was handed out), which is what the
tracking would say, so a driver that never asks (the simulator) pays nothing for it per pass
(``test_reasons.py`` checks the changes handed out are those of tracking from the start).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from libs.policy import filters as F
from libs.policy.cluster import ClusterView
from libs.policy.decisions import NODE_WAKING, PRIORITY
from libs.policy.queue import PendingQueue
from libs.policy.types import CycleResult


class WaitReasons:
    """The reasons of one scheduler's queue (see the module docstring)."""

    def __init__(
        self, queue: PendingQueue, view: ClusterView, booting: Callable[[], np.ndarray]
    ) -> None:
        self.queue = queue
        self.view = view
        self._booting = booting  # bool[N]: nodes booting now
        self._why: dict[str, str] = {}  # job -> reason of its last wait, for jobs a pass tried
        self._told: dict[str, str] = {}  # job -> the reason last handed out (changes)
        # queued jobs whose reason may differ from _told; None until ``changes`` is first
        # asked (then every queued job: none was handed out yet)
        self._dirty: set[str] | None = None
        self._was_waking: bool | None = False

    @property
    def told(self) -> dict[str, str]:
        """Queued job -> the reason last handed out by ``changes`` (read-only by convention)."""
        return self._told

    def queued(self, job_id: str) -> None:
        if self._dirty is not None:
            self._dirty.add(job_id)

    def forget(self, job_id: str) -> None:
        """The job left the queue (started, cancelled)."""
        self._why.pop(job_id, None)
        self._told.pop(job_id, None)
        if self._dirty is not None:
            self._dirty.discard(job_id)

    def note(self, res: CycleResult, full: bool) -> None:
        """After a pass (``full``: a backfill pass)."""
        placed = {pj.spec.id for pj, _ in res.assignments} if res.assignments else ()
        old, dirty = self._why, self._dirty
        if full:
            new = {j: r for j, r in res.waiting.items() if j not in placed}
            if dirty is not None:
                dirty.update(j for j in old if new.get(j) != old[j])
                dirty.update(j for j in new if old.get(j) != new[j])
            self._why = new
        else:
            for j in placed:
                old.pop(j, None)
            for j, r in res.waiting.items():
                if j not in placed and old.get(j) != r:
                    old[j] = r
                    if dirty is not None:
                        dirty.add(j)
        if dirty is None:  # nobody asked for changes yet: every queued job counts as changed
            return
        waking = bool(self._booting().any())
        if waking != self._was_waking:  # NodeWaking may now apply, or no longer
            self._was_waking = waking
            dirty.update(self._why)

    def of(self, job_id: str) -> str:
        """Why a queued job waits (``decisions.WAIT_REASONS`` or a filter's refusal code)."""
        why = self._why.get(job_id, PRIORITY)
        booting = self._booting()
        if why != PRIORITY and booting.any():
            job = self.queue.get(job_id)
            nodes = [self.view.nodes[i] for i in np.flatnonzero(booting).tolist()]
            if job is not None and F.never_fits(job.spec, nodes) is None:
                return NODE_WAKING
        return why

    def all(self) -> dict[str, str]:
        """Every queued job's reason (jobs never tried wait on Priority)."""
        return {j.spec.id: self.of(j.spec.id) for j in self.queue}

    def changes(self, limit: int) -> dict[str, str]:
        """Up to ``limit`` queued jobs whose reason changed since it was last handed out,
        with the new reason (a newly queued job counts)."""
        if self._dirty is None:  # the first ask: every queued job, none was handed out yet
            self._dirty = {j.spec.id for j in self.queue}
            self._was_waking = None  # unknown: the next pass looks at every reason again
        out: dict[str, str] = {}
        while self._dirty and len(out) < limit:
            job = self._dirty.pop()
            if job not in self.queue:
                continue
            why = self.of(job)
            if self._told.get(job) != why:
                self._told[job] = why
                out[job] = why
        return out
