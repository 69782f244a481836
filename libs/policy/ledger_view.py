"""The cluster as a ledger says it is: what a service that does not own the scheduler plans on.

Why a definition of its own: the defragmenter and the thermal guard plan moves on the ledger
(KV ``ledger``) and the node specs, with the same protection rules the placer applies
(``stages.preempt``). Both need the same view of it: every allocation applied to a view of the
nodes, the running jobs with their expected ends, and each attempt's history for the rules.
An entry without its spec, on an unknown node or overlapping another is left out (the placer
reconciles such; a planner only skips it).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

from libs.policy.cluster import ClusterView
from libs.policy.profiles import ProfileTable
from libs.policy.stages.preempt import MoveFacts
from libs.policy.types import RunningJob
from proto.ledger import Allocation
from proto.nodes import NodeSpec


def ledger_cluster(
    nodes: Mapping[str, NodeSpec],
    ledger: Mapping[str, Allocation],
    profiles: ProfileTable,
    moved_at: Mapping[str, float] | None = None,
) -> tuple[ClusterView, dict[str, RunningJob], dict[str, MoveFacts]]:
    """The view (nodes in id order, every sound allocation applied), the running jobs by id
    (expected end: the allocation's time plus the profile's runtime there), and their move
    facts (the attempt's start; the last move when ``moved_at`` knows it)."""
    view = ClusterView.build([nodes[k] for k in sorted(nodes)])
    running: dict[str, RunningJob] = {}
    facts: dict[str, MoveFacts] = {}
    moved = moved_at or {}
    for a in ledger.values():
        if a.node not in nodes or a.spec is None:
            continue
        with contextlib.suppress(ValueError):  # overlaps another entry: skipped
            view.allocate(a)
            i = view.index[a.node]
            end = a.time + profiles.runtime_s(a.spec, view.nodes[i].gpu_model)
            running[a.job_id] = RunningJob.from_allocation(
                a, i, end if math.isfinite(end) else a.time
            )
            facts[a.job_id] = MoveFacts(started_at=a.time, last_moved_at=moved.get(a.job_id))
    return view, running, facts
