"""The settings of moving jobs: the scheduler's own move rules (``PreemptConfig``) and the two
services that ask for moves, the thermal guard and the defragmenter.

Part of ``config.PolicyConfig`` (``cfg.preempt``, ``cfg.thermal``, ``cfg.defrag``; ``--set
preempt.KEY=...``), in a module of their own because each is a whole record with its own
checks; ``config`` re-exports them.
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


@dataclass(frozen=True, slots=True)
class PreemptConfig:
    """Moving running jobs (``libs.policy.stages.preempt``): who may be moved, how often, and the
    priority-protection rule. The simulator charges ``checkpoint_cost_s`` per move; the live
    executor takes what the job's save takes."""

    enabled: bool = True  # the priority-protection rule (protected jobs are never moved anyway)
    resume_bound_s: float = 1800.0  # a moved job must be able to start again within this
    min_interval_s: float = 3600.0  # a job is not moved twice within this window
    min_run_s: float = 300.0  # nor in the first minutes of an attempt (it would gain nothing)
    protect_priority: int = 8  # a blocked job of at least this priority may preempt
    priority_gap: int = 3  # ... jobs of at most its priority minus this
    min_wait_s: float = 600.0  # ... once it has waited this long
    # ... when the GPU-seconds lost are at most this times the GPU-seconds it has waited
    lost_per_wait: float = 1.0
    at_risk_share: float = 0.1  # share of an attempt's run a move counts as at risk ...
    lost_work_cap_s: float = 1800.0  # ... of at most this much run
    checkpoint_cost_s: float = 30.0  # time a checkpoint takes (sim) / is expected to take
    # moves decided per pass, and victims per plan: 8 (was 4; docs/benchmarks.md, "max_per_pass")
    max_per_pass: int = 8
    interval_s: float = 60.0  # the rule looks at most this often (a plan is a search)
    candidate_nodes: int = 8  # nodes a plan tries per blocked job (most free GPUs first)
    # a moved job is first in line again: its place counts as resume_credit_s older (aging at
    # 0.025/h: +4.2 for a week, above any fresh score), so the resume bound the plan checked
    # is kept (measured on the first 8k Philly jobs: without it p99 resume delay was 20 h)
    resume_credit_s: float = 7 * 86_400.0
    # whether a victim's resume may count on GPUs of running jobs expected to end within the
    # bound. Off: expected ends are estimates (measured on the first 8k Philly jobs, counting
    # them let the p99 resume delay reach 7 h); a victim must have room elsewhere now
    resume_counts_ends: bool = False
    # the burst rule (stages.burst): a service's replica the pass could not place gets room at
    # once, by shrinking or stopping training jobs that may move (no wait, no trade-off)
    burst_enabled: bool = True
    # the grow-back rule (stages.grow): a shrunk elastic job takes its node's free GPUs back,
    # at most once no burst move was made for ``grow_quiet_s`` and no replica waits
    grow_enabled: bool = True
    grow_quiet_s: float = 3600.0
    # short-wait protection (stages.short_wait): a job with at most short_max_s left on the
    # fastest model that has waited short_wait_factor x that (and min_wait_s) may stop jobs that
    # may move and have short_victim_factor x as long left (and over short_max_s), when the work
    # lost is at most lost_per_wait x min(its wait, the delay saved). Chosen once, not fitted:
    # 1 h is where the rank's short term is still >= 0.8; act at slowdown 3; a victim is a
    # job of another order of length (see the stage's docstring)
    short_enabled: bool = True
    short_max_s: float = 3600.0
    short_wait_factor: float = 2.0
    short_victim_factor: float = 4.0
    # boot protection (stages.boot): a blocked job of at least boot_priority that has waited
    # boot_min_wait_s while a node that could hold it sleeps or boots starts now in the place
    # of jobs that may move (priority <= its own - priority_gap), and they resume on the
    # sleeping node once it is up (one boot, power.resume_s, inside resume_bound_s): the wait
    # for the boot goes to the lower priority. Trade-off as priority protection's, with the
    # boot it saves counted as waited. Looked at most every boot_interval_s
    boot_enabled: bool = False  # off until it wins: see docs/design-notes.md, boot protection
    boot_priority: int = 7  # proto.jobs.HIGH_PRIORITY: the jobs the p99 wait is of
    boot_min_wait_s: float = 0.0
    boot_interval_s: float = 15.0

    def __post_init__(self) -> None:
        for name in (
            "resume_bound_s",
            "min_interval_s",
            "min_run_s",
            "min_wait_s",
            "grow_quiet_s",
            "boot_min_wait_s",
            "boot_interval_s",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"preempt.{name} must be >= 0")
        if not self.lost_per_wait >= 0 or not self.checkpoint_cost_s >= 0:
            raise ValueError("preempt.lost_per_wait and preempt.checkpoint_cost_s must be >= 0")
        if not (self.short_max_s >= 0 and self.short_wait_factor >= 0):
            raise ValueError("preempt.short_max_s and preempt.short_wait_factor must be >= 0")
        if not self.short_victim_factor >= 1:
            raise ValueError("preempt.short_victim_factor must be >= 1 (victims are longer)")
        if self.max_per_pass < 0 or self.priority_gap < 0:
            raise ValueError("preempt.max_per_pass and preempt.priority_gap must be >= 0")


# the switches of the rules ``core_moves.preempt_step`` runs: all off, nothing ever moves
MOVE_RULES = ("enabled", "burst_enabled", "short_enabled", "grow_enabled", "boot_enabled")
