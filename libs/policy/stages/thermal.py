"""Thermal guard: when a node runs too hot, hold it and move its jobs away (issue 14).

The decision, as a small state machine per node fed one sample at a time (node, per-GPU
temperatures, time), the same for ``services/thermal`` (telemetry every 5 s) and the simulator
(``libs.sim.thermal``, at its sample instants):

- **cool -> hot**: a GPU reads at or above ``threshold_c`` in ``window`` consecutive
  samples (the same GPU). One hot sample is noise (a reading spike, a burst of work); a window
  of them is a trend. The node is held (``HoldAction(on=True)``: no new work) and its jobs migrate.
- **while hot**: the hold is renewed every ``window`` samples (its TTL covers
  ``hold_ttl_windows`` windows of the node's sample cadence, so a dead guard's hold lapses), and
  each window, while some GPU is still at or above the threshold, up to
  ``max_moves_per_window`` jobs are asked to migrate: those the caller's ``movable`` predicate
  allows (the placer's own rule, ``libs.policy.stages.preempt``), the one on the hottest GPU
  first. A job attempt is asked once per hot spell: a refusal (the placer's reason is in its
  audit record) is not retried every window. Once no GPU is over the threshold any more, the
  remaining jobs stay: the hold keeps new work off and the node cools with less load.
- **hot -> cool**: every GPU reads below ``clear_c`` in ``window`` consecutive samples
  (hysteresis: a GPU hovering around the threshold keeps the node held instead of flapping);
  the hold is released (``HoldAction(on=False)``).

A sample not newer than the node's last one is ignored (a redelivery, or one out of order).
No I/O, no clock: time comes with the samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from libs.policy.config import ThermalConfig


@dataclass(frozen=True, slots=True)
class NodeJob:
    """One job attempt running on the node, and the GPUs it holds there."""

    job_id: str
    attempt: int
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class HoldAction:
    """Hold ``node`` out of placement (``on``) for ``ttl_s`` seconds unless renewed, or
    release it. ``detected_s``: the time of the first over-threshold sample of the window that
    made the node hot (the start of detection-to-intent latency); ``renewal``: a renewed hold."""

    node: str
    on: bool
    ttl_s: float
    reason: str
    detected_s: float
    renewal: bool = False


@dataclass(frozen=True, slots=True)
class MigrateAction:
    """Move ``job_id``'s ``attempt`` off ``node``; ``gpu`` is its hottest GPU at ``temp_c``."""

    node: str
    job_id: str
    attempt: int
    gpu: int
    temp_c: float
    reason: str
    detected_s: float


Action = HoldAction | MigrateAction


@dataclass(slots=True)
class NodeState:
    """What the guard remembers of one node (rebuilt from telemetry after a restart)."""

    hot: bool = False
    last_s: float | None = None
    interval_s: float = 0.0  # the last gap between two samples
    over_run: list[int] = field(default_factory=list)  # per GPU: consecutive samples >= threshold
    over_since_s: list[float] = field(default_factory=list)  # per GPU: that run's first sample
    clear_run: int = 0  # consecutive samples with every GPU < clear_c (while hot)
    since_window: int = 0  # samples since the hold was set or renewed (while hot)
    detected_s: float = 0.0
    asked: set[tuple[str, int]] = field(default_factory=set)  # attempts asked to move


def hottest(temps_c: Sequence[float], gpus: Sequence[int]) -> tuple[int, float]:
    """(index, temperature) of the hottest of ``gpus`` that has a reading; (-1, -inf) if none."""
    best = (-1, float("-inf"))
    for g in gpus:
        if 0 <= g < len(temps_c) and temps_c[g] > best[1]:
            best = (g, float(temps_c[g]))
    return best


def migration_order(
    temps_c: Sequence[float], jobs: Sequence[NodeJob]
) -> list[tuple[NodeJob, int, float]]:
    """The node's jobs with their hottest GPU, hottest first (ties: job id, for determinism)."""
    ranked = [(j, *hottest(temps_c, j.gpu_indices)) for j in jobs]
    ranked.sort(key=lambda r: (-r[2], r[0].job_id))
    return ranked


class ThermalGuard:
    """The guard's state over every node; ``observe`` one sample, get the actions it causes."""

    def __init__(self, cfg: ThermalConfig | None = None) -> None:
        self.cfg = cfg or ThermalConfig()
        self.nodes: dict[str, NodeState] = {}

    def is_hot(self, node: str) -> bool:
        state = self.nodes.get(node)
        return state is not None and state.hot

    def hot_nodes(self) -> set[str]:
        return {n for n, s in self.nodes.items() if s.hot}

    def forget(self, node: str) -> None:
        """The node left the cluster: nothing to hold or release any more."""
        self.nodes.pop(node, None)

    def ttl_s(self, state: NodeState) -> float:
        """How long a hold lasts unless renewed: ``hold_ttl_windows`` windows of the node's
        sample cadence, so a renewal every window has room to be late (and the figure holds
        at any clock speed), never less than ``hold_ttl_min_s``."""
        c = self.cfg
        return max(c.hold_ttl_min_s, c.hold_ttl_windows * c.window * state.interval_s)

    def observe(
        self,
        node: str,
        temps_c: Sequence[float],
        time_s: float,
        jobs: Sequence[NodeJob] = (),
        movable: Callable[[NodeJob], bool] = lambda _job: True,
    ) -> list[Action]:
        """Feed one sample of ``node`` (its GPUs' temperatures at ``time_s``, and the jobs
        running on it now); return the holds and migrations it causes, in order."""
        state = self.nodes.setdefault(node, NodeState())
        if state.last_s is not None and time_s <= state.last_s:
            return []
        if state.last_s is not None:
            state.interval_s = time_s - state.last_s
        state.last_s = time_s
        peak = max(temps_c, default=float("-inf"))
        over = peak >= self.cfg.threshold_c
        self._count_runs(state, temps_c, time_s)
        if not state.hot:
            return self._maybe_heat(node, state, peak, temps_c, jobs, movable)
        return self._while_hot(node, state, peak, over, temps_c, jobs, movable)

    def _count_runs(self, state: NodeState, temps_c: Sequence[float], time_s: float) -> None:
        """Each GPU's run of consecutive over-threshold samples (a GPU added later starts at 0)."""
        n = len(temps_c)
        if len(state.over_run) != n:
            state.over_run = (state.over_run + [0] * n)[:n]
            state.over_since_s = (state.over_since_s + [time_s] * n)[:n]
        for g, t in enumerate(temps_c):
            if t >= self.cfg.threshold_c:
                if state.over_run[g] == 0:
                    state.over_since_s[g] = time_s
                state.over_run[g] += 1
            else:
                state.over_run[g] = 0

    def sustained(self, state: NodeState) -> bool:
        """Some GPU has been at or above the threshold for a whole window."""
        return any(r >= self.cfg.window for r in state.over_run)

    def _maybe_heat(self, node, state, peak, temps_c, jobs, movable) -> list[Action]:
        c = self.cfg
        if not self.sustained(state):
            return []
        state.hot = True
        state.clear_run = 0
        state.since_window = 0
        # the start of the first GPU's completed window: detection-to-intent starts there
        state.detected_s = min(
            s for r, s in zip(state.over_run, state.over_since_s, strict=True) if r >= c.window
        )
        state.asked = set()
        reason = (
            f"hot: a GPU at or above {c.threshold_c:g} C for {c.window} samples (peak {peak:.1f} C)"
        )
        hold = HoldAction(node, True, self.ttl_s(state), reason, state.detected_s)
        return [hold, *self._migrations(node, state, temps_c, jobs, movable)]

    def _while_hot(self, node, state, peak, over, temps_c, jobs, movable) -> list[Action]:
        c = self.cfg
        state.clear_run = state.clear_run + 1 if peak < c.clear_c else 0
        if state.clear_run >= c.window:
            state.hot = False
            state.over_run = [0] * len(state.over_run)
            state.asked = set()
            reason = f"cooled: every GPU below {c.clear_c:g} C for {c.window} samples"
            return [HoldAction(node, False, 0.0, reason, state.detected_s)]
        state.since_window += 1
        if state.since_window < c.window:
            return []
        state.since_window = 0
        reason = f"still hot (peak {peak:.1f} C): hold renewed"
        out: list[Action] = [
            HoldAction(node, True, self.ttl_s(state), reason, state.detected_s, renewal=True)
        ]
        if over:
            out += self._migrations(node, state, temps_c, jobs, movable)
        return out

    def _migrations(self, node, state, temps_c, jobs, movable) -> list[MigrateAction]:
        """Up to ``max_moves_per_window`` movable jobs not yet asked, hottest GPU first."""
        c = self.cfg
        out: list[MigrateAction] = []
        for job, gpu, temp in migration_order(temps_c, jobs):
            if len(out) >= c.max_moves_per_window:
                break
            key = (job.job_id, job.attempt)
            if key in state.asked or not movable(job):
                continue
            state.asked.add(key)
            reason = f"thermal: GPU {gpu} of {node} at {temp:.1f} C (>= {c.threshold_c:g} C)"
            out.append(
                MigrateAction(node, job.job_id, job.attempt, gpu, temp, reason, state.detected_s)
            )
        return out
