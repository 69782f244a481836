"""Preempt: the stage between reserve/backfill and power, left ready for the next issue.

A pass does not preempt yet: ``plan`` decides nothing. The next issue fills it in (elastic,
checkpointable jobs only, DESIGN.md's defragmenter); the pass already calls it in its place
(``scheduler.schedule`` does not, until it returns decisions), so its inputs are named here.
"""

from __future__ import annotations

from collections.abc import Sequence

from libs.policy.types import PendingJob, RunningJob


def plan(blocked: Sequence[PendingJob], running: Sequence[RunningJob]) -> tuple[str, ...]:
    """The ids of running jobs to preempt for the blocked jobs (best ranked first): none yet."""
    del blocked, running
    return ()
