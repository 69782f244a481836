"""Heat risk in placement: jobs that could never leave a hot node keep off nodes that ran hot.

Why: the thermal guard (``stages.thermal``) can drain a hot node only of work that may move.
A long job that is neither checkpointable nor elastic (or an inference service) that lands on
a node of a rack with poor airflow runs throttled for its whole life: measured on Philly with
10% of the nodes hot, one such 8-GPU job of ten days is ~3,800 throttled GPU-hours, and which
of them landed on a hot node decided the figure. The current temperature cannot warn (an idle
hot node reads cool), so placement remembers which nodes *ran* hot.

The rule (``heat_averse`` x ``HeatMemory``): a node is *risky* once the guard held it hot
(``proto.intents.HOLD_HOT``), until it has run ``ThermalConfig.risk_clear_busy_s`` of load
without another hold, or while its heat profile label (``mosaic/heat``) is at least
``ThermalConfig.risky_heat``; a job is *averse*
when it could never be moved off it (``stages.preempt``'s protection: inference, or neither
checkpointable nor elastic; or ``averse_min_gpus`` wide, for which no resume room exists in
practice) and is expected to run at least ``ThermalConfig.averse_runtime_s``.
An averse job first *waits* for another node (``holds_off_risky``, reason ``HotNode``), for
at most ``ThermalConfig.averse_wait_share`` (one half) of its remaining runtime: throttled at
half speed it would lose its whole runtime again (break-even is a wait of all of it), so a
wait of half of it is a good trade when a cool node frees meanwhile. The wait counted is the
time it waited *for heat* (``HeatMemory.waited_at``: between passes that both kept it off a
risky node that could take it), not its whole time in the queue: on a full cluster a job
that queued for days for capacity has traded nothing against heat yet, and counting those
days let it take the first risky node that freed (Philly seed 1, 10% of nodes hot: ten-day
8-GPU jobs that had queued 500-800 h took the hot nodes at once and ran 5,500 throttled
GPU-hours of the guard's 12,000). After that it takes a
risky node only when no other feasible node exists (``avoid_risky``: a penalty larger than
any score gap). Movable or short work keeps using the risky nodes, which the guard can drain.
A thermal migration resumes only on a node that did not run hot (``core.Scheduler.check_move``
with ``kind="migrate"``), and a moved averse job's room is a cool node when one has room.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import numpy as np

from libs.policy.config import PolicyConfig
from libs.policy.thermal_model import heat_factor
from libs.policy.types import PendingJob
from proto.jobs import JobSpec
from proto.nodes import NodeSpec

RISK_PENALTY = 2.0  # subtracted from a risky node's total (totals lie in [0, 1])
HOT_NODE = "HotNode"  # the wait reason: only nodes that ran hot could take it now
PATIENCE_ROUND_S = 1e-6


def heat_averse(spec: JobSpec, cfg: PolicyConfig) -> bool:
    """Could ``spec`` never be moved off a hot node, for long (module docstring)? Stuck: an
    inference service, or neither checkpointable nor elastic; or, in practice, a job of
    ``averse_min_gpus`` or more: it resumes only on a node with that many GPUs free, which a
    busy cluster rarely has within the resume bound (Philly seed 1, 10% of nodes hot: the guard
    could move none of its 8-GPU jobs, 648 migrations refused for want of room, and they ran
    6,365 of the 8,370 throttled GPU-hours)."""
    tc = cfg.thermal
    if spec.est_runtime_s < tc.averse_runtime_s:
        return False
    stuck = spec.kind == "inference" or not (spec.checkpointable or spec.elastic is not None)
    return stuck or spec.gpus >= tc.averse_min_gpus


def patience_s(job: PendingJob, cfg: PolicyConfig) -> float:
    """How long an averse ``job`` waits for heat before it takes a risky node: the config's
    share of its remaining runtime (module docstring)."""
    return cfg.thermal.averse_wait_share * job.spec.est_runtime_s * (1.0 - job.progress)


def holds_off_risky(job: PendingJob, heat_waited_s: float, cfg: PolicyConfig) -> bool:
    """Does ``job`` still wait rather than take a risky node (module docstring)?
    ``heat_waited_s``: how long it has waited for heat already (``HeatMemory.waited_at``)."""
    return heat_averse(job.spec, cfg) and heat_waited_s < patience_s(job, cfg)


def label_heat(nodes: list[NodeSpec]) -> np.ndarray:
    """float[N]: each node's heat profile label (``thermal_model.heat_factor``), 1 where it
    has none or an unreadable one (the telemetry backend reports that error; placement must
    not stop for it)."""
    out = np.ones(len(nodes))
    for i, nd in enumerate(nodes):
        with contextlib.suppress(ValueError):
            out[i] = heat_factor(nd)
    return out


class HeatMemory:
    """Which nodes ran hot: the scheduler's state behind this stage, noted once per pass.

    A node held hot becomes *learnt* risky; it stays so until it has run
    ``ThermalConfig.risk_clear_busy_s`` of load (some GPU busy) without being held again.
    Load time, not wall time: a node that ran hot and then sat idle or asleep (placement kept
    the stuck jobs off it) has shown nothing new, and forgetting it by the calendar let a
    ten-day 8-GPU job land on it again (Philly, seed 1). ``risky`` adds the label rule."""

    def __init__(self, nodes: list[NodeSpec], cfg: PolicyConfig) -> None:
        self.labelled = label_heat(nodes) >= cfg.thermal.risky_heat
        self.learnt = np.zeros(len(nodes), dtype=bool)
        self.clean_busy_s = np.zeros(len(nodes))  # load since the last hold (learnt ones)
        self._t: float | None = None
        # per queued job: the time it waited for heat, and the last pass that kept it off a
        # risky node (``note_waits``; a started or gone job is forgotten)
        self.waited_s: dict[str, float] = {}
        self._refused_at: dict[str, float] = {}

    def note(self, hot: list[int], busy: np.ndarray, now: float, cfg: PolicyConfig) -> np.ndarray:
        """``hot``: indices held hot now; ``busy``: bool[N], some GPU in use since the last
        note. The risky mask at ``now``."""
        dt = 0.0 if self._t is None else max(0.0, now - self._t)
        self._t = now
        self.clean_busy_s += dt * (self.learnt & busy)
        self.learnt[hot] = True
        self.clean_busy_s[hot] = 0.0
        self.learnt &= self.clean_busy_s < cfg.thermal.risk_clear_busy_s
        return self.labelled | self.learnt

    def note_waits(
        self,
        waiting: Mapping[str, str],
        now: float,
        queued: Callable[[str], PendingJob | None],
        cfg: PolicyConfig,
    ) -> float | None:
        """After a pass (``waiting``: its reasons): a job it kept off a risky node
        (``HOT_NODE``) adds the time since the last pass that did, unless a pass between them
        gave it another reason (it waited for something else then). A pass that did not look
        at a job (it stopped above it) changes nothing for it.

        Returns the first instant a job kept off now runs out of patience (``queued``: the
        queue's job by id), or None when none will. A pass is due then, events or not (both
        drivers wake at it): else a job that may now take the risky node would wait for some
        unrelated event."""
        for job_id, why in waiting.items():
            if why == HOT_NODE:
                since = self._refused_at.get(job_id)
                if since is not None:
                    self.waited_s[job_id] = self.waited_s.get(job_id, 0.0) + (now - since)
                self._refused_at[job_id] = now
            elif job_id in self._refused_at:
                del self._refused_at[job_id]
        ends = []
        for job_id in self._refused_at:  # the few jobs kept off for heat
            job = queued(job_id)
            left_s = 0.0 if job is None else patience_s(job, cfg) - self.waited_at(job_id, now)
            if left_s > 0:  # spent already: it may take a risky node, and waits for another cause
                ends.append(now + left_s)
        # a hair past the end: the pass then finds the patience spent, whatever the rounding
        return None if not ends else min(ends) + PATIENCE_ROUND_S

    def waited_at(self, job_id: str, now: float) -> float:
        """How long ``job_id`` has waited for heat by ``now``: the passes counted so far, and
        the time since the last one that kept it off a risky node."""
        since = self._refused_at.get(job_id)
        return self.waited_s.get(job_id, 0.0) + (0.0 if since is None else now - since)

    def forget(self, job_id: str) -> None:
        """The job started or left the queue: a later wait is counted afresh."""
        self.waited_s.pop(job_id, None)
        self._refused_at.pop(job_id, None)


def avoid_risky(total: np.ndarray, risky: np.ndarray) -> np.ndarray:
    """The feasible nodes' totals with the risky ones put behind every other."""
    return total - RISK_PENALTY * risky
