"""What a row's step does with its answer (``step.Pass.try_row``): start it on the view, or
record why it waits and what later rows of the pass may learn from that (the failed-shape
memo, the shapes refused on slow GPUs or only on reserved nodes, the blocked jobs backfill
protects), and the backfill onto a reserved node that a refusal may still allow.

A part of ``step.Pass`` (a mixin) apart from the step itself: the step decides, these keep
the pass's memory of each decision consistent (``Pass`` owns the fields they read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from libs.policy import gang_pass as GP
from libs.policy.cluster import EPS
from libs.policy.fast.codes import fast_nodes
from libs.policy.fast.reservations import protected, running_set, try_reserved_node
from libs.policy.stages.share import INTERFERENCE
from libs.policy.types import PendingJob, Placement, Refusal

if TYPE_CHECKING:
    from libs.policy.step import Pass


class RowOutcomes:
    """``step.Pass``'s bookkeeping of each row's answer (see the module docstring)."""

    def _blocked(self: Pass, job: PendingJob) -> None:
        """A job waits on Resources: the head backfill protects, or one of the extra ones."""
        if self.head is None:
            self.head = job
        elif len(self.extra_heads) < self.max_extra:
            self.extra_heads.append(job)

    def _fast_mask(self: Pass, code: int, mask: np.ndarray | None) -> np.ndarray:
        """The nodes neither reserved nor of a model slow-model ``code`` holds off."""
        both = self._combined.get((code, mask is None))
        if both is None:
            fast = fast_nodes(code, self.view)
            both = self._combined[(code, mask is None)] = fast if mask is None else mask & fast
        return both

    def _ends_after_reserved(self: Pass, job: PendingJob) -> bool:
        """This shape fits nowhere but reserved nodes, where it would delay their jobs
        (placements in a pass only take resources): only a job ending before some reserved
        start could still go there."""
        prot = protected(self.head, self.reservation, self.extras)
        latest = max(r.start for _, r in prot)
        view = self.view
        fastest = min(
            self.profiles.runtime_s(job.spec, view.models[view.model_idx[r.node_index]])
            for _, r in prot
        )
        return self.now + fastest * (1.0 - job.progress) > latest + EPS

    def _slow_refused(self: Pass, i: int, job_id: str, key: tuple, code: int) -> None:
        """It fits somewhere, but only on slow GPUs (or reserved nodes): wait for a fast one;
        memoised for this pass only (placements in a pass only take resources; the slow set
        depends on the wait). A "Resources" refusal means it fits on no node at all, slow or
        fast: the same answer the failed-shape memo and the largest-block check give, so it
        is handled like any other job's (``_refused``)."""
        self.waiting[job_id] = "SlowGPU"
        self.slow_fail.add((key, code))
        if self.dead is not None:
            self.dead.slow_refused(int(self.shape_of[i]), code)
            self.walked.refilter()

    def _backfill_reserved(self: Pass, job: PendingJob, res: Refusal) -> Placement | Refusal:
        self.rel, self.rel_owned = running_set(self.rel, self.rel_owned, self.running, self.started)
        for h, r in protected(self.head, self.reservation, self.extras):
            if self.is_gang(h):
                res = GP.backfill_ok(job, r, self.view, self.profiles, self.cfg, self.ctx, self.now)
            else:
                res = try_reserved_node(
                    job, h, r, self.view, self.profiles, self.cfg, self.ctx, self.rel, self.now
                )
            if isinstance(res, Placement):
                break
        return res

    def _start(self: Pass, job: PendingJob, res: Placement) -> None:
        spec, view, now = job.spec, self.view, self.now
        alloc, nodes = GP.allocation_of(spec, res, now, job.attempt)  # a gang: every node
        before = [(i, int(view.whole_free[i]), float(view.gpu_free[i].max())) for i in nodes]
        view.allocate(alloc)
        self.assignments.append((job, res))
        if self.headroom:  # the whole free GPUs this start took, on every node it holds
            self.free_gpus -= sum(w - int(view.whole_free[i]) for i, w, _ in before)
        model = view.models[view.model_idx[res.node_index]]
        end = now + self.profiles.runtime_s(spec, model) * (1.0 - job.progress)
        for rj in GP.running_of(alloc, spec, res, view, end):
            self.started.append(rj)
            if self.rel is not None and self.rel_owned:
                self.rel.add(rj)
        for i, whole_before, share_before in before:
            self.max_whole, self.max_share = self._largest.after_placement(
                i, whole_before, share_before
            )
        if self.dead is not None:
            self.dead.block(self.max_share, self.max_whole)
            self.walked.refilter()

    def _refused(self: Pass, i: int, job: PendingJob, key: tuple, res: Refusal, held: bool) -> None:
        self.waiting[job.spec.id] = res.reason
        if res.reason == INTERFERENCE:  # the class decides, not the shape: never memoised
            return
        if res.reason != "Reserved":
            self.failed[key] = res.reason
            if self.dead is not None:
                self.dead.failed_shapes((int(self.shape_of[i]),))
                self.walked.refilter()
        elif not held:
            self.resv_fail.add(key)
        if res.reason == "Resources":
            self._blocked(job)
