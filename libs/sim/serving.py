"""Inference services in a replay (issue 16): the scaler's orders applied, the latency model.

**Driving.** At each load point the engine hands the service's rate to the scaler
(``LoadReport``, rate only: ``p99_ms`` is not reported, so the scaler sees what a rate-based
autoscaler sees); at every instant, before the pass, it asks the scaler for orders and applies
them as ``tests/policy/test_scale.py``'s driver does: each added replica becomes a job queued
now (a ``SimJob`` appended to the replay). A replica never completes by itself: the engine
plans no finish for it.

**A stop is applied as the live placer applies it** (``services.placer.scaling``: the cancel
path), so the two drivers free the same GPUs at the same instants: a waiting replica ends
``cancelled`` at once; a running one stops serving at the order but keeps its GPUs through the
instant's pass, moves and power step, as live keeps its ledger entry until the executor
answers the kill; its end is an engine event (``STOPPED``) at the same Mosaic time (the
stepped executor answers a kill at once: ``Cancelled`` at the step's time), handled as the
next instant, which frees the GPUs and passes again, as the placer cycles again once every
kill of its step is answered (``services.placer.stepping``). Either way the replica ends
``cancelled``, the reason ``scaled down: <the scaler's reason>``, as live's ``Cancelled``.

Every policy gets the same rule's orders: Mosaic's come from its own ``core.Scheduler``
(``scale_step``), any other policy's from a ``libs.policy.scaling.Autoscaler`` this module
feeds with the replicas' lifecycle. What differs is what the policy does with a replica: to a
baseline it is a job like any other (placed in its order, preempted as its rule says, though
the engine's mover never moves it: it is not checkpointable); Mosaic ranks it by its priority
and makes room for it by the burst rule (``libs.policy.stages.burst``).

**The latency model** (per service, per load minute): capacity at an instant is the sum over
serving replicas of ``rps_per_replica x speed(GPU model) / speed(reference) / f``, ``f`` the
interference slowdown its GPU's co-tenants cause it now (``libs.sim.sharing``, the
interference model's truth whatever the policy assumed; 1 when it shares with nobody or the
replay runs without interference). A replica whose p99 (``solo_latency_p99_ms x f /`` its
speed ratio, when the solo latency is known) is past its target serves nothing within it. A
minute meets its target when capacity is short of the minute's rate for at most 1% of it:
requests that arrive while capacity is short are taken as late (they queue), and a p99 can
absorb 1% of late requests. Assumptions: throughput at the target scales with the GPU's
speed and inversely with the slowdown (no batching effects), load is spread evenly over the
serving replicas, a replica serves from the instant it starts (no warm-up).

**Request to capacity**: for each replica a scale-up added (reason ``up:``), from the time of
the load report that asked for it (``ScaleOrder.report_time``) to the replica's start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from libs.policy.profiles import REFERENCE_MODEL
from libs.policy.scaling import Autoscaler, ScaleOrder
from libs.sim.event_kinds import LOAD, STOPPED
from libs.sim.services import ServiceLoad
from libs.sim.state import CANCELLED, COMPLETED, PENDING, RUNNING, SimJob
from proto.inference import LoadReport
from proto.service_views import SCALED_DOWN

LATE_SHARE = 0.01  # a minute's p99 absorbs this share of late requests
EPS = 1e-9


def summary_lines(results: dict) -> list[str]:
    """One line per policy of a replay with services (the CLI prints them under its table)."""
    out = []
    for name, m in results.get("policies", {}).items():
        s = m.get("services")
        if s is None:
            continue
        met = s["latency_minutes_met_share"]
        p50, p99 = s["burst_request_to_capacity_p50_s"], s["burst_request_to_capacity_p99_s"]
        out.append(
            f"{name}: latency minutes met {'-' if met is None else f'{met:.2%}'}, "
            f"request-to-capacity p50/p99 {p50 if p50 is None else round(p50)}/"
            f"{p99 if p99 is None else round(p99)} s, replicas +{s['replicas_added']} "
            f"-{s['replicas_stopped']}"
        )
    return out


class _Standalone:
    """The scaler of a policy without Mosaic's scheduler: the same rule, fed by this module."""

    def __init__(self) -> None:
        self.a = Autoscaler()
        self.define_service, self.remove_service = self.a.define, self.a.remove
        self.service_load, self.scale_step, self.scale_next_s = (
            self.a.report,
            self.a.step,
            self.a.next_s,
        )


@dataclass
class _Minutes:
    """One service's load minutes: the rate of each, and how long capacity fell short."""

    times_s: Sequence[float]
    rps: Sequence[float]
    end_s: float
    short_s: np.ndarray = field(init=False)
    k: int = -1  # the current minute (-1: before the curve)
    capacity_rps: float = 0.0
    since_s: float = 0.0

    def __post_init__(self) -> None:
        self.short_s = np.zeros(len(self.times_s))

    def close(self, now: float) -> None:
        """Account ``[since_s, now)`` at the current capacity to the current minute."""
        if self.k >= 0 and now > self.since_s and self.capacity_rps < self.rps[self.k] - EPS:
            self.short_s[self.k] += now - self.since_s
        self.since_s = max(self.since_s, now)

    def met(self) -> np.ndarray:
        ends = np.append(np.asarray(self.times_s[1:], dtype=float), self.end_s)
        length = ends - np.asarray(self.times_s, dtype=float)
        return self.short_s <= LATE_SHARE * length + EPS


class SimServices:
    """The services of one replay (module docstring)."""

    LOAD = LOAD  # the engine's event kind: a load point (idx >= 0), an end (-2), a check (-1)

    def __init__(self, loads: Sequence[ServiceLoad], profiles: Any, sharing: Any = None) -> None:
        self.loads = {sl.service.id: sl for sl in loads}
        self.profiles = profiles
        self.sharing = sharing
        self.points = sorted(
            (t, sid, k) for sid, sl in self.loads.items() for k, t in enumerate(sl.times_s)
        )
        self.ends = sorted((sl.end_s, sid) for sid, sl in self.loads.items())
        self.minutes = {
            sid: _Minutes(sl.times_s, sl.rps, sl.end_s) for sid, sl in self.loads.items()
        }
        self.serving: dict[str, dict[int, SimJob]] = {sid: {} for sid in self.loads}
        self.asked_at: dict[str, float] = {}  # replica id -> the report its scale-up answers
        self.rtc_s: list[float] = []
        self.added = self.stopped = self.unanswered = 0
        self.by_id: dict[str, SimJob] = {}
        self._stopping: dict[int, str] = {}  # a running replica ordered to stop -> its reason
        self.done = not self.loads
        self._next_check = float("inf")

    # ----- the engine's calls ------------------------------------------------------------------
    def start(self, engine: Any) -> None:
        """Before the replay's first event: the scaler, the load points, the curves' ends."""
        self.engine = engine
        core = getattr(engine.policy, "core", None)
        self.scaler = core if hasattr(core, "scale_step") else _Standalone()
        self.own = isinstance(self.scaler, _Standalone)
        for k in range(len(self.points)):
            engine._push(self.points[k][0], self.LOAD, k)
        for end, _ in self.ends:
            engine._push(end, self.LOAD, -2)

    def event(self, t: float, idx: int) -> bool:
        """A load point (``idx`` >= 0), a curve's end (-2) or a scale check (-1); never wakes
        the pass by itself (False)."""
        if idx >= 0:
            _, sid, k = self.points[idx]
            sl, m = self.loads[sid], self.minutes[sid]
            if k == 0:
                self.scaler.define_service(sl.service)
            m.close(t)
            m.k = k
            self.scaler.service_load(LoadReport(service=sid, time=t, rps=sl.rps[k]))
        elif idx == -2:
            for end, sid in self.ends:
                if end <= t and sid in self.loads:
                    self.minutes[sid].close(t)
                    self.minutes[sid].k = -1
                    self.scaler.remove_service(sid)
            self.done = all(end <= t for end, _ in self.ends)
        # a report alone frees nothing and queues nothing: the scaler's orders (``step``) wake
        # the pass when they add or stop replicas, as the live placer's cycle does (a load
        # report there sets no pass due); waking here gave the simulator passes at load
        # instants the live placer never ran, and so a different backfill cadence
        return False

    def step(self, t: float) -> bool:
        """The scaler's orders at ``t``, applied (before the pass); True when any changed."""
        orders: list[ScaleOrder] = self.scaler.scale_step(t)
        for o in orders:
            up = o.reason.startswith("up:") and o.report_time is not None
            for spec in o.add:
                self._add(spec, t, o.report_time if up else None)
            for rid in o.stop:
                self._stop(rid, t, f"{SCALED_DOWN}: {o.reason}")
        nxt = self.scaler.scale_next_s()
        if nxt is not None and t < nxt < self._next_check:
            self._next_check = nxt
            self.engine._push(nxt, self.LOAD, -1)
        elif self._next_check <= t:
            self._next_check = float("inf")
        return bool(orders)

    def after(self, t: float) -> None:
        """After the instant's pass and moves: each service's capacity from now on."""
        for sid, m in self.minutes.items():
            m.close(t)
            m.capacity_rps = self.capacity_rps(sid)

    def queued(self, job: SimJob) -> None:
        if self.own and job.spec.service:
            self.scaler.a.queued(job.spec)

    def started(self, job: SimJob, now: float) -> None:
        sid = job.spec.service
        if not sid:
            return
        if self.own:
            self.scaler.a.started(job.spec)
        self.serving.setdefault(sid, {})[job.idx] = job
        asked = self.asked_at.pop(job.spec.id, None)
        if asked is not None:
            self.rtc_s.append(now - asked)

    def ended(self, job: SimJob) -> None:
        if job.spec.service:
            self.serving.get(job.spec.service, {}).pop(job.idx, None)
            if self.own:
                self.scaler.a.gone(job.spec.id)

    # ----- orders ------------------------------------------------------------------------------
    def _add(self, spec: Any, t: float, asked: float | None) -> None:
        e = self.engine
        models = e.cluster.models
        job = SimJob(
            idx=len(e.jobs),
            spec=spec,
            submit_s=t,
            runtime_s=np.full(len(models), spec.est_runtime_s),
            fastest_runtime_s=spec.est_runtime_s,
        )
        e.jobs.append(job)
        for m in models:  # its class's active power, as the engine counts its trace's
            extra = float(self.profiles.power_w(m, spec.workload_class)) - e._idle_w[m]
            e._extra_w.setdefault((spec.workload_class, m), max(0.0, extra))
        self.by_id[spec.id] = job
        self.added += 1
        if asked is not None:
            self.asked_at[spec.id] = asked
        e._enqueue(job, t)

    def _stop(self, rid: str, t: float, reason: str) -> None:
        """A stop order: a waiting replica ends now; a running one stops serving now and ends
        by its ``STOPPED`` event (module docstring)."""
        e, job = self.engine, self.by_id.get(rid)
        if job is None or job.terminal_count or job.idx in self._stopping:
            return
        self.stopped += 1
        if self.asked_at.pop(rid, None) is not None:
            self.unanswered += 1
        if job.state == RUNNING:
            job.token += 1  # no finish or checkpoint of this attempt stands, only its end
            job.ckpt_start_s = -1.0
            self._stopping[job.idx] = reason
            self.serving.get(job.spec.service, {}).pop(job.idx, None)  # killed: serves no more
            e._push(t, STOPPED, job.idx, job.token)
            return
        if job.state == PENDING and job.idx in e.queue:
            e._dequeue(job)
            cancel = getattr(e.policy, "cancelled", None)
            if cancel is not None:
                cancel(job, t)
            if self.own:
                self.scaler.a.gone(rid)
        e._terminate(job, CANCELLED, t, reason)

    def end_stopped(self, job: SimJob, t: float) -> bool:
        """A stopped replica's end (the engine's ``STOPPED``): its GPUs are free; True, so the
        instant passes again, as on any end."""
        reason = self._stopping.pop(job.idx)
        self.engine._stop(job, t)
        self.engine._terminate(job, CANCELLED, t, reason)
        return True

    # ----- the latency model -------------------------------------------------------------------
    def capacity_rps(self, sid: str) -> float:
        """What the serving replicas of ``sid`` handle within the target now (module docstring)."""
        sl = self.loads[sid]
        svc, spec = sl.service, sl.service.replica
        cls = spec.workload_class
        ref = float(self.profiles.speed(REFERENCE_MODEL, cls))
        total = 0.0
        for job in self.serving.get(sid, {}).values():
            speed = float(self.profiles.speed(job.model, cls)) / ref
            f = self.sharing.factor(job.idx) if self.sharing is not None else 1.0
            solo = spec.solo_latency_p99_ms
            if solo and spec.latency_p99_ms and solo * f / speed > spec.latency_p99_ms + EPS:
                continue
            total += svc.rps_per_replica * speed / f
        return total

    def report(self, jobs: Sequence[SimJob], capacity_gpus: float, span_s: float) -> dict:
        """The issue's figures for one replay (``results.json``'s ``services``)."""
        met = [m.met() for m in self.minutes.values()]
        minutes = sum(len(x) for x in met)
        rtc = np.asarray(self.rtc_s, dtype=float)
        train = [j for j in jobs if not j.spec.service]
        done = [j.end_s - j.submit_s for j in train if j.state == COMPLETED]
        inf_gpu_s = sum(j.attained_gpu_s for j in jobs if j.spec.service)
        per = {
            sid: {
                "minutes": len(x),
                "minutes_met": int(x.sum()),
                "peak_rps": sl.peak_rps,
                "peak_replicas": sl.peak_replicas(),
            }
            for (sid, sl), x in zip(self.loads.items(), met, strict=True)
        }
        return {
            "latency_minutes_met_share": float(sum(x.sum() for x in met) / minutes)
            if minutes
            else None,
            "latency_minutes": minutes,
            "burst_request_to_capacity_p50_s": float(np.percentile(rtc, 50)) if len(rtc) else None,
            "burst_request_to_capacity_p99_s": float(np.percentile(rtc, 99)) if len(rtc) else None,
            "scale_ups_answered": len(rtc),
            "scale_ups_unanswered": self.unanswered,
            "replicas_added": self.added,
            "replicas_stopped": self.stopped,
            "training_jobs": len(train),
            "training_completed": len(done),
            "training_jct_mean_s": float(np.mean(done)) if done else None,
            "training_gpu_utilization": (
                sum(j.attained_gpu_s for j in train) / (capacity_gpus * span_s)
                if span_s > 0
                else None
            ),
            "inference_gpu_s": inf_gpu_s,
            "gpu_utilization": (
                sum(j.attained_gpu_s for j in jobs) / (capacity_gpus * span_s)
                if span_s > 0
                else None
            ),
            "services": per,
            "latency_model": "libs.sim.serving (capacity x GPU speed / interference, 1% late)",
        }
