"""The simulator's side of profile learning: what a completed attempt tells the learner.

The live profiler (``services/profiler``) learns from ``Completed`` events: the attempt's
runtime, its energy, the progress it resumed from. This is the same observation made from the
engine's job record, fed to the same rule (``libs.policy.profile_learning``), so a learning run
in the simulator predicts what the live cluster does with a wrong table.

An attempt counts only when it completed: not one cut short by OOM (``job.oom``) or by a
checkpoint (``job.moves`` grew since its start). Its power is its energy above idle over its
GPU-seconds plus the model's idle power as the engine counts it (the engine accounts energy
above idle; live, the power measured is the whole draw).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from libs.policy.profile_learning import (
    LearningConfig,
    ProfileLearner,
    observed_speed,
)
from libs.policy.profiles import ProfileTable
from libs.sim.profile_error import log_error, perturbed
from proto.nodes import NodeSpec


class ProfileFeed:
    """Makes the policy's table (perturbed or exact) and feeds it completed attempts."""

    def __init__(
        self, error: float, learning: bool, seed: int, cfg: LearningConfig | None = None
    ) -> None:
        self.error, self.learning, self.seed = float(error), bool(learning), int(seed)
        self.cfg = cfg or LearningConfig()
        self.learner: ProfileLearner | None = None
        self.truth: ProfileTable | None = None
        self._engine_idle: ProfileTable | None = None
        self.models: list[str] = []
        self._start: dict[str, tuple[int, float, float]] = {}  # job -> moves, progress, energy
        self.observations = 0
        self.start_log_error = 0.0

    def attach(
        self, truth: ProfileTable, nodes: Sequence[NodeSpec], models: Sequence[str]
    ) -> ProfileTable:
        """The table the scheduler starts with."""
        self._engine_idle = truth  # the engine's idle powers: part of what it measures
        self.truth, self.models = truth.covering(nodes), list(models)
        table = perturbed(self.truth, self.models, self.error, self.seed)
        self.start_log_error = log_error(table, self.truth, self.models)
        if self.learning:
            self.learner = ProfileLearner(table, self.cfg)
        return table

    def started(self, job: Any) -> None:
        if self.learner is not None:
            self._start[job.spec.id] = (job.moves, job.progress, job.energy_active_j)

    def ended(self, job: Any, now: float) -> ProfileTable | None:
        """The new table when this attempt's observation changed it, else None."""
        if self.learner is None:
            return None
        moves, progress, energy_j = self._start.pop(job.spec.id, (-1, 0.0, 0.0))
        if job.oom or job.moves != moves or not job.model:
            return None
        run_s = now - job.start_s
        speed = observed_speed(job.spec.est_runtime_s, 1.0 - progress, run_s)
        if speed is None:
            return None
        gpus = job.spec.gpus
        assert self._engine_idle is not None
        idle_w = self._engine_idle.idle_power_w(job.model)
        power_w = (job.energy_active_j - energy_j) / (gpus * run_s) + idle_w
        self.observations += 1
        cls, fw = job.spec.workload_class, job.spec.framework
        if self.learner.observe(job.model, cls, fw, speed, power_w):
            return self.learner.table()
        return None

    def report(self, table: ProfileTable) -> dict | None:
        """results.json's ``profiles``: the error, whether it learnt, how wrong the table was
        at the start and is at the end (mean |log speed ratio| to the truth)."""
        if self.error == 0.0 and not self.learning:
            return None
        assert self.truth is not None
        learnt = self.learner.learnt if self.learner is not None else {}
        return {
            "error": self.error,
            "learning": self.learning,
            "seed": self.seed,
            "observations": self.observations,
            "learnt_rows": sum(1 for v in learnt.values() if v.counts(self.cfg)),
            "log_error_start": self.start_log_error,
            "log_error_end": log_error(table, self.truth, self.models),
        }
