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
wait of half of it is a good trade when a cool node frees meanwhile. After that it takes a
risky node only when no other feasible node exists (``avoid_risky``: a penalty larger than
any score gap). Movable or short work keeps using the risky nodes, which the guard can drain.
A thermal migration resumes only on a node that did not run hot (``core.Scheduler.check_move``
with ``kind="migrate"``), and a moved averse job's room is a cool node when one has room.
"""

from __future__ import annotations

import contextlib

import numpy as np

from libs.policy.config import PolicyConfig
from libs.policy.thermal_model import heat_factor
from libs.policy.types import PendingJob
from proto.jobs import JobSpec
from proto.nodes import NodeSpec

RISK_PENALTY = 2.0  # subtracted from a risky node's total (totals lie in [0, 1])
HOT_NODE = "HotNode"  # the wait reason: only nodes that ran hot could take it now


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


def holds_off_risky(job: PendingJob, now: float, cfg: PolicyConfig) -> bool:
    """Does ``job`` still wait rather than take a risky node (module docstring)?"""
    spec = job.spec
    if not heat_averse(spec, cfg):
        return False
    left_s = spec.est_runtime_s * (1.0 - job.progress)
    return now - job.enqueued_at < cfg.thermal.averse_wait_share * left_s


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

    def note(self, hot: np.ndarray, busy: np.ndarray, now: float, cfg: PolicyConfig) -> np.ndarray:
        """``hot``: indices held hot now; ``busy``: bool[N], some GPU in use since the last
        note. The risky mask at ``now``."""
        dt = 0.0 if self._t is None else max(0.0, now - self._t)
        self._t = now
        self.clean_busy_s += dt * (self.learnt & busy)
        self.learnt[hot] = True
        self.clean_busy_s[hot] = 0.0
        self.learnt &= self.clean_busy_s < cfg.thermal.risk_clear_busy_s
        return self.labelled | self.learnt


def avoid_risky(total: np.ndarray, risky: np.ndarray) -> np.ndarray:
    """The feasible nodes' totals with the risky ones put behind every other."""
    return total - RISK_PENALTY * risky
