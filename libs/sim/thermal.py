"""Heat in the simulator: the thermal model, throttling, and the thermal guard (issue 14).

The simulator's stand-in for the telemetry service and ``services/thermal``, with the same two
definitions: ``libs.policy.thermal_model`` for temperatures and ``libs.policy.stages.thermal``
for the guard's decisions.

- **Temperatures** follow the model between every two instants the engine handles, with each
  GPU's power set by the share allocated on it (``gpu_power_w`` at ``UTIL_PER_SHARE``
  utilization), which is constant between events: the integration is exact, whatever the
  gaps. A node's heat profile is its ``mosaic/heat`` label, or the scenario's ``heat`` for the
  nodes it names hot (``HotNodes``).
- **Throttling**: a busy GPU at or above ``ThermalModel.slowdown_c`` runs at
  ``THROTTLE_SPEED`` (one half: NVML's hardware slowdown halves the clocks or more). A job
  runs at its slowest GPU, so each second one of its GPUs is throttled costs it half a second
  of work; its finish is put off by the work it lost (``deferral_s``, asked by the engine at
  the finish), and a job moved while behind keeps only the progress it really made.
  ``throttled_gpu_s`` counts the busy GPU-seconds spent throttled (share-weighted).
- **The guard** samples every ``ThermalConfig.sim_sample_s`` (the live telemetry's 5 s
  would be millions of samples a replay; a minute is enough for trends of minutes). Its holds
  are the scheduler's ``hot`` cordon (``Scheduler.set_cordoned``); the simulator's guard does
  not die, so a hold's TTL never lapses here. Its migrations are checked by the scheduler's
  own rule (``Scheduler.check_move``, which the live placer applies to the intents) and
  carried out by the engine's move (checkpoint, then requeue with progress). Only a policy
  with a ``core`` scheduler (mosaic) has a guard; the baselines get the heat and the
  throttling alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from libs.policy.config import ThermalConfig
from libs.policy.decisions import MoveOrder
from libs.policy.stages.thermal import HoldAction, MigrateAction, NodeJob, ThermalGuard
from libs.policy.thermal_model import (
    THROTTLE_SPEED,
    UTIL_PER_SHARE,
    ThermalModel,
    gpu_power_w,
    heat_factor,
)
from proto.intents import HOLD_HOT
from proto.nodes import NodeSpec

DEFAULT_HOT_HEAT = 1.5  # a hot rack: 50% more rise above ambient at the same power
MIN_DEFER_S = 1e-3  # lost work below this is forgiven (a finish is not put off forever)
TEMP_STEP_C = 1.0  # the scheduler's view takes a node's temperature when it moved this much


@dataclass(frozen=True)
class HotNodes:
    """The scenario: which nodes run hot, and how hot. ``--hot-nodes a100-0,a100-1`` names
    them; ``--hot-share 0.1`` takes that share of the nodes (at least one), spread evenly
    over the node list (every n-th node: deterministic, and across GPU models)."""

    names: tuple[str, ...] = ()
    share: float = 0.0
    heat: float = DEFAULT_HOT_HEAT

    @classmethod
    def parse(cls, names: str | None, share: float | None, heat: float | None) -> HotNodes | None:
        """The scenario the flags ask for, or None (no hot nodes: no thermal simulation)."""
        got = tuple(n.strip() for n in (names or "").split(",") if n.strip())
        if share is not None and not (math.isfinite(share) and 0 < share <= 1):
            raise ValueError(f"--hot-share must be in (0, 1], got {share}")
        if not got and not share:
            return None
        return cls(got, share or 0.0, DEFAULT_HOT_HEAT if heat is None else heat)

    def heat_by_node(self, nodes: Sequence[NodeSpec]) -> dict[str, float]:
        ids = [n.id for n in nodes]
        unknown = sorted(set(self.names) - set(ids))
        if unknown:
            raise ValueError(f"--hot-nodes names nodes not in the cluster: {', '.join(unknown)}")
        hot = set(self.names)
        if self.share:
            k = max(1, round(self.share * len(ids)))
            step = len(ids) / k
            hot |= {ids[int(i * step)] for i in range(k)}
        return {n: self.heat for n in sorted(hot)}

    def describe(self, nodes: Sequence[NodeSpec]) -> dict[str, Any]:
        return {"hot_nodes": sorted(self.heat_by_node(nodes)), "heat": self.heat}


@dataclass
class ThermalTotals:
    """What heat did in one run (``results.json``: each policy's ``thermal``)."""

    throttled_gpu_s: float = 0.0  # busy GPU-seconds at or above the slowdown temperature
    throttle_lost_s: float = 0.0  # job work-seconds lost to throttling
    holds: int = 0  # nodes held hot (renewals not counted)
    releases: int = 0
    migrations_asked: int = 0
    migrations: int = 0  # asked and allowed by the scheduler's rule
    # the scheduler's refusals when the guard asked whether a job may move (per check)
    migrations_refused: dict[str, int] = field(default_factory=dict)
    hot_node_s: float = 0.0  # node-seconds held hot
    peak_c: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["throttled_gpu_h"] = self.throttled_gpu_s / 3600.0
        return out


class SimThermal:
    """Temperatures, throttling and (for mosaic) the guard over one run of the engine.

    The engine calls ``attach`` once, ``at(t)`` at every instant it handles (the samples are
    instants of their own, ``SAMPLE`` events), and ``deferral_s`` at each finish."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        cfg: ThermalConfig | None = None,
        *,
        heat: Mapping[str, float] | None = None,
        model: ThermalModel | None = None,
        guard: bool = True,
    ) -> None:
        self.cfg = cfg or ThermalConfig()
        self.model = model or ThermalModel()
        self.nodes = list(nodes)
        self.ids = [n.id for n in self.nodes]
        self._row = {nid: i for i, nid in enumerate(self.ids)}
        count = np.array([n.gpu_count for n in self.nodes])
        width = int(count.max())
        self.valid = np.arange(width)[None, :] < count[:, None]
        self.idle_w = np.array([n.idle_power_w for n in self.nodes], dtype=float)[:, None]
        self.max_w = np.array([n.max_power_w for n in self.nodes], dtype=float)[:, None]
        self.heat = np.array([heat_factor(n, (heat or {}).get(n.id)) for n in self.nodes])[:, None]
        idle = self.model.steady_c(self.idle_w, self.max_w, self.heat)
        self.temp_c = np.where(self.valid, np.broadcast_to(idle, self.valid.shape), np.nan)
        self.guard_on = guard and self.cfg.enabled
        self.guard = ThermalGuard(self.cfg)
        self.totals = ThermalTotals()
        self.lost_s: dict[int, float] = {}  # job idx -> work lost to throttling, not yet paid
        self.held: set[str] = set()  # nodes the guard holds now (kept by _apply)
        self._t: float | None = None
        self._next_sample_s = math.inf
        self._engine: Any = None
        self._core: Any = None
        self._push: Callable[[float], None] | None = None

    # ----- the engine's calls --------------------------------------------------------------
    def attach(self, engine: Any, push_sample: Callable[[float], None]) -> None:
        """``push_sample(t)`` puts a sample instant on the engine's heap."""
        self._engine = engine
        self._push = push_sample
        core = getattr(engine.policy, "core", None)
        # the scheduler's view of temperatures (its placement filter and score, as the live
        # placer's from telemetry), and the guard's holds and moves: a policy with a core
        self._view = core if hasattr(core, "set_temp") else None
        self._core = core if self.guard_on and hasattr(core, "set_cordoned") else None
        self._told_c = np.full(len(self.ids), np.nan)

    def start(self, t0: float) -> None:
        self._t = t0
        self._next_sample_s = t0
        self._push(t0)  # type: ignore[misc]

    def at(self, t: float) -> bool:
        """The engine reached ``t``: advance the temperatures (and throttling) to it; sample
        if one is due. True when the guard released a node or moved a job (a pass may place)."""
        self._advance(t)
        if t < self._next_sample_s:
            return False
        changed = self._sample(t)
        e = self._engine
        if e.finished < len(e.jobs) and (e.running or self.held):
            self._next_sample_s = t + self.cfg.sim_sample_s
            self._push(self._next_sample_s)  # type: ignore[misc]
        else:
            self._next_sample_s = math.inf  # nothing runs: a new start brings sampling back
        return changed

    def started(self, job: Any, t: float) -> None:
        """An attempt started: it owes no lost work yet (an earlier attempt's debt went with
        it), and sampling starts again if it had stopped (nothing was running)."""
        self.lost_s.pop(job.idx, None)
        if self._next_sample_s == math.inf and self._push is not None:
            self._next_sample_s = t + self.cfg.sim_sample_s
            self._push(self._next_sample_s)

    def deferral_s(self, job_idx: int) -> float:
        """Work the job lost to throttling and has not made up yet (the engine puts its finish
        off by that much, and asks again then); 0 when it may finish now."""
        lost = self.lost_s.pop(job_idx, 0.0)
        return lost if lost >= MIN_DEFER_S else 0.0

    # ----- the model -----------------------------------------------------------------------
    def _advance(self, t: float) -> None:
        if self._t is None:
            self._t = t
        dt = t - self._t
        if dt <= 0:
            return
        self._t = t
        c = self._engine.cluster
        share = np.where(self.valid, np.clip(1.0 - c.free_share, 0.0, 1.0), 0.0)
        power = gpu_power_w(self.idle_w, self.max_w, share * UTIL_PER_SHARE)
        new = self.model.step(self.temp_c, power, dt, max_power_w=self.max_w, heat=self.heat)
        # a GPU counts as throttled over the step when it ends the step at or above slowdown
        # (steps are short against tau, or long enough that the end is the steady state)
        throttled = self.valid & (share > 0) & self.model.throttled(np.nan_to_num(new))
        self.temp_c = new
        self.totals.hot_node_s += dt * len(self.held)
        if not throttled.any():
            return
        self.totals.throttled_gpu_s += float((share * throttled).sum()) * dt
        hot_rows = set(np.flatnonzero(throttled.any(axis=1)).tolist())
        idx = c.index
        for job in self._engine.running.values():
            if job.ckpt_start_s >= 0:
                continue  # saving its checkpoint: it computes nothing either way
            for a in job.allocs:
                n = idx[a.node]
                if n in hot_rows and throttled[n, list(a.gpu_indices)].any():
                    lost = dt * (1.0 - THROTTLE_SPEED)
                    self.lost_s[job.idx] = self.lost_s.get(job.idx, 0.0) + lost
                    self.totals.throttle_lost_s += lost
                    break

    # ----- the guard -----------------------------------------------------------------------
    def _sample(self, t: float) -> bool:
        peaks = np.nanmax(self.temp_c, axis=1)
        self.totals.peak_c = max(self.totals.peak_c, float(peaks.max()))
        if self._view is not None:
            moved = ~(np.abs(peaks - self._told_c) < TEMP_STEP_C)
            for i in np.flatnonzero(moved).tolist():
                self._told_c[i] = round(float(peaks[i]), 1)
                self._view.set_temp(self.ids[i], float(self._told_c[i]))
        if self._core is None:
            return False
        cfg, guard = self.cfg, self.guard
        changed = False
        on_node: dict[str, list] | None = None
        # only nodes over the threshold now, or held or counting a window, can change: a cool
        # quiet node's sample would only move its last time (the per-node loop stays small)
        active = {self._row[n] for n, st in guard.nodes.items() if st.hot or any(st.over_run)}
        rows = sorted(active | set(np.flatnonzero(peaks >= cfg.threshold_c).tolist()))
        for i in rows:
            node = self.ids[i]
            jobs: list[NodeJob] = []
            if peaks[i] >= cfg.threshold_c:  # only then may the guard migrate
                if on_node is None:
                    on_node = self._running_by_node()
                jobs = [
                    NodeJob(j.spec.id, j.attempts, a.gpu_indices) for j, a in on_node.get(node, ())
                ]
            temps = self.temp_c[i, self.valid[i]].tolist()
            movable = lambda nj, _n=node: self._may(nj, _n, t)  # noqa: E731
            for action in guard.observe(node, temps, t, jobs, movable):
                changed |= self._apply(action, t, on_node or {})
        return changed

    def _running_by_node(self) -> dict[str, list]:
        out: dict[str, list] = {}
        for job in self._engine.running.values():
            for a in job.allocs:
                out.setdefault(a.node, []).append((job, a))
        return out

    def _may(self, job: NodeJob, node: str, t: float) -> bool:
        """The scheduler's own verdict on moving this attempt now (what the live placer
        answers an intent with): the guard asks only for moves that will be committed."""
        check = getattr(self._core, "check_move", None)
        if check is None:
            return False  # a scheduler without the move rule moves nothing
        why = check(job.job_id, job.attempt, node, t, kind="migrate")
        if why:  # counted by the rule that refused (its numbers left out)
            key = re.sub(r"\d+(\.\d+)?", "N", why)
            self.totals.migrations_refused[key] = self.totals.migrations_refused.get(key, 0) + 1
        return not why

    def _apply(self, action: HoldAction | MigrateAction, t: float, on_node: dict) -> bool:
        if isinstance(action, HoldAction):
            if action.renewal:
                return False
            self._core.set_cordoned(action.node, HOLD_HOT, action.on)
            (self.held.add if action.on else self.held.discard)(action.node)
            self.totals.holds += action.on
            self.totals.releases += not action.on
            return not action.on
        self.totals.migrations_asked += 1
        pairs = on_node.get(action.node, ())
        job = next((j for j, _a in pairs if j.spec.id == action.job_id), None)
        if job is None or not self._move(job, action, t):
            return False
        self.totals.migrations += 1
        return True

    def _move(self, job: Any, action: MigrateAction, t: float) -> bool:
        """Carry out an allowed migration as the live placer commits an intent: the scheduler
        records the move (``order_move``) and the engine checkpoints the job and requeues it
        with its progress (``libs.sim.moves``). A job behind because of throttling keeps only
        the progress it really made."""
        mover = getattr(self._engine, "_mover", None)
        if mover is None or job.ckpt_start_s >= 0:
            return False
        order = MoveOrder(
            action.job_id, action.attempt, action.node, "migrate", action.reason, source="thermal"
        )
        self._core.order_move(order, t)
        lost = self.lost_s.pop(job.idx, 0.0)
        if lost and job.attempt_full_s > 0:
            job.progress -= lost / job.attempt_full_s  # the checkpoint adds the wall time run
        mover.apply([(job, "migrate", action.reason, 0)], t)
        return True


def sim_thermal_for(
    policy: Any, nodes: Sequence[NodeSpec], scenario: HotNodes | None
) -> SimThermal | None:
    """The thermal simulation of one run: None without a scenario (no hot node, no heat
    label: nothing to simulate, and replays stay as fast as before). The guard's config is the
    policy's own (``PolicyConfig.thermal``), so ``--set thermal.enabled=false`` turns it off."""
    labelled = any("mosaic/heat" in n.labels for n in nodes)
    if scenario is None and not labelled:
        return None
    cfg = getattr(getattr(policy, "cfg", None), "thermal", None) or ThermalConfig()
    heat = scenario.heat_by_node(nodes) if scenario is not None else {}
    return SimThermal(nodes, cfg, heat=heat, guard=True)


def totals_of(runs: Collection[SimThermal]) -> list[dict[str, Any]]:
    return [r.totals.as_dict() for r in runs]


def without_guard(policy: Any) -> Any:
    """A fresh instance of ``policy`` with the same config but the guard off (the comparison
    run of a hot-node scenario), or None for a policy without a thermal config."""
    cfg = getattr(policy, "cfg", None)
    if cfg is None or not hasattr(cfg, "thermal") or not cfg.thermal.enabled:
        return None
    off = replace(cfg, thermal=replace(cfg.thermal, enabled=False))
    return type(policy)(off)


def guard_report(
    scenario: HotNodes, nodes: Sequence[NodeSpec], on: SimThermal, off: SimThermal
) -> dict[str, Any]:
    """``results.json``'s ``thermal``: the scenario, the run with the guard and the one
    without, and what the guard avoided (throttled GPU-hours, work lost to throttling)."""
    a, b = on.totals.as_dict(), off.totals.as_dict()
    return {
        **scenario.describe(nodes),
        "throttle_speed": THROTTLE_SPEED,
        "slowdown_c": on.model.slowdown_c,
        "threshold_c": on.cfg.threshold_c,
        "with_guard": a,
        "without_guard": b,
        "migrations": a["migrations"],
        "throttled_gpu_h_avoided": b["throttled_gpu_h"] - a["throttled_gpu_h"],
        "throttle_lost_h_avoided": (b["throttle_lost_s"] - a["throttle_lost_s"]) / 3600.0,
    }


def summary_line(results: dict[str, Any]) -> str | None:
    """One line for the terminal about a hot-node scenario's ``thermal`` block, or None."""
    t = results.get("thermal")
    if not t:
        return None
    a, b = t["with_guard"], t["without_guard"]
    return (
        f"thermal guard on {len(t['hot_nodes'])} hot nodes (heat {t['heat']:g}): "
        f"{a['holds']} holds, {t['migrations']} migrations; throttled GPU-hours "
        f"{b['throttled_gpu_h']:,.1f} without -> {a['throttled_gpu_h']:,.1f} with "
        f"(avoided: {t['throttled_gpu_h_avoided']:,.1f})"
    )
