"""The settings of the two services that ask for moves: the thermal guard and the defragmenter.

Part of ``config.PolicyConfig`` (``cfg.thermal``, ``cfg.defrag``; ``--set thermal.KEY=...``),
in a module of their own because each is a whole record with its own checks; ``config``
re-exports both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ThermalConfig:
    """The thermal guard (``libs.policy.stages.thermal``; issue 14), live and in the simulator.

    A GPU at or above ``threshold_c`` for ``window`` consecutive samples makes its node hot:
    the guard holds it (no new work) and migrates at most ``max_moves_per_window`` of its
    movable jobs per window, hottest GPU first. The node is released when every GPU has read
    below ``clear_c`` for ``window`` consecutive samples (hysteresis: a GPU hovering at the
    threshold does not flap the hold). The hold is renewed every window while the node is hot
    and lasts ``hold_ttl_windows`` windows of the node's sample cadence (at least
    ``hold_ttl_min_s``), so a guard that dies leaves no node held for long. ``threshold_c``
    defaults to ``PolicyConfig.thermal_max_c``, the placement filter's limit: a node the guard
    drains is one the filter already refuses new work.

    ``enabled``: the simulator runs the guard (the live service runs it when deployed).
    ``sim_sample_s``: the simulator's telemetry cadence (the live one is the telemetry
    service's ``--interval-s``, 5 s by default).
    """

    enabled: bool = True
    threshold_c: float = 85.0
    clear_c: float = 75.0
    window: int = 3  # consecutive samples
    max_moves_per_window: int = 2  # migrations per node per window
    hold_ttl_windows: float = 4.0
    hold_ttl_min_s: float = 60.0
    sim_sample_s: float = 60.0
    # placement's memory of heat (``stages.heat``): a job that could never move off a node and
    # runs at least ``averse_runtime_s`` keeps off nodes that were held hot (until they ran
    # ``risk_clear_busy_s`` of load without a hold) or are labelled ``mosaic/heat`` >=
    # ``risky_heat``, waiting up to ``averse_wait_share`` of its runtime for another node
    risk_clear_busy_s: float = 86_400.0
    averse_runtime_s: float = 3600.0
    risky_heat: float = 1.2
    averse_wait_share: float = 0.5  # of its remaining runtime it waits for a cool node
    averse_min_gpus: float = 8.0  # this wide, a job counts as stuck (no room to resume in)

    def __post_init__(self) -> None:
        if not self.clear_c < self.threshold_c:
            raise ValueError("thermal.clear_c must be below thermal.threshold_c (hysteresis)")
        if self.window < 1:
            raise ValueError(f"thermal.window must be >= 1 sample, got {self.window}")
        if self.max_moves_per_window < 0:
            raise ValueError("thermal.max_moves_per_window must be >= 0")
        if not (self.hold_ttl_windows >= 1 and self.hold_ttl_min_s > 0):
            raise ValueError("thermal.hold_ttl_windows must be >= 1, hold_ttl_min_s > 0")
        if not self.sim_sample_s > 0:
            raise ValueError("thermal.sim_sample_s must be > 0")
        if not (self.risk_clear_busy_s >= 0 and self.averse_runtime_s >= 0):
            raise ValueError("thermal.risk_clear_busy_s and averse_runtime_s must be >= 0")
        if not self.risky_heat > 0:
            raise ValueError("thermal.risky_heat must be > 0")
        if not self.averse_wait_share >= 0:
            raise ValueError("thermal.averse_wait_share must be >= 0")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class DefragConfig:
    """The defragmenter's settings (``libs.policy.stages.defrag.plan_moves``, issue 14).

    Why a record of its own: the live defragmenter and the simulator read the same numbers, and
    ``--set defrag.enabled=true`` names them. ``enabled`` switches the simulator's use of the
    plan (the live service has its own switch: whether it runs). ``max_moves`` caps one plan
    (a plan that moves more jobs than this is not worth the churn). ``candidate_nodes``: how many
    nodes a plan tries to clear for one blocked job (those with the most free or movable
    capacity first); it bounds the plan's cost on large clusters. ``checkpoint_interval_s``:
    how often a checkpointable job is assumed to save (the lost work of a move is the time since
    the last save); ``checkpoint_cost_s``: the time a move costs the moved job (save, stop,
    restore), counted by the simulator with each migration.
    """

    enabled: bool = False
    max_moves: int = 8
    candidate_nodes: int = 16
    checkpoint_interval_s: float = 1800.0
    checkpoint_cost_s: float = 60.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __post_init__(self) -> None:
        if self.max_moves < 0 or self.candidate_nodes < 1:
            raise ValueError("defrag: need max_moves >= 0 and candidate_nodes >= 1")
        if not (self.checkpoint_interval_s > 0 and self.checkpoint_cost_s >= 0):
            raise ValueError("defrag: need checkpoint_interval_s > 0 and checkpoint_cost_s >= 0")
