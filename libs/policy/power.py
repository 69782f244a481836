"""Power saving of idle nodes: which to suspend, which to resume (pure, no I/O).

Why: a GPU draws its idle power whenever its node is up, busy or not; on a cluster sized for
the peak that idle floor is most of the energy bill. Slurm's power saving (``SuspendTime``,
``ResumeTimeout``) powers down nodes idle for a while and boots them when work needs them; this
module is that decision, as a function of the cluster view, the blocked jobs and how long each
node has been idle, so the simulator and (later) the live services decide the same way.

Rules (each a ``PolicyConfig`` field):

* suspend an awake node only when it holds no job, has been idle ``suspend_after_s``, is not
  reserved for a blocked job, could not host any blocked job (by shape), and its GPU model keeps
  at least ``warm_reserve_frac`` of its GPUs free and awake afterwards (new arrivals start at
  once instead of waiting ``resume_s``); longest idle first;
* the warm reserve (``keep_nodes``, ``libs.policy.warm``): never suspend a node of a GPU model
  whose spare nodes (empty, awake, not held or reserved, or booting with nothing claimed)
  would fall below its reserve; and when they are below it (a start ate into it), wake the
  missing ones now, so the next arrival finds them up instead of waiting a boot;
* resume suspended nodes for blocked jobs (rank order, the first ``power_demand_cap``) that no
  awake node can take now: one node per job, unless the unclaimed GPUs of a node already
  resuming cover it.

Both drivers reach it through ``core.Scheduler.power_step`` (``power_state.PowerState``); the
simulator's ``--power-saving all`` wrapper (``libs.sim.power_saving``) calls it for baselines.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from libs.policy import fast as K
from libs.policy import filters as F
from libs.policy.cluster import EPS, ClusterView
from libs.policy.config import PolicyConfig
from libs.policy.stages import gang
from libs.policy.stages.power import DUE_EPS_S
from proto.jobs import JobSpec


@dataclass(frozen=True, slots=True)
class PowerPlan:
    """Node indices (of the view) to suspend now and to resume now."""

    suspend: tuple[int, ...]
    resume: tuple[int, ...]
    warm: tuple[int, ...] = ()  # the resumed nodes woken to refill the warm reserve


@dataclass(frozen=True, slots=True)
class Demand:
    """Blocked jobs as ``plan`` reads them: the first ``cap`` in rank order, grouped by request
    shape (where a job could go depends on its shape only), groups in order of first
    appearance. A caller whose blocked jobs rarely change keeps one instead of handing
    ``plan`` the list each time."""

    groups: tuple[tuple[JobSpec, int], ...]  # (a spec of the shape, jobs of that shape)
    # the groups' static masks, kept for the view they were made for (``static_masks``), and
    # their job counts and GPUs per job (``counts_and_needs``)
    _static: list = field(default_factory=list, compare=False, repr=False)
    _counts: list = field(default_factory=list, compare=False, repr=False)
    _gangs: list = field(default_factory=list, compare=False, repr=False)  # ``gang_specs``
    _gang_needs: list = field(default_factory=list, compare=False, repr=False)  # ``gang_needs``

    def counts_and_needs(self) -> tuple[np.ndarray, np.ndarray]:
        """(jobs per group, GPUs each job of the group asks), as arrays (kept)."""
        if not self._counts:
            self._counts[:] = [
                np.array([c for _, c in self.groups], dtype=np.int64),
                np.array([float(spec.gpus) for spec, _ in self.groups], dtype=float),
            ]
        return self._counts[0], self._counts[1]

    def static_masks(self, view: ClusterView) -> np.ndarray:
        """bool[group, node]: ``F.static_mask`` of each group's shape, kept for the last view
        asked (node specs never change in a view): a caller that keeps its ``Demand`` has
        ``plan`` asked again as power states change, with the same groups."""
        memo = self._static
        if memo and memo[0] is view.shape_memo:
            return memo[1]
        n = len(view.node_ids)
        static = (
            np.stack([F.static_mask(spec, view) for spec, _ in self.groups])
            if self.groups
            else np.zeros((0, n), dtype=bool)
        )
        memo[:] = [view.shape_memo, static]
        return static

    def gang_specs(self, view: ClusterView) -> list[JobSpec]:
        """The groups' specs that are gangs (``stages.gang.is_gang``, rank order), kept for
        the last view asked, as ``static_masks`` (a shape's being a gang reads node specs
        only)."""
        memo = self._gangs
        if memo and memo[0] is view.shape_memo:
            return memo[1]
        gangs = [spec for spec, _ in self.groups if gang.is_gang(spec, view)]
        memo[:] = [view.shape_memo, gangs]
        return gangs

    def gang_needs(
        self, view: ClusterView, asleep: np.ndarray, resuming: np.ndarray
    ) -> tuple[list[int], np.ndarray]:
        """``stages.gang.power_needs`` of the blocked gangs (``gang_specs``), kept for the
        last view and sleeping nodes asked: it reads node specs and which nodes sleep only,
        and a kept ``Demand`` is planned again at every power step. (wake, keep: read-only)."""
        key = (view.shape_memo, asleep.tobytes())
        memo = self._gang_needs
        if memo and memo[0][0] is key[0] and memo[0][1] == key[1]:
            return memo[1]
        wake, keep = gang.power_needs(self.gang_specs(view), view, asleep, resuming)
        keep.setflags(write=False)
        memo[:] = [key, (wake, keep)]
        return wake, keep

    def keep_static(self, view: ClusterView, static: np.ndarray, gangs: list[JobSpec]) -> None:
        """Take ``static_masks`` and ``gang_specs`` for ``view`` from a caller that already
        has them per request shape (``power_state``: the queue's per-shape arrays, which the
        pass keeps): a new ``Demand`` of shapes seen before then builds neither (it did, at
        each change of the blocked jobs: most of a power plan's time on a full Philly replay).
        ``tests/policy/test_power.py`` checks them equal to the ones built here."""
        self._static[:] = [view.shape_memo, static]
        self._gangs[:] = [view.shape_memo, gangs]

    @classmethod
    def of(cls, blocked: Iterable[JobSpec], cap: int) -> Demand:
        shapes: dict[tuple, list] = {}
        for spec in itertools.islice(blocked, cap):
            key = F.shape_key(spec)
            hit = shapes.get(key)
            if hit is None:
                shapes[key] = [spec, 1]
            else:
                hit[1] += 1
        return cls(tuple((spec, count) for spec, count in shapes.values()))

    @classmethod
    def of_shapes(cls, shape_ids: np.ndarray, shape_specs: Sequence[JobSpec], cap: int) -> Demand:
        """``of`` for jobs given by request-shape index (``PendingQueue.shapes``): the same
        groups, each with the queue's spec of that shape."""
        ids = np.asarray(shape_ids, dtype=np.int64)[:cap]
        if not len(ids):
            return cls(())
        uniq, counts = K.groups_in_order(ids)
        return cls(
            tuple((shape_specs[u], c) for u, c in zip(uniq.tolist(), counts.tolist(), strict=True))
        )


def empty_nodes(view: ClusterView) -> np.ndarray:
    """bool[N]: nodes with nothing allocated (every GPU whole, host memory and CPUs all free)."""
    return view.whole_free >= view.gpu_total


def plan(
    view: ClusterView,
    *,
    idle_s: np.ndarray,
    suspended: np.ndarray,
    resuming: np.ndarray,
    blocked: Iterable[JobSpec] | Demand,
    reserved: Collection[int],
    cfg: PolicyConfig,
    prefer: np.ndarray | None = None,
    keep_nodes: np.ndarray | None = None,
) -> PowerPlan:
    """What to power down and up now.

    ``idle_s``: seconds each node has held no job (NaN or < 0 for a busy node).
    ``suspended`` / ``resuming``: bool[N], the nodes' power state (neither = awake).
    ``blocked``: pending jobs that could not start in the last pass, best ranked first (read
    only when there is something to decide, at most ``power_demand_cap`` of them), or their
    ``Demand``.
    ``reserved``: node indices a reservation holds for a blocked job (never suspended).
    ``prefer``: node indices, the ones to wake first first (default: view order); the caller
    passes fastest first, so a long job waiting for a fast GPU (the scheduler's slow-GPU
    guard) wakes a fast node.
    ``keep_nodes``: int[model] (``view.models`` order), the warm reserve in spare nodes
    (``libs.policy.warm.WarmHistory.keep``); None keeps none.
    """
    n = len(view.node_ids)
    if not cfg.power_saving or n == 0:
        return PowerPlan((), ())
    awake = ~suspended & ~resuming
    idle = np.asarray(idle_s, dtype=float)
    due = idle >= cfg.suspend_after_s - DUE_EPS_S  # (stages.power.power_due's test)
    cand = awake & due & empty_nodes(view)  # NaN (busy) is never >=
    if reserved:
        cand[list(reserved)] = False
    if not suspended.any() and not cand.any():
        return PowerPlan((), ())  # the common case on a busy cluster: nothing to decide
    if not isinstance(blocked, Demand):
        blocked = Demand.of(blocked, cfg.power_demand_cap)
    # --- resume: blocked jobs that some suspended node could hold --------------------------
    static = blocked.static_masks(view)
    claim = np.where(resuming, view.gpu_total, 0).astype(float)  # unclaimed GPUs booting
    rank = np.arange(n) if prefer is None else np.asarray(prefer, dtype=np.int64)
    # one compiled loop over the blocked jobs (a Python step with two numpy calls per job
    # was most of a plan's time while nodes were down)
    down = suspended.copy()  # the resume loop clears the nodes it wakes
    woken, needed = K.power_resume(
        static,
        *blocked.counts_and_needs(),
        claim,
        down,
        rank,
        view.gpu_total,
        EPS,
    )
    resume = woken.tolist()
    gangs = blocked.gang_specs(view)
    if gangs:  # blocked gangs wake and keep whole nodes of one model (stages.gang)
        asleep = suspended.copy()
        asleep[woken] = False  # woken for other jobs: counted as up
        wake, keep = blocked.gang_needs(view, asleep, resuming)
        resume += [n for n in wake if n not in resume]
        needed = needed | keep
        down[list(wake)] = False  # (not spare: the gang's, not the warm reserve's)
    warm: list[int] = []
    spare = None
    if keep_nodes is not None and np.any(keep_nodes > 0):
        spare, warm = _refill(view, awake, resuming, claim, down, reserved, rank, keep_nodes)
        resume += warm
    # --- suspend: idle awake nodes beyond the warm reserve ----------------------------------
    cand &= ~needed
    if not cand.any():
        return PowerPlan((), tuple(resume), tuple(warm))
    # GPUs per model, and free ones on awake nodes (whole numbers: the sums are exact)
    n_models = len(view.models)
    total = np.bincount(view.model_idx, weights=view.gpu_total, minlength=n_models).tolist()
    free_awake = np.bincount(
        view.model_idx[awake], weights=view.whole_free[awake], minlength=n_models
    ).tolist()
    suspend: list[int] = []
    for i in sorted(np.flatnonzero(cand).tolist(), key=lambda k: (-idle[k], k)):
        m = int(view.model_idx[i])
        keep = math.ceil(cfg.warm_reserve_frac * total[m])
        g = float(view.gpu_total[i])
        if spare is not None and spare[m] - 1 < keep_nodes[m]:
            continue  # the demand-following warm reserve keeps it awake
        if free_awake[m] - g >= keep:
            free_awake[m] -= g
            if spare is not None:
                spare[m] -= 1
            suspend.append(i)
    return PowerPlan(tuple(suspend), tuple(resume), tuple(warm))


def spare_nodes(
    view: ClusterView,
    awake: np.ndarray,
    resuming: np.ndarray,
    claim: np.ndarray,
    reserved: Collection[int],
) -> np.ndarray:
    """bool[N]: the nodes a new arrival could take whole: awake, empty, not held (cordoned)
    and not reserved for a blocked job, or booting with none of their GPUs claimed by one."""
    spare = awake & empty_nodes(view) & ~view.cordoned
    spare |= resuming & (claim >= view.gpu_total - EPS)
    if reserved:
        spare[list(reserved)] = False
    return spare


def _refill(
    view: ClusterView,
    awake: np.ndarray,
    resuming: np.ndarray,
    claim: np.ndarray,
    down: np.ndarray,
    reserved: Collection[int],
    rank: np.ndarray,
    keep_nodes: np.ndarray,
) -> tuple[np.ndarray, list[int]]:
    """(spare nodes per model after the refill, nodes to wake): for each GPU model whose spare
    nodes (``spare_nodes``; ``claim``: the booting nodes' GPUs left after the blocked jobs'
    claims) are fewer than its reserve, the missing ones among its suspended nodes not
    already woken (``down``: still suspended), in ``rank`` order."""
    n_models = len(view.models)
    spare_mask = spare_nodes(view, awake, resuming, claim, reserved)
    spare = np.bincount(view.model_idx[spare_mask], minlength=n_models).astype(np.int64)
    short = np.asarray(keep_nodes, dtype=np.int64) - spare
    woken: list[int] = []
    missing = int(np.maximum(short, 0).sum())
    if not missing:
        return spare, woken
    # the still-suspended nodes in rank order (a walk over every node, numpy scalar by
    # scalar, was most of a plan's time while a reserve was short)
    left = np.maximum(short, 0).tolist()
    asleep = rank[down[rank]]
    for k, m in zip(asleep.tolist(), view.model_idx[asleep].tolist(), strict=True):
        if left[m] > 0:
            woken.append(k)
            left[m] -= 1
            spare[m] += 1
            missing -= 1
            if not missing:  # every model's reserve refilled: the rest wake nothing
                break
    return spare, woken
