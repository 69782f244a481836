"""Preempt: the stage between reserve/backfill and power, left ready for the next issue.

Nothing is preempted yet: ``plan`` decides nothing and the pass does not call it. The next
issue fills it in (elastic, checkpointable jobs only: DESIGN.md's defragmenter sends preempt
intents the placer checks) and calls it from ``scheduler.schedule`` after the walk, with the
blocked jobs the pass found and the running set.
"""

from __future__ import annotations

from collections.abc import Sequence

from libs.policy.types import PendingJob, RunningJob


def plan(blocked: Sequence[PendingJob], running: Sequence[RunningJob]) -> tuple[str, ...]:
    """The ids of running jobs to preempt for the blocked jobs (best ranked first): none yet."""
    del blocked, running
    return ()
