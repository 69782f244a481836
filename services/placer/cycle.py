"""One placement cycle as a pure function: the ranked queue, the ledger and the nodes in; what to
commit, refuse and explain out. The service commits it; this module does no I/O.

Why a separate step: the decision must be the simulator's (``libs.policy.scheduler.schedule``)
and must be testable without NATS; the shell only adds create/compare-and-set and messages.

What reaches a cycle came over the bus (the ranked queue, the lifecycle stream), a trust
boundary (rule 6): each job's spec is re-checked with ``proto.validation.revalidate_spec``
first, and an unsound one is refused with the reasons instead of reaching the policy, where a
``gpus`` of -1 made every cycle raise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from libs.policy.cluster import RESOURCES, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.placement import never_fits, place, to_allocation
from libs.policy.profiles import ProfileTable
from libs.policy.scheduler import schedule
from libs.policy.types import Candidate, PendingJob, Placement, Refusal, RunningJob
from proto.decisions import CandidateScore
from proto.jobs import JobSpec
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from proto.validation import describe, revalidate_spec
from proto.validation_records import revalidate_allocation

INVALID = "invalid job"  # the start of the reason of a refusal by revalidate_spec


@dataclass(frozen=True)
class Assign:
    job: PendingJob
    allocation: Allocation
    placement: Placement
    runtime_s: float  # full expected runtime on the chosen GPU model
    candidates: tuple[CandidateScore, ...]


@dataclass(frozen=True)
class Refuse:
    spec: JobSpec
    reason: str
    filtered: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    assign: list[Assign]
    refuse: list[Refuse]
    waiting: dict[str, str]
    regime: str


def tenant_usage(allocations: Iterable[Allocation]) -> dict[str, np.ndarray]:
    """Per tenant, what it holds in ``RESOURCES`` order (for dominant-resource fairness)."""
    usage: dict[str, np.ndarray] = {}
    for a in allocations:
        tenant = a.spec.tenant if a.spec is not None else "default"
        n = len(a.gpu_indices)
        v = np.array([n * a.gpu_share, n * a.gpu_mem_gb, a.host_mem_gb, a.cpus], dtype=float)
        usage[tenant] = usage.get(tenant, np.zeros(len(RESOURCES))) + v
    return usage


def running_jobs(
    view: ClusterView, allocations: Iterable[Allocation], profiles: ProfileTable
) -> list[RunningJob]:
    """The ledger as running jobs with expected ends (for the backfill reservation)."""
    out = []
    for a in allocations:
        if a.spec is None or a.node not in view.index:
            continue
        i = view.index[a.node]
        end = a.time + profiles.runtime_s(a.spec, view.nodes[i].gpu_model)
        out.append(RunningJob.from_allocation(a, i, end))
    return out


def _candidates(expl: Placement | Refusal, chosen: Placement) -> tuple[CandidateScore, ...]:
    cands: list[Candidate] = list(expl.candidates) if isinstance(expl, Placement) else []
    if not any(c.node_id == chosen.node_id for c in cands):
        cands.append(Candidate(chosen.node_id, chosen.score, dict(chosen.terms)))
    return tuple(
        CandidateScore(
            node=c.node_id,
            total=round(c.score, 6),
            terms={k: round(v, 6) for k, v in c.terms.items()},
        )
        for c in cands
    )


def plan_cycle(
    pending: Sequence[PendingJob],
    nodes: Sequence[NodeSpec],
    ledger: Mapping[str, Allocation],
    *,
    now: float,
    profiles: ProfileTable,
    cfg: PolicyConfig,
    temp_c: Mapping[str, float] | None = None,
    cordoned: Iterable[str] = (),
    refuse_never_fits: bool = True,
    backfill: bool = True,
) -> Plan:
    """Decide one cycle. ``pending`` must exclude jobs in ``ledger`` and ended jobs.

    ``refuse_never_fits``: refuse jobs no node could ever hold (off while the node set is still
    changing, e.g. at start-up when nodes register one by one). ``backfill``: whether this
    cycle walks below a blocked head job (the service keeps a ``BackfillCadence``).
    """
    by_id = {n.id: n for n in nodes}
    node_ids = set(by_id)
    # an unsound entry (GPU 99 of a 4-GPU node) would make every cycle raise; the placer is the
    # ledger's only writer, so it can only be a forgery: it holds nothing
    live = [
        a
        for key, a in ledger.items()
        if a.node in by_id and not revalidate_allocation(a, by_id[a.node], key=key)
    ]
    profiles = profiles.covering(nodes)
    refuse: list[Refuse] = []
    todo: list[PendingJob] = []
    for job in pending:
        errors = revalidate_spec(job.spec)
        if errors:
            refuse.append(Refuse(job.spec, f"{INVALID}: {describe(errors)}"))
            continue
        why = never_fits(job.spec, nodes) if refuse_never_fits and nodes else None
        if why is None:
            todo.append(job)
            continue
        empty = ClusterView.build(nodes)
        expl = place(job.spec, empty, profiles, cfg, explain=True)
        filtered = expl.per_node if isinstance(expl, Refusal) else {}
        refuse.append(Refuse(job.spec, why, filtered))
    cordon = [c for c in cordoned if c in node_ids]
    view = ClusterView.build(nodes, live, temp_c=temp_c, cordoned=cordon)
    before = view.copy()
    result = schedule(
        todo,
        view,
        running_jobs(view, live, profiles),
        now=now,
        tenant_usage=tenant_usage(ledger.values()),
        profiles=profiles,
        cfg=cfg,
        backfill=backfill,
    )
    assign: list[Assign] = []
    for job, placement in result.assignments:
        alloc = to_allocation(job.spec, placement, now, job.attempt)
        # what the chosen node was up against at the moment it was chosen
        expl = place(job.spec, before, profiles, cfg, explain=True)
        before.allocate(alloc)
        model = view.nodes[placement.node_index].gpu_model
        assign.append(
            Assign(
                job=job,
                allocation=alloc,
                placement=placement,
                runtime_s=profiles.runtime_s(job.spec, model),
                candidates=_candidates(expl, placement),
            )
        )
    return Plan(assign, refuse, result.waiting, result.regime)
