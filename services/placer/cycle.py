"""What the placer writes down about a cycle's decisions, apart from deciding them. Pure.

The decisions themselves come from ``libs.policy.core.Scheduler`` (fed by
``services.placer.feed``), the simulator's scheduler. This module turns them into the audit
record's contents: the candidates a placement was up against (``audit_candidates``, for a
bounded number of placements per cycle: explaining every placement on a copy of the view was
most of a cycle's time at cluster scale) and the refusal of a job no node could ever hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from libs.policy.cluster import ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.decisions import Place
from libs.policy.placement import never_fits, place
from libs.policy.profiles import ProfileTable
from libs.policy.types import Candidate, Placement, Refusal
from proto.decisions import CandidateScore
from proto.jobs import JobSpec
from proto.nodes import NodeSpec

INVALID = "invalid job"  # the start of the reason of a refusal by revalidate_spec


@dataclass(frozen=True)
class Refuse:
    spec: JobSpec
    reason: str
    filtered: dict[str, str] = field(default_factory=dict)


def _scores(cands: list[Candidate]) -> tuple[CandidateScore, ...]:
    return tuple(
        CandidateScore(
            node=c.node_id,
            total=round(c.score, 6),
            terms={k: round(v, 6) for k, v in c.terms.items()},
        )
        for c in cands
    )


def chosen_only(p: Placement) -> tuple[CandidateScore, ...]:
    """The audit record of a placement not explained in full: the chosen node's terms."""
    return _scores([Candidate(p.node_id, p.score, dict(p.terms))])


def audit_candidates(
    p: Place, before: ClusterView, profiles: ProfileTable, cfg: PolicyConfig
) -> tuple[CandidateScore, ...]:
    """The top candidates of placement ``p`` on ``before`` (the view as it stood when the job
    was chosen: the caller allocates each placement on it in commit order), chosen included."""
    expl = place(p.job.spec, before, profiles, cfg, explain=True)
    cands: list[Candidate] = list(expl.candidates) if isinstance(expl, Placement) else []
    chosen = p.placement
    if not any(c.node_id == chosen.node_id for c in cands):
        cands.append(Candidate(chosen.node_id, chosen.score, dict(chosen.terms)))
    return _scores(cands)


def never_fits_refusal(
    spec: JobSpec, nodes: Sequence[NodeSpec], profiles: ProfileTable, cfg: PolicyConfig
) -> Refuse:
    """Why no node could ever hold ``spec``, with each node's filter verdict."""
    why = never_fits(spec, nodes) or "no node can ever hold it"
    expl = place(spec, ClusterView.build(nodes), profiles.covering(nodes), cfg, explain=True)
    filtered = expl.per_node if isinstance(expl, Refusal) else {}
    return Refuse(spec, why, filtered)
