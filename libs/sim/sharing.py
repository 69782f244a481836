"""Interference in the simulator (issue 16): fractional jobs that share a GPU run slower.

What is modelled: while fractional jobs share a GPU slot, each runs at 1 / f of its speed
alone, f = ``InterferenceModel.slowdown_among(its class, the others' classes)``; f is re-read
whenever a job joins or leaves the slot (sharing begins or ends), so a job is slowed exactly
for the time it shares, by the neighbours it has then (piecewise constant). Whole-GPU jobs
never share a slot, so they are never slowed here.

How it reaches the clock: the engine plans an attempt's finish as if it ran alone; at that
time ``deferral_s`` says how much work the job lost and has not made up, the engine puts the
finish off by that much and asks again then (the thermal model's way, ``libs.sim.thermal``),
until less than ``MIN_DEFER_S`` is owed. A job both throttled and slowed by a
neighbour owes both losses (they add; they are not compounded). Not modelled: a checkpoint's
progress counts the attempt's wall time (a moved shared job keeps slightly more progress
than it made), and the slowdown of the GPU's memory or host is not separate from the factor.

The policy's switch ``share_interference`` decides where fractions go; this model decides how
fast they then run, whatever the policy did: that is the comparison the issue asks for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from libs.policy.interference import InterferenceModel
from libs.sim.state import COMPLETED, SimJob

EPS = 1e-9
MIN_DEFER_S = 1e-3  # below this the finish stands (float noise of the accounting)


@dataclass(slots=True)
class _Run:
    """One shared-capable attempt: its slot, its factor since ``since_s``, its accounts."""

    slot: tuple[str, int]
    cls: str
    factor: float = 1.0
    since_s: float = 0.0
    lost_s: float = 0.0  # work (solo seconds) lost to neighbours so far
    deferred_s: float = 0.0  # wall seconds the finish was already put off for it


@dataclass
class SimSharing:
    """The engine's interference accounts (module docstring)."""

    model: InterferenceModel = field(default_factory=InterferenceModel.default)
    _runs: dict[int, _Run] = field(default_factory=dict)
    _slots: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    # per job (idx): total wall seconds lost to sharing over all attempts, and the largest
    # factor it ran at (for the report: a latency target broken while it shared)
    lost_by_job: dict[int, float] = field(default_factory=dict)
    worst_by_job: dict[int, float] = field(default_factory=dict)

    def started(self, job: SimJob, now: float) -> None:
        """An attempt started: a fractional one joins its GPU slot's sharers."""
        if len(job.allocs) != 1 or job.allocs[0].gpu_share >= 1.0 - EPS:
            return
        a = job.allocs[0]
        slot = (a.node, a.gpu_indices[0])
        here = self._slots.setdefault(slot, set())
        self._settle(here, now)
        here.add(job.idx)
        self._runs[job.idx] = _Run(slot, job.spec.workload_class, since_s=now)
        self._refactor(here)

    def stopped(self, job: SimJob, now: float) -> None:
        """An attempt ended (any way): its neighbours lose it."""
        run = self._runs.get(job.idx)
        if run is None:
            return
        here = self._slots[run.slot]
        self._settle(here, now)
        del self._runs[job.idx]
        self.lost_by_job[job.idx] = self.lost_by_job.get(job.idx, 0.0) + run.deferred_s
        here.discard(job.idx)
        if here:
            self._refactor(here)
        else:
            del self._slots[run.slot]

    def deferral_s(self, job_idx: int, now: float) -> float:
        """Wall seconds to put the job's finish off by so that it makes up the work its
        neighbours cost it (0: it may finish now). At its planned finish it has done the work
        of its wall time less ``lost_s``, plus the deferrals so far. It is put off by the work
        still owed, not that x its factor: a neighbour may leave meanwhile (the factor falls)
        and the engine cannot bring a finish forward, so the finish is approached from below,
        each deferral owing (1 - 1/factor) of the one before (a few events per shared job)."""
        run = self._runs.get(job_idx)
        if run is None:
            return 0.0
        self._settle(self._slots[run.slot], now)
        owed = run.lost_s - run.deferred_s
        if owed < MIN_DEFER_S:
            return 0.0
        run.deferred_s += owed
        return owed

    def factor(self, job_idx: int) -> float:
        """The slowdown the job's co-tenants cause it now (1: it shares with nobody)."""
        run = self._runs.get(job_idx)
        return run.factor if run is not None else 1.0

    # ----- accounts --------------------------------------------------------------------------
    def _settle(self, idxs: Iterable[int], now: float) -> None:
        """Book each run's loss since its factor was last set, up to ``now``."""
        for i in idxs:
            run = self._runs[i]
            dt = now - run.since_s
            if dt > 0 and run.factor > 1.0:
                run.lost_s += dt * (1.0 - 1.0 / run.factor)
            run.since_s = max(run.since_s, now)

    def _refactor(self, here: set[int]) -> None:
        runs_idx = sorted(here)
        runs = [self._runs[i] for i in runs_idx]
        for k, run in enumerate(runs):
            others = [r.cls for j, r in enumerate(runs) if j != k]
            run.factor = f = self.model.slowdown_among(run.cls, others)
            i = runs_idx[k]
            if f > self.worst_by_job.get(i, 1.0):
                self.worst_by_job[i] = f


def fractional_report(jobs: Iterable[SimJob], sharing: SimSharing | None) -> dict:
    """Throughput and completion time of the fractional jobs of one run, and what sharing
    cost them (the issue's comparison): completed count, mean and p95 JCT in s, the mean
    wall seconds each lost to neighbours, the share of them that ever lost any; and of the
    jobs with a latency target and a solo latency, how many shared at a factor that put
    their p99 (solo x factor) past the target."""
    frac = [j for j in jobs if j.spec.gpus < 1.0 - EPS]
    worst = sharing.worst_by_job if sharing else {}
    timed = [j for j in frac if j.spec.latency_p99_ms and j.spec.solo_latency_p99_ms]
    broken = sum(
        1
        for j in timed
        if j.spec.solo_latency_p99_ms * worst.get(j.idx, 1.0) > j.spec.latency_p99_ms + EPS
    )
    done = [j for j in frac if j.state == COMPLETED]
    jct = sorted(j.end_s - j.submit_s for j in done)
    lost = [(sharing.lost_by_job.get(j.idx, 0.0) if sharing else 0.0) for j in done]
    return {
        "fractional_jobs": len(frac),
        "completed": len(done),
        "mean_jct_s": sum(jct) / len(jct) if jct else None,
        "p95_jct_s": jct[min(len(jct) - 1, int(0.95 * len(jct)))] if jct else None,
        "mean_lost_to_sharing_s": sum(lost) / len(lost) if lost else None,
        "slowed_share": sum(1 for x in lost if x > 0) / len(lost) if lost else None,
        "latency_jobs": len(timed),
        "latency_targets_broken": broken,
        "model": None if sharing is None else "libs.sim.sharing (interference.json)",
    }
