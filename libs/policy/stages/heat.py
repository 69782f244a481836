"""Heat risk in placement: jobs that could never leave a hot node keep off nodes that ran hot.

Why: the thermal guard (``stages.thermal``) can drain a hot node only of work that may move.
A long job that is neither checkpointable nor elastic (or an inference service) that lands on
a node of a rack with poor airflow runs throttled for its whole life: measured on Philly with
10% of the nodes hot, one such 8-GPU job of ten days is ~3,800 throttled GPU-hours, and which
of them landed on a hot node decided the figure. The current temperature cannot warn (an idle
hot node reads cool), so placement remembers which nodes *ran* hot.

The rule (``heat_averse`` x ``risky_nodes``): a node is *risky* when the guard held it hot
(``proto.intents.HOLD_HOT``) within the last ``ThermalConfig.risk_memory_s``, or its heat
profile label (``mosaic/heat``) is at least ``ThermalConfig.risky_heat``; a job is *averse*
when it could never be moved off it (``stages.preempt``'s protection: inference, or neither
checkpointable nor elastic) and is expected to run at least ``ThermalConfig.averse_runtime_s``.
An averse job goes to a risky node only when no other feasible node exists
(``avoid_risky``: a penalty larger than any score gap): it never waits for lack of a cool node,
and movable or short work keeps using the risky nodes, which the guard can drain.
"""

from __future__ import annotations

import contextlib

import numpy as np

from libs.policy.config import PolicyConfig
from libs.policy.thermal_model import heat_factor
from proto.jobs import JobSpec
from proto.nodes import NodeSpec

RISK_PENALTY = 2.0  # subtracted from a risky node's total (totals lie in [0, 1])


def heat_averse(spec: JobSpec, cfg: PolicyConfig) -> bool:
    """Could ``spec`` never be moved off a hot node, for long (module docstring)?"""
    stuck = spec.kind == "inference" or not (spec.checkpointable or spec.elastic is not None)
    return stuck and spec.est_runtime_s >= cfg.thermal.averse_runtime_s


def risky_nodes(
    heat_profile: np.ndarray, last_hot_s: np.ndarray, now: float, cfg: PolicyConfig
) -> np.ndarray:
    """bool[N]: nodes labelled hot (``heat_profile`` >= ``risky_heat``) or held hot within
    ``risk_memory_s`` of ``now`` (``last_hot_s``: when each last was, -inf never)."""
    tc = cfg.thermal
    return (heat_profile >= tc.risky_heat) | (now - last_hot_s <= tc.risk_memory_s)


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
    """When each node was last seen held hot, and the risky mask it gives (``risky_nodes``):
    the scheduler's state behind this stage, refreshed once per pass."""

    def __init__(self, nodes: list[NodeSpec]) -> None:
        self.profile = label_heat(nodes)
        self.last_hot_s = np.full(len(nodes), -np.inf)

    def note(self, hot: np.ndarray, now: float, cfg: PolicyConfig) -> np.ndarray:
        """Nodes held hot now (``hot``: indices), then the risky mask at ``now``."""
        self.last_hot_s[hot] = now
        return risky_nodes(self.profile, self.last_hot_s, now, cfg)


def avoid_risky(total: np.ndarray, risky: np.ndarray) -> np.ndarray:
    """The feasible nodes' totals with the risky ones put behind every other."""
    return total - RISK_PENALTY * risky
