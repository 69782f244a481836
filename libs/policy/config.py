"""Every coefficient of the policy in one frozen, printable record.

Why one record: the live services and the simulator must weigh the same things the same way, and
an operator must be able to print the effective policy (``describe()``) instead of guessing what a
chain of defaults resolved to. Code never hides a weight; it reads it from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from libs.policy.calendar import CalendarConfig
from libs.policy.config_moves import (  # noqa: F401 (re-exported)
    MOVE_RULES,
    DefragConfig,
    PreemptConfig,
    ThermalConfig,
)

REGIMES: tuple[str, ...] = ("low", "balanced", "high")


@dataclass(frozen=True, slots=True)
class RegimeWeights:
    """Weights of the priority terms in one load regime. They sum to 1 so scores stay comparable.

    ``fair_share`` favours tenants using less than their share (DRF), ``energy`` favours jobs that
    do not mind slower/greener GPUs, ``deadline`` favours urgent jobs, ``priority`` is a constant
    term that, multiplied by the base priority, lets the submitted priority dominate.
    """

    fair_share: float
    energy: float
    deadline: float
    priority: float

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def _low() -> RegimeWeights:
    return RegimeWeights(fair_share=0.7, energy=0.1, deadline=0.1, priority=0.1)


def _balanced() -> RegimeWeights:
    return RegimeWeights(fair_share=0.35, energy=0.1, deadline=0.3, priority=0.25)


def _high() -> RegimeWeights:
    return RegimeWeights(fair_share=0.1, energy=0.05, deadline=0.25, priority=0.6)


def _size_mix() -> tuple[tuple[float, float], ...]:
    # Default mix of request sizes (GPUs, probability) for the fragmentation measure when the
    # caller does not pass the pending mix: roughly Philly/openb shaped (mostly 1 GPU).
    return ((0.5, 0.15), (1.0, 0.55), (2.0, 0.1), (4.0, 0.1), (8.0, 0.1))


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """All policy coefficients. Build variants with ``dataclasses.replace(cfg, ...)``."""

    # --- priority (libs.policy.priority) ---
    low_load: float = 0.5  # load below this: "low" regime (fairness first)
    high_load: float = 0.8  # load above this: "high" regime (protect critical jobs)
    weights_low: RegimeWeights = field(default_factory=_low)
    weights_balanced: RegimeWeights = field(default_factory=_balanced)
    weights_high: RegimeWeights = field(default_factory=_high)
    # score added per hour waited (unbounded: starvation freedom). 0.025/h: a priority-0 job
    # outranks a fresh priority-9 one of the same length after at most 36 h of waiting (scores of
    # fresh jobs lie in (0, 1] before the shortness term), any fresh job after (1 + w_short) /
    # aging_per_h = 440 h. Measured on Philly (effective load 0.8): 0.05 let aging swamp priority on
    # long queues; on the first 10k jobs 0.01 / 0.025 / 0.05 gave high-priority mean wait 4,460 /
    # 5,512 / 6,500 s and lowest-class p99 wait 130k / 51k / 73k s (fifo: 54,866 s and 197k s). The
    # lowest class's MAX wait (~470k s) is set by 8-GPU A100-only jobs waiting for a whole node to
    # drain, not by aging.
    aging_per_h: float = 0.025
    urgency_scale_s: float = 3600.0  # slack at which urgency has fallen to 1/e
    urgency_missed: float = 1.0  # urgency of a job whose deadline can no longer be met
    w_urgent: float = 0.5  # + w_urgent x urgency beside w_short while it can be met (stages.rank)
    # Shortest remaining time first (stages.rank: + w_short x short_scale_s / (short_scale_s +
    # remaining runtime on the fastest model), added beside aging, not multiplied by the
    # priority). Issue 15: without it the order ignored runtime, and on full Philly (seed
    # cluster, effective load 0.8, every policy with power saving) jobs under 1 h (88% of the
    # jobs) waited 4.4 h on average for 0.35 h of run; mean JCT 15.8 h against drf's 10.1 h.
    # 10 > any fresh job's other score (<= 1): a job's expected length leads its place, its
    # priority and fair share order jobs of similar length, and aging still wins in the end
    # (a job that waited 400 h outranks every fresh one). 4 h (speed_runtime_scale_s' scale):
    # jobs of minutes and of an hour rank close, a day-long job well below. Measured on the
    # first 20k Philly jobs (mean JCT / high-priority wait / deadlines met): 0 -> 10.22 h /
    # 2.28 h / 57.9%; w 1, 1 h -> 8.12 / 1.82 / 68.8%; w 5, 12 h -> 6.29 / 0.87 / 80.7%;
    # w 10, 4 h -> 6.17 / 1.07 / 80.8%; w 20, 4 h -> 6.12 / 1.13 / 80.4%; multiplied by the
    # priority instead (w 10, 4 h) -> 6.75 / 0.75 / 67.9%. See docs/benchmarks.md, issue 15.
    w_short: float = 10.0
    short_scale_s: float = 4 * 3600.0
    # --- placement (libs.policy.placement) ---
    w_speed: float = 1.0
    # the speed weight grows with the job's length: w_speed x max(1, est runtime / this), so a
    # week-long job is not put on a GPU half as fast (measured on Philly: a 45-day job on a T4
    # set the makespan) while short jobs still go where energy and packing say
    speed_runtime_scale_s: float = 4 * 3600.0
    # Slow-GPU guard (scheduler): a job expected to run at least ``slow_guard_runtime_s`` does
    # not start on a GPU model slower than ``slow_guard_min_speed`` x the fastest model that
    # could hold it, unless it has already waited as long as it would lose there (runtime there
    # minus runtime on the fastest): waiting for a fast node is then never worse than the loss,
    # so the extra wait is bounded. Measured on Philly: 8-GPU jobs of 10-45 days started at once
    # on a free T4 node (2.3x slower) and set the makespan.
    # 1 h: with power saving the free awake GPUs are often a slow model's warm reserve, and a
    # job of hours then waits the 300 s boot of a fast node instead (measured on the Gavel
    # trace, mosaic/gavel mean JCT: 1.21 with 24 h, 0.98 with 1 h)
    slow_guard_runtime_s: float = 3600.0
    slow_guard_min_speed: float = 0.7
    # whether the slow/energy guard holds high-priority jobs (priority >= HIGH_PRIORITY). Off
    # (issue 15, item 5): a high-priority job starts on the fastest model with room now instead
    # of waiting for a busy or booting fast one; see stages.guard for the measurement
    guard_holds_high: bool = False
    w_energy: float = 1.0  # multiplied by the job's green tolerance (scores.green_tolerance)
    # --- energy (issue 3: energy cost <= 0.79x fifo on Philly) ---
    # A job's green tolerance g (scores.green_tolerance) is its energy_sensitivity (high =
    # accepts slower, greener GPUs), 0 for an urgent job (priority >= HIGH_PRIORITY or a
    # deadline): urgent jobs keep choosing by speed. Measured on full Philly, seed cluster,
    # effective load 0.8, energy in the 5-policy bench window (fifo 206,147 kWh): before these
    # changes mosaic used 177.1k kWh (0.859x fifo); most of it is busy time, when every GPU
    # runs and only the MIX of work per GPU model can change (the T4 is always full): RNNs
    # on the A100 (slower than on a V100 and 2x its energy per unit of work) and transformers
    # on the T4 (4.5x slower for 22% less energy) were the waste.
    # Placement: the speed weight is multiplied by (1 - green_speed_relief x g) and, with
    # green_energy_scales, the energy weight grows with the job's length like the speed weight
    # (w x max(1, runtime / speed_runtime_scale_s)): for a long job the two stay comparable and
    # g decides (a 2-day CNN with g 0.9 takes a free T4 over a free A100; g 0.1 does not).
    green_speed_relief: float = 1.0
    green_energy_scales: bool = True
    # Energy guard (stages.guard.hold_waits), for jobs of at least slow_guard_runtime_s. A model
    # is worth it for a job when the energy it saves over the fastest model is at least
    # (1 - green_worth x g) x the speed it loses, both as fractions. A slow model (see the
    # slow-GPU guard) or a model slower AND hungrier than the fastest that is NOT worth it is
    # held energy_guard_factor x the time loss (instead of 1x). green_worth 0.5: even a fully
    # tolerant job does not give up more than twice the speed it saves in energy (keeps
    # transformers, 22% greener but 4.5x slower on a T4, off the T4s the CNNs and RNNs save
    # 60-75% on). Measured (same setup, with the green job rules below): factor 3 -> 0.833x,
    # factor 10 -> 0.818x, + green_worth 0.5 and warm_reserve_frac 0.02 -> 0.801x; factor 30
    # with green_min_tolerance 0.2 -> 0.7935x (hi-pri wait 0.072x, busy util 88.6%).
    energy_guard_factor: float = 30.0
    green_worth: float = 0.5
    # a job with g >= green_min_tolerance and est runtime <= green_max_runtime_s is "green":
    # it takes a slow model that is worth
    # it at once (no slow-GPU wait), its blocked demand wakes the greenest suspended nodes
    # first (libs.sim.baselines.mosaic), and it does not start on a model whose energy per unit
    # of work exceeds green_energy_slack x the greenest model that could hold it until it has
    # waited green_wait_s (it waits for a green node to boot, resume_s, or free up instead of
    # taking whatever power-hungry node is awake). Measured: the green rules alone moved little
    # (0.856x -> 0.850x): the T4s are full whenever work waits, so who gets them matters more.
    # green_min_tolerance 0.3 (with suspend_after_s 300 and warm_reserve_frac 0.01):
    # 0.801x -> 0.797x, high-priority wait 0.074x fifo, busy utilization 89.3%.
    # 0.2 (with energy_guard_factor 30): 0.7935x, see energy_guard_factor.
    green_min_tolerance: float = 0.2
    # 365 days (was 7: "a longer one would set the makespan on a slow GPU"): the energy-JCT
    # optimum (libs.sim.energy_floor) puts wide jobs on the greener model at every length, and
    # the week-plus 8-GPU jobs are where a T4 saves most; see green_min_gpus for the figures
    # and their cost, the makespan
    green_max_runtime_s: float = 365 * 86400.0
    # ... and asks at least green_min_gpus GPUs (issue 15, natural load). Why: mean JCT counts
    # each job once, energy each GPU. On a slower, greener model a job saves gpus x (energy per
    # unit of work on the fast model - on the slow one) per unit of work and loses (1/slow speed
    # - 1/fast speed) seconds per unit of work, so what one second of its delay buys is
    # gpus x that ratio, in watts, whatever the job's length. Per GPU it is 98-148 W for every
    # class the guard lets onto a T4 (seed profiles: CNN 148 W vs the A100, "other" 113 W, RNN
    # 98 W vs the V100), below a reference GPU's busy draw (V100, 186-264 W): a one-GPU job
    # buys less than one GPU's draw per second of delay, a two-GPU one more. Measured at
    # Philly's natural load (seed cluster, 1,024 GPUs, power saving on every policy): of the
    # JCT that long jobs lost on T4s (0.46 h of the mean), one-GPU jobs were 0.21 h for 31k of
    # their 280k T4 GPU-hours, eight-GPU jobs 0.15 h for 199k. 8 (was 2), with no length cap
    # (above): the exact optimum at a price of delay lambda takes the model of least
    # (gpus x power + lambda) / speed, and at the lambda of a mean JCT 1.2x the bound (579 W)
    # no one- or two-GPU job and few 4-GPU ones go to a T4 (docs/design-notes.md, "The
    # energy-JCT frontier"). Measured, power saving on every policy (before -> after): Philly
    # natural seed 1 mean JCT 3.231 -> 3.156 h, 209.8k -> 209.6k kWh; seed 0 3.182 -> 3.112 h,
    # 201.6k -> 200.5k; Helios 50k 2.388 -> 2.328 h, 198.1k -> 191.4k; Philly 0.8 effective
    # seed 1 6.04 -> 5.82 h, high-priority wait 1.29 -> 1.28 h, deadlines 92.1 -> 92.5%,
    # $23,793 -> $23,602. Cost: makespan +8-13% at natural load, +41% at 0.8 (2.4x-slower
    # T4s run the longest wide jobs); with a 30-day cap the makespan stays but at 0.8 every
    # figure is worse than before (6.18 h).
    green_min_gpus: float = 8.0
    green_energy_slack: float = 1.5
    # 1800 s (was 900 s in the runs above; with warm_reserve_frac 0: 0.7893x, see there)
    green_wait_s: float = 1800.0
    w_pack: float = 0.6  # fragmentation / best-fit packing
    w_thermal: float = 0.2
    w_memory_fit: float = 0.3  # avoid big-memory GPUs for small-memory jobs
    size_mix: tuple[tuple[float, float], ...] = field(default_factory=_size_mix)
    # --- thermal ---
    thermal_max_c: float = 85.0  # a node at or above this takes no new job
    thermal_ambient_c: float = 30.0  # headroom is measured from here to thermal_max_c
    thermal: ThermalConfig = field(default_factory=ThermalConfig)  # the guard (issue 14)
    # --- scheduling pass (libs.policy.scheduler / backfill) ---
    backfill: bool = True
    # blocked jobs protected by a reservation per pass: the head and the next ones that cannot
    # start, in rank order (Slurm's backfill reserves for every job it tests; EASY for 1).
    # Without them, a whole-node job below the head never sees a free node while small jobs
    # backfill every freed GPU. Each costs a reservation search when the view changed.
    # Default 1 (EASY): measured on the first 10k Philly jobs (effective load 0.8), 4
    # reservations changed neither the high-priority wait (4,460 s vs 4,370 s) nor the lowest
    # class's max wait (488k s vs 484k s) and made the replay 4x slower (33 s -> 134 s).
    reservations: int = 1
    # how many jobs below a blocked head job may be tried per pass. Unbounded by default: with
    # a cap, a blocked head on a long queue turns into head-of-line blocking (measured on the
    # first 20k Philly jobs: high-priority wait 0.74x fifo at 64, 0.10x unbounded); a row the
    # memoised failed shapes or the largest-free-block check refuses costs a dict lookup.
    backfill_depth: int = 1_000_000
    # Backfill cadence (Slurm's bf_interval, default 30 s there too): the walk below a blocked
    # head job runs at most once per ``backfill_interval_s``; a pass in between starts jobs in
    # rank order and stops at the first that cannot start (Slurm's main scheduler). The
    # simulator asks for a pass at the next backfill time while jobs wait, and the live placer
    # keeps the same clock (libs.policy.cadence). Measured on Philly (effective load 0.8):
    # a full backfill walk on every arrival/finish event is most of the replay's time (28.6k
    # deep passes for the first 20k jobs; 11.5k with 30 s), for waits that are hours long.
    # 0 = backfill on every pass.
    backfill_interval_s: float = 30.0
    # Rank epochs: a full re-rank of the queue happens when this many seconds have passed since
    # the last one, or the load regime or cluster changed; in between, a job keeps the score it
    # got at the epoch and a newly queued job is scored as of the epoch's time (with the fair
    # share of now). Aging moves every score at the same rate, so within an epoch only urgency
    # and fair share go stale. 300 s is Slurm's default PriorityCalcPeriod (5 minutes), the
    # same trade: a long queue is re-scored a few times an hour, not on every event. 0 = re-rank
    # on every pass. A policy choice, identical live and in the simulator wherever the caller
    # keeps a ``PendingQueue`` across passes (a plain list is always fully ranked).
    rerank_interval_s: float = 300.0
    # --- power saving of idle nodes (libs.policy.power; Slurm's SuspendTime/ResumeTimeout) ---
    power_saving: bool = True
    # a node idle this long may be suspended; 300 s (was 600 s): a freed fast node that no
    # waiting job wants sleeps sooner (measured together with green_min_tolerance 0.3)
    suspend_after_s: float = 300.0
    resume_s: float = 300.0  # boot time: a resuming node takes no job until it is up
    # free, awake GPUs kept per GPU model (share of its GPUs): new arrivals start without a
    # boot. 0 (was 0.05; 0.01 keeps one node per model on the seed cluster). Measured with the
    # energy guard above: 0.05 -> 0.02 cut the idle energy ~1k kWh (0.818x -> 0.801x with
    # green_worth), high-priority wait 0.066x fifo; 0.01 with suspend_after_s 300: see
    # green_min_tolerance; 0 with green_wait_s 1800: 0.7935x -> 0.7893x fifo (162.7k kWh),
    # high-priority wait 0.073x, busy util 87.9%, lowest-class p99 168 h, Gavel mean JCT
    # 1.024x gavel: every arrival that finds no free awake GPU waits one boot (resume_s).
    warm_reserve_frac: float = 0.0
    # The demand-following warm reserve (libs.policy.warm): per GPU model, keep awake enough
    # empty nodes for the warm_quantile of the GPUs its recent starts (last warm_history_s)
    # saw started within one boot (resume_s), plus the widest high-priority request started
    # there (warm_high_headroom), at least warm_min_nodes for a model that started any job in
    # the history; the power plan never suspends below it and wakes nodes when it is eaten.
    # Why: at Philly's natural load jobs waited for boots on a mostly idle cluster.
    warm_reserve: bool = True
    warm_history_s: float = 6 * 3600.0
    warm_quantile: float = 0.9
    warm_high_headroom: bool = True
    warm_min_nodes: int = 1
    # the high-priority hold (libs.policy.stages.hold): a GPU model that started a
    # high-priority job within warm_history_s keeps this many more whole GPUs awake, and
    # while it has a node asleep or booting a job below high priority may not take them (0:
    # off). Measured: docs/design-notes.md, "The high-priority hold"
    warm_high_hold_gpus: float = 0.0
    power_demand_cap: int = 256  # blocked jobs (in rank order) the resume decision looks at
    max_places_per_pass: int = 1_000_000  # cap on placements per pass (live placer may lower it)
    explain_top_k: int = 5  # candidates kept in an explained placement
    # --- moving jobs (libs.policy.stages.preempt; issue 14) ---
    preempt: PreemptConfig = field(default_factory=PreemptConfig)
    # --- fragmentation and defragmentation (issue 14) ---
    # FGD's fragmentation term in the placement score (stages.score.s_frag: least growth of
    # the free GPU share the target workload could not use). It acts only when the config
    # carries a target workload (frag_workload: (GPUs, GPU models, CPUs, host memory GB,
    # probability) rows, stages.frag.Workload.as_config), so a replay without one is unchanged.
    w_frag: float = 4.0
    frag_workload: tuple[tuple[float, tuple[str, ...], float, float, float], ...] = ()
    defrag: DefragConfig = field(default_factory=DefragConfig)
    # --- day/night (libs.policy.calendar, libs.policy.daynight; issue 16) ---
    calendar: CalendarConfig = field(default_factory=CalendarConfig)
    # --- sharing a GPU (libs.policy.stages.share, libs.policy.interference; issue 16) ---
    # a fractional job joins a GPU others already share only if every job there (it and each
    # resident) would run at most share_max_slowdown x its runtime alone (a factor, unitless);
    # a job with a latency target at most its target / its solo latency, or, solo latency
    # unknown, share_latency_unknown_max_slowdown (a conservative guess: a target set 10%
    # above what the replica does alone). share_interference=false shares blind (the
    # simulator still slows co-located jobs by the model: the comparison of the issue).
    share_interference: bool = True
    # a service's waiting replica ranks ahead of training (stages.burst.service_boost): this is
    # added to its score, above any fresh job's (at most 1) and any move's resume credit
    # (aging 0.025/h x 7 days = 4.2); a latency target is missed while it waits behind a
    # reservation, since a replica never ends, so it can never backfill below one
    service_rank_boost: float = 10.0
    share_max_slowdown: float = 1.25
    share_latency_unknown_max_slowdown: float = 1.1

    @classmethod
    def default(cls) -> PolicyConfig:
        return cls()

    def weights(self, regime: str) -> RegimeWeights:
        if regime == "low":
            return self.weights_low
        if regime == "balanced":
            return self.weights_balanced
        if regime == "high":
            return self.weights_high
        raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")

    def describe(self) -> dict[str, Any]:
        """The effective policy as plain data (for ``mosaic policy``, logs and reports)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, RegimeWeights):
                v = v.as_dict()
            elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                v = dataclasses.asdict(v)
            out[f.name] = v
        out["size_mix"] = [list(p) for p in self.size_mix]
        out["frag_workload"] = [[g, list(m), c, h, p] for g, m, c, h, p in self.frag_workload]
        return out

    def __post_init__(self) -> None:
        if not 0.0 <= self.low_load <= self.high_load <= 1.0:
            raise ValueError("need 0 <= low_load <= high_load <= 1")
        if self.aging_per_h <= 0:
            raise ValueError("aging_per_h must be > 0 (otherwise a job may wait forever)")
        if self.urgency_scale_s <= 0:
            raise ValueError("urgency_scale_s must be > 0")
        if not (self.w_short >= 0 and self.short_scale_s > 0 and self.w_urgent >= 0):
            raise ValueError("need w_short >= 0, short_scale_s > 0 and w_urgent >= 0")
        if not self.rerank_interval_s >= 0:
            raise ValueError("rerank_interval_s must be >= 0")
        if not 0.0 <= self.green_speed_relief <= 1.0:
            raise ValueError("green_speed_relief must be in [0, 1]")
        if not self.green_min_gpus >= 0:
            raise ValueError("green_min_gpus must be >= 0")
        if self.green_max_runtime_s < 0 or self.green_wait_s < 0:
            raise ValueError("green_max_runtime_s and green_wait_s must be >= 0")
        if self.green_energy_slack < 1.0:
            raise ValueError("green_energy_slack must be >= 1 (the greenest model is allowed)")
        if self.energy_guard_factor < 1.0 or not 0.0 <= self.green_worth <= 1.0:
            raise ValueError("need energy_guard_factor >= 1 and 0 <= green_worth <= 1")
        if self.speed_runtime_scale_s <= 0:
            raise ValueError("speed_runtime_scale_s must be > 0")
        if self.suspend_after_s < 0 or self.resume_s < 0:
            raise ValueError("suspend_after_s and resume_s must be >= 0")
        if not 0.0 <= self.warm_reserve_frac <= 1.0:
            raise ValueError("warm_reserve_frac must be in [0, 1]")
        if not 0.0 <= self.warm_quantile <= 1.0 or self.warm_history_s < 0:
            raise ValueError("need 0 <= warm_quantile <= 1 and warm_history_s >= 0")
        if self.warm_min_nodes < 0 or not self.warm_high_hold_gpus >= 0:
            raise ValueError("warm_min_nodes and warm_high_hold_gpus must be >= 0")
        if self.reservations < 1:
            raise ValueError("reservations must be >= 1 (the head job's)")
        if not self.backfill_interval_s >= 0:
            raise ValueError("backfill_interval_s must be >= 0")
        if self.w_frag < 0:
            raise ValueError("w_frag must be >= 0")
        if not (self.share_max_slowdown >= 1 and self.share_latency_unknown_max_slowdown >= 1):
            raise ValueError("share_max_slowdown and share_latency_unknown_max_slowdown: >= 1")
        if self.backfill_depth < 0:
            raise ValueError("backfill_depth must be >= 0")
