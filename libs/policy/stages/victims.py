"""Victims: which running jobs on one node a plan stops, and the two searches every plan makes
(the definitions; ``fast.plans.PlanMemo`` is their memo).

Why apart from ``stages.preempt``: the priority-protection, boot-protection, short-wait and
burst rules all pick victims the same way (the fewest cheapest on one node, an elastic one
shrunk instead of stopped when a size it may take is enough) and search rooms for them the same
way (``stages.resume.resume_rooms``); ``PlanSearch`` is the seam where the memo answers the
same from what it remembers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.stages.resume import Release, fits_after_release, resume_rooms
from libs.policy.stages.shrink import shrink_floor
from libs.policy.types import PendingJob, RunningJob
from proto.jobs import JobSpec


def shrink_to_fit(
    spec: JobSpec, view: ClusterView, i: int, chosen: Sequence[Release], victim: RunningJob
) -> int:
    """The largest size ``victim`` (elastic, on node ``i``) may shrink to after which ``spec``
    fits there beside ``chosen``; 0 when no size it may take is enough (stop it whole)."""
    floor = shrink_floor(victim.spec)
    if floor is None or victim.gpu_share < 1.0 - EPS:
        return 0
    for keep in range(len(victim.gpu_indices) - 1, floor - 1, -1):
        if fits_after_release(spec, view, i, [*chosen, (victim, keep)]):
            return keep
    return 0


def node_victims(
    blocked: PendingJob,
    i: int,
    candidates: list[tuple[float, float, RunningJob]],
    view: ClusterView,
    most: int,
) -> list[Release] | None:
    """The fewest cheapest victims (at most ``most``) on node ``i`` after which ``blocked``
    fits, each shrunk when it is elastic and a size it may take is enough, or None."""
    chosen: list[Release] = []
    for _, _, r in candidates[:most]:
        chosen.append((r, shrink_to_fit(blocked.spec, view, i, chosen, r)))
        if fits_after_release(blocked.spec, view, i, chosen):
            return chosen
    return None


class PlanSearch(Protocol):
    """The two searches a plan makes per node and per option: ``node_victims`` and
    ``resume_rooms``. ``DEFINITIONS`` runs them; ``fast.plans.PlanMemo`` answers the same
    from what it remembers of the nodes they read (tested equal over replays)."""

    def victims(
        self,
        blocked: PendingJob,
        i: int,
        candidates: list[tuple[float, float, RunningJob]],
        view: ClusterView,
        most: int,
    ) -> list[Release] | None: ...

    def rooms(
        self,
        stopped: Sequence[RunningJob],
        view: ClusterView,
        soon_free: np.ndarray,
        cfg: PolicyConfig,
        exclude: int,
        speed: np.ndarray | None = None,
    ) -> dict[str, int] | None: ...


class _Definitions:
    """``PlanSearch`` by the definitions (no memory)."""

    def victims(self, blocked, i, candidates, view, most):  # type: ignore[no-untyped-def]
        return node_victims(blocked, i, candidates, view, most)

    def rooms(self, stopped, view, soon_free, cfg, exclude, speed=None):  # type: ignore[no-untyped-def]
        return resume_rooms(stopped, view, soon_free, cfg, exclude=exclude, speed=speed)


DEFINITIONS: PlanSearch = _Definitions()
