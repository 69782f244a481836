"""Gang: where a job wider than any node goes, the definition (issue 15).

A *gang* is a whole-GPU job that asks for more GPUs than any node it may use has (a node it may
use: its GPU model passes the job's constraints and its GPUs have the memory asked per GPU).
It runs as one part per node, started and ended together by the nodes' executors
(``services.executor.gang``). This stage decides which nodes and how many GPUs on each:

* **One GPU model.** A gang runs at its slowest GPU (``libs.sim.engine``), so mixing models
  wastes the fast ones; every part is on nodes of the same model.
* **All or nothing.** A placement gives every GPU asked, or there is none.
* **Fewest nodes.** Nodes are taken most-offering first; each part takes all the node offers
  and the last part the remainder (12 GPUs on two free 8-GPU nodes: 8 + 4, not 6 + 6, so the
  4 left stay one block a 4-GPU job can use).
* **Near each other.** A node's switch is its ``switch`` label (``SWITCH_LABEL``: the leaf or
  top-of-rack switch it hangs off; ``libs.policy.inventory`` gives every node it builds one,
  ``NODES_PER_SWITCH`` nodes of a group per switch). A node without the label counts as alone
  on its switch (nothing is known to be near it). Among the fewest-node choices of a model,
  one switch that holds the whole gang is preferred (the one with the least to spare: a
  best fit that keeps big switches for big gangs); else nodes with equal offers are taken
  from the switch that offers the most first.
* **Which model.** Fewest nodes, then fewest switches, then the model the job runs fastest on
  (``ProfileTable.runtime_s``), then the view's model order.
* **Host memory and CPUs.** The spec's ``host_mem_gb`` and ``cpus`` are the job's totals,
  split over the parts in proportion to their GPUs (as the baselines split them,
  ``libs.sim.cluster``). Each part must fit its node's free host memory and CPUs, a hard rule
  like GPU memory per GPU: a node offers only as many GPUs as its free host memory and CPUs
  can feed.

Every GPU of a part is a whole GPU, the lowest-numbered whole free ones (as ``placement.place``
takes them). The pass's use of this (rank, wait, reserve) is ``libs.policy.gang_pass``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from libs.policy.cluster import EPS, ClusterView
from libs.policy.stages.filter import (
    f_constraints,
    f_gpu_memory,
    is_fractional,
    shape_key,
    whole_gpus,
)
from libs.policy.types import Placement, Reservation, RunningJob
from proto.jobs import JobSpec

SWITCH_LABEL = "switch"  # NodeSpec.labels key: the network switch a node is attached to
NODES_PER_SWITCH = 4  # nodes of one inventory group per switch (libs.policy.inventory)

PART_SEP = "@"  # a gang part's id in the running set: <job>@<node> (no sound job id has one)
Plan = list[tuple[int, int]]  # (node index, GPUs on it), the first part first


@dataclass(frozen=True, slots=True)
class GangPlacement(Placement):
    """A gang's placement: ``parts`` (one ``Placement`` per node, whole GPUs); the fields of
    ``Placement`` itself are the first part's, so a reader of one node sees a real one."""

    parts: tuple[Placement, ...] = ()


def is_part(job_id: str) -> bool:
    """A running-set id of one node's part of a gang (``gang_pass.part_id``)."""
    return PART_SEP in job_id


def per_gpu(spec: JobSpec) -> tuple[float, float]:
    """(host memory GB, CPUs) a part needs per GPU it holds: the totals split by GPU."""
    k = whole_gpus(spec)
    return spec.host_mem_gb / k, spec.cpus / k


def gang_width(spec: JobSpec, view: ClusterView) -> int:
    """The most GPUs one node the job may use (``may_use``) has (0: no node it may use)."""
    ok = may_use(spec, view)
    return int(view.gpu_total[ok].max()) if ok.any() else 0


def is_gang(spec: JobSpec, view: ClusterView) -> bool:
    """Whole GPUs, more than any node the job may use has: it must span nodes."""
    if is_fractional(spec):
        return False
    width = gang_width(spec, view)
    return 0 < width < whole_gpus(spec)


def switches(view: ClusterView) -> np.ndarray:
    """int[N]: a switch number per node (``SWITCH_LABEL``; an unlabelled node is alone)."""
    names: dict[str, int] = {}
    out = np.empty(len(view.node_ids), dtype=np.int64)
    for i, node in enumerate(view.nodes):
        name = node.labels.get(SWITCH_LABEL)
        key = f"label:{name}" if name else f"alone:{node.id}"
        out[i] = names.setdefault(key, len(names))
    return out


def may_use(spec: JobSpec, view: ClusterView) -> np.ndarray:
    """bool[N]: nodes whose GPU model and GPU memory the job admits (memoised per shape on
    the view's shape memo: node specs never change)."""
    key = ("gang-may-use", shape_key(spec))
    hit = view.shape_memo.per_shape.get(key)
    if hit is None:
        hit = view.shape_memo.per_shape[key] = f_constraints(spec, view) & f_gpu_memory(spec, view)
    return hit


def empty_offers(spec: JobSpec, view: ClusterView) -> np.ndarray:
    """``offers(spec, view, every node, empty=True)``: what each node could give once empty
    (memoised per shape on the view's shape memo: it reads node specs only; read-only). A
    reservation and the power rule ask it of every blocked gang, every pass."""
    key = ("gang-empty-offers", shape_key(spec))
    hit = view.shape_memo.per_shape.get(key)
    if hit is None:
        hit = offers(spec, view, np.ones(len(view.node_ids), dtype=bool), empty=True)
        hit.setflags(write=False)
        view.shape_memo.per_shape[key] = hit
    return hit


def can_hold(k: int, offer: np.ndarray, view: ClusterView) -> bool:
    """Some model's offers add up to ``k`` GPUs: exactly when ``choose`` finds a plan."""
    per_model = np.bincount(view.model_idx, weights=offer, minlength=len(view.models))
    return bool((per_model >= k).any())


def offers(spec: JobSpec, view: ClusterView, usable: np.ndarray, *, empty: bool = False):
    """int[N]: the whole GPUs each node can give one part of ``spec`` now (``empty``: once
    nothing runs there), its free host memory and CPUs permitting; 0 where it may not
    (``usable`` False, another model than asked, too little GPU memory per GPU)."""
    gpus = view.gpu_total if empty else view.whole_free
    host_free = view.host_mem_gb if empty else view.host_mem_free_gb
    cpus_free = view.cpus if empty else view.cpus_free
    return node_offers(spec, gpus, host_free, cpus_free, usable & may_use(spec, view))


def node_offers(
    spec: JobSpec,
    gpus: np.ndarray,
    host_free_gb: np.ndarray,
    cpus_free: np.ndarray,
    ok: np.ndarray,
) -> np.ndarray:
    """int[n]: ``offers`` for any n nodes given their whole free GPUs, free host memory and
    CPUs, and whether the job may go there (``ok``): the rule node by node (the memo that
    refreshes only the nodes that changed, ``fast.gang_offers``, applies it to one node)."""
    host, cpu = per_gpu(spec)
    out = np.asarray(gpus).astype(np.int64)
    if host > EPS:
        out = np.minimum(out, np.floor((host_free_gb + EPS) / host).astype(np.int64))
    if cpu > EPS:
        out = np.minimum(out, np.floor((cpus_free + EPS) / cpu).astype(np.int64))
    return np.where(ok, np.maximum(out, 0), 0)


def _fill(k: int, nodes: Sequence[int], offer: np.ndarray) -> Plan:
    """Take ``nodes`` in order, all each offers, until ``k`` GPUs (the last takes the rest)."""
    plan: Plan = []
    left = k
    for n in nodes:
        take = min(int(offer[n]), left)
        if take > 0:
            plan.append((int(n), take))
            left -= take
        if left == 0:
            return plan
    return []


def _most_first(nodes: np.ndarray, offer: np.ndarray) -> list[int]:
    """``nodes`` by offer, most first (the node order breaks ties)."""
    return sorted(nodes.tolist(), key=lambda n: (-int(offer[n]), n))


def _fewest(k: int, ordered: list[int], offer: np.ndarray) -> int:
    """How many of ``ordered`` (most-offering first) hold ``k`` GPUs; 0 when they cannot."""
    got = 0
    for count, n in enumerate(ordered, 1):
        got += int(offer[n])
        if got >= k:
            return count
    return 0


def model_plan(k: int, nodes: np.ndarray, offer: np.ndarray, sw: np.ndarray) -> Plan:
    """The fewest nodes of ``nodes`` (one model) holding ``k`` GPUs, near each other
    (module docstring); [] when they cannot."""
    ordered = _most_first(nodes, offer)
    fewest = _fewest(k, ordered, offer)
    if not fewest:
        return []
    best: tuple[tuple[int, int], Plan] | None = None
    for s in np.unique(sw[nodes]).tolist():
        group = [n for n in ordered if sw[n] == s]
        if _fewest(k, group, offer) == fewest:
            spare = sum(int(offer[n]) for n in group) - k
            if best is None or (spare, s) < best[0]:
                best = ((spare, s), _fill(k, group, offer))
    if best is not None:
        return best[1]
    total: dict[int, int] = {}
    for n in ordered:
        total[int(sw[n])] = total.get(int(sw[n]), 0) + int(offer[n])
    spread = sorted(ordered, key=lambda n: (-int(offer[n]), -total[int(sw[n])], int(sw[n]), n))
    return _fill(k, spread, offer)


def choose(
    k: int, offer: np.ndarray, view: ClusterView, sw: np.ndarray, runtime_s: Sequence[float]
) -> Plan:
    """The gang's nodes over every model (``runtime_s``: the job's runtime per view model);
    [] when no model's nodes can hold ``k`` GPUs now."""
    best: tuple[tuple, Plan] | None = None
    for m in range(len(view.models)):
        nodes = np.flatnonzero((view.model_idx == m) & (offer > 0))
        if int(offer[nodes].sum()) < k:
            continue
        plan = model_plan(k, nodes, offer, sw)
        if not plan:
            continue
        key = (len(plan), len({int(sw[n]) for n, _ in plan}), runtime_s[m], m)
        if best is None or key < best[0]:
            best = (key, plan)
    return [] if best is None else best[1]


def placement_of(plan: Plan, view: ClusterView, sw: np.ndarray) -> GangPlacement:
    """The ``GangPlacement`` of ``plan``: each part the lowest-numbered whole free GPUs."""
    one = 1.0 - EPS
    parts = []
    for n, take in plan:
        free = [j for j, v in enumerate(view.gpu_free[n].tolist()) if v >= one][:take]
        parts.append(Placement(n, view.node_ids[n], tuple(free), 1.0, 0.0, {}))
    first = parts[0]
    terms = {"nodes": float(len(plan)), "switches": float(len({int(sw[n]) for n, _ in plan}))}
    return GangPlacement(
        first.node_index, first.node_id, first.gpu_indices, 1.0, 0.0, terms, parts=tuple(parts)
    )


def ever_fits(spec: JobSpec, view: ClusterView) -> bool:
    """Some model's nodes, all empty, could hold the gang (per-part host memory and CPUs
    included)."""
    return can_hold(whole_gpus(spec), empty_offers(spec, view), view)


def node_free_at(r: Sequence[RunningJob], now: float) -> float:
    """When a node is empty: its running jobs' last expected end (an overrun one ends now)."""
    return max((max(j.expected_end, now) for j in r), default=now)


def reservation(
    spec: JobSpec,
    view: ClusterView,
    usable: np.ndarray,
    free_at: np.ndarray,
) -> list[Reservation]:
    """EASY backfill's reservation for a blocked gang: the nodes of one model that are all
    empty earliest (``free_at``: when each node is empty) and hold it once empty, each held
    from that start; [] when none could. The earliest start wins, then the fewest nodes.
    Locality is not asked of a reservation (the gang is placed by ``choose`` when it starts;
    the reserved nodes only stop small jobs from starving it)."""
    cap = np.where(usable, empty_offers(spec, view), 0)  # offers(..., usable, empty=True)
    k = whole_gpus(spec)
    best: tuple[tuple[float, int], list[int]] | None = None
    for m in range(len(view.models)):
        nodes = np.flatnonzero((view.model_idx == m) & (cap > 0))
        order = sorted(nodes.tolist(), key=lambda n: (float(free_at[n]), -int(cap[n]), n))
        got, taken = 0, []
        for n in order:
            taken.append(n)
            got += int(cap[n])
            if got >= k:
                break
        if got < k:
            continue
        key = (max(float(free_at[n]) for n in taken), len(taken))
        if best is None or key < best[0]:
            best = (key, taken)
    if best is None:
        return []
    start = best[0][0]
    return [Reservation(spec.id, n, view.node_ids[n], start) for n in best[1]]


def power_needs(
    specs: Sequence[JobSpec], view: ClusterView, suspended: np.ndarray, resuming: np.ndarray
) -> tuple[list[int], np.ndarray]:
    """The power rule for blocked gangs (``libs.policy.power.plan`` asks it): (suspended nodes
    to wake, bool[N] awake nodes to keep awake). Why: the power plan wakes one node per blocked
    job that one node could hold, so a gang, which no node holds, woke nothing and the nodes it
    waited for could be put to sleep one by one as they emptied. For each blocked gang (rank
    order): the model whose nodes could hold it once empty with the fewest nodes to wake; its
    awake and booting nodes stay awake, and enough of its suspended nodes (most GPUs first)
    are woken; a later gang counts the nodes an earlier one took."""
    wake: list[int] = []
    keep = np.zeros(len(view.node_ids), dtype=bool)
    taken = np.zeros(len(view.node_ids), dtype=bool)
    for spec in specs:
        k = whole_gpus(spec)
        cap = np.where(taken, 0, empty_offers(spec, view))
        best: tuple[tuple[int, int], list[int], np.ndarray] | None = None
        for m in range(len(view.models)):
            of_m = (view.model_idx == m) & (cap > 0)
            up = of_m & ~suspended
            got = int(cap[up].sum())
            asleep = sorted(np.flatnonzero(of_m & suspended).tolist(), key=lambda n: -int(cap[n]))
            more: list[int] = []
            for n in asleep:
                if got >= k:
                    break
                more.append(n)
                got += int(cap[n])
            if got >= k and (best is None or (len(more), m) < best[0]):
                best = ((len(more), m), more, up)
        if best is None:
            continue
        _, more, up = best
        wake += more
        keep |= up
        taken |= up
        taken[more] = True
    del resuming  # booting nodes count as awake (``~suspended``): they will be
    return wake, keep
