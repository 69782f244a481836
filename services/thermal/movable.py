"""Which running jobs the guard asks to move: the caller's predicate of the guard's definition.

Why the placer's own rule and not one of our own: the placer commits or refuses every move
with ``libs.policy.stages.preempt`` (never an inference job, never one neither checkpointable
nor elastic, not in the first minutes of an attempt, not one that could not resume within its
bound). The guard asks the same definition, on the ledger as it stands, so a refusal is news
(a move the guard could not know of, a node cordoned meanwhile), not routine. It cannot know
when a job was last moved (the placer's rate limit): that refusal comes back with its reason.

The cluster view is built only when the guard is about to migrate (a hot node, once a
window), and once per decision: a sample of a cool node costs nothing here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from libs.policy.config import PolicyConfig
from libs.policy.ledger_view import ledger_cluster
from libs.policy.profiles import ProfileTable
from libs.policy.stages import preempt as P
from libs.policy.stages.thermal import NodeJob
from libs.policy.types import RunningJob
from proto.ledger import Allocation
from proto.nodes import NodeSpec


def movable_now(
    nodes: Mapping[str, NodeSpec],
    ledger: Mapping[str, Allocation],
    now: float,
    cfg: PolicyConfig,
    profiles: ProfileTable,
) -> Callable[[NodeJob], bool]:
    """The predicate for one decision at ``now``: may this attempt move, by the placer's rule?
    (Built on first use: most samples never ask.)"""
    built: list[tuple[Callable[[RunningJob], bool], dict[str, RunningJob]]] = []

    def movable(job: NodeJob) -> bool:
        alloc = ledger.get(job.job_id)
        if alloc is None or alloc.attempt != job.attempt:
            return False  # no longer this attempt: the placer would call it stale
        if not built:
            view, running, facts = ledger_cluster(nodes, ledger, profiles)
            rule = P.movable_predicate(facts, view, list(running.values()), now, cfg)
            built.append((rule, running))
        rule, running = built[0]
        rj = running.get(job.job_id)
        return rj is not None and rule(rj)

    return movable
