"""The discrete-event engine: arrivals, finishes, OOM failures and resubmissions on an event heap.

No fixed rounds: time jumps from one event to the next (a policy may ask for a pass at a
given time, ``next_pass_s()``: mosaic's next backfill). Events with the same timestamp are
handled together and followed by ONE scheduling pass of the policy on the current queue and the
cluster view, which is mutated in place (``allocate``/``release``), never rebuilt. A pass is
skipped only when no policy could place anything (every GPU taken, or the smallest pending job
larger than any free hole).

Deterministic: the heap orders by (time, sequence number) and every policy is deterministic, so
the same trace, cluster and seed give the same result.

Runtime of a job on a GPU model: the trace's ``runtime_by_model[model]`` when it has one, else
``profiles.runtime_s(spec, model)``. A gang over several nodes runs at its slowest GPU.
Interference (``sharing``, a ``libs.sim.sharing.SimSharing``; the runner passes one unless
``--no-interference``): fractional jobs that share a GPU run slower by the interference
model's factor while they share, their finish put off by the work they lost.
Energy: every GPU draws ``profiles.idle_power_w(model)`` all the time; a busy GPU (share s)
draws ``s * (power_w(model, class) - idle)`` on top.

Power saving (only for a policy with ``power_step``, i.e. mosaic; the baselines are the
original strategy and never suspend): after each pass the engine asks the policy which empty
nodes to suspend and which to resume (``power_step(now) -> (suspend ids, resume ids, next
check time or None)``). A suspended node's GPUs draw ``STANDBY_W_PER_GPU`` instead of idle
power; a resuming node draws idle power and takes no job until ``policy.resume_s`` later
(then ``policy.power_resumed(node, now)`` is called). Host (CPU, fan) power is not modelled
for any node, so suspended or not only the GPUs' draw changes.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from libs.sim.cluster import EPS, SimCluster
from libs.sim.engine_jobs import JobTransitions
from libs.sim.engine_power import PowerAccounting
from libs.sim.event_kinds import (
    ARRIVE,
    CKPT,
    FINISH,
    LOAD,
    OOM,
    POWER,
    RESUBMIT,
    RESUMED,
    SAMPLE,
    STOPPED,
    TICK,
)
from libs.sim.failures import FailureModel
from libs.sim.moves import Mover
from libs.sim.runtimes import runtime_matrix
from libs.sim.samples import Samples, fragmentation
from libs.sim.state import (
    BACKOFF,
    COMPLETED,
    FAILED,
    RUNNING,
    TERMINAL,
    Policy,
    SimContext,
    SimJob,
    SimResult,
)
from proto.nodes import NodeSpec

STANDBY_W_PER_GPU = 0.0  # a powered-down node's GPUs draw nothing (host power not modelled)


class StuckSimulation(RuntimeError):
    """Jobs wait, nothing runs and nothing will happen: the policy refuses placeable work."""


class Engine(JobTransitions, PowerAccounting):
    """One run of one policy over one trace on one cluster."""

    def __init__(
        self,
        trace_jobs: Sequence[Any],
        nodes: Sequence[NodeSpec],
        policy: Policy,
        profiles: Any,
        *,
        failures: FailureModel | None = None,
        runtimes: np.ndarray | None = None,
        samples: int = 2000,
        progress: Callable[[float], None] | None = None,
        checkpoint_cost_s: float = 30.0,
        thermal: Any = None,
        sharing: Any = None,
        services: Any = None,
    ):
        self.cluster = SimCluster(nodes)
        self.policy = policy
        self.profiles = profiles
        self.failures = failures or FailureModel()
        models = self.cluster.models
        rt = runtimes if runtimes is not None else runtime_matrix(trace_jobs, models, profiles)
        self.jobs = [
            SimJob(
                idx=i,
                spec=tj.spec,
                submit_s=float(tj.submit_s),
                runtime_s=rt[i],
                fastest_runtime_s=float(rt[i].min()),
                est_factor=float(getattr(tj, "est_factor", 1.0)),
            )
            for i, tj in enumerate(trace_jobs)
        ]
        classes = sorted({j.spec.workload_class for j in self.jobs})
        self._idle_w = {m: float(profiles.idle_power_w(m)) for m in models}
        self._extra_w = {
            (c, m): max(0.0, float(profiles.power_w(m, c)) - self._idle_w[m])
            for c in classes
            for m in models
        }
        self.idle_total_w = sum(self._idle_w[n.gpu_model] * n.gpu_count for n in nodes)
        self._node_model = {n.id: n.gpu_model for n in nodes}
        self._model_pos = {m: i for i, m in enumerate(models)}
        self._samples = samples
        self._narrowest = int(self.cluster.gpu_count.min())
        self._progress = progress
        self.queue: dict[int, SimJob] = {}
        self.running: dict[int, SimJob] = {}
        self._need: Counter[float] = Counter()  # GPUs asked by pending jobs
        self._shapes: Counter[tuple[float, float]] = Counter()  # (GPUs, GPU memory) pending
        self._shape_order: list[tuple[float, float]] | None = None  # sorted(_shapes), kept
        self.pending_gpus = 0.0
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self.finished = 0  # jobs in a terminal state
        self._power = getattr(policy, "power_step", None)
        self._node_idx = {n.id: i for i, n in enumerate(nodes)}
        self._node_idle_w = np.array([self._idle_w[n.gpu_model] * n.gpu_count for n in nodes])
        self._node_standby_w = np.array([STANDBY_W_PER_GPU * n.gpu_count for n in nodes])
        self._down_since = np.full(len(nodes), np.nan)  # suspended since (NaN = not suspended)
        self._up_at = np.full(len(nodes), np.nan)  # resuming: up at this time
        self.idle_saved_j = 0.0
        self.node_suspend_s = 0.0
        self._next_power = float("inf")
        # a policy may ask for a pass at a time without an event (mosaic: the next backfill)
        self._tick = getattr(policy, "next_pass_s", None)
        self._next_tick = float("inf")
        # moves (libs.sim.moves): the same checkpoint cost for every policy that moves jobs
        self._mover = Mover(self._push, CKPT, checkpoint_cost_s)
        self._move_step = getattr(policy, "move_step", None)  # libs.sim.moves
        policy.attach(SimContext(self.cluster, models, profiles, self.jobs))
        self._thermal = thermal  # libs.sim.thermal.SimThermal: heat, throttling, the guard
        self.sharing = sharing  # libs.sim.sharing.SimSharing: shared GPUs run slower
        self.services = services  # libs.sim.serving.SimServices: inference replicas, scaled
        if thermal is not None:
            thermal.attach(self, lambda at: self._push(at, SAMPLE, 0))

    # ----- events --------------------------------------------------------------------------
    def _push(self, t: float, kind: int, job: int, token: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, job, token))

    def _handle(self, t: float, kind: int, idx: int, token: int) -> bool:
        """Apply one event; True when it may let a policy place something."""
        if kind == RESUMED:
            self._up_at[idx] = np.nan
            self.policy.power_resumed(self.cluster.nodes[idx].id, t)  # type: ignore[attr-defined]
            return True
        if kind in (POWER, SAMPLE):
            return False
        if kind == LOAD:
            return self.services.event(t, idx)  # type: ignore[union-attr]
        if kind == STOPPED:  # after the instant that stopped it, as the executor's answer
            return self.services.end_stopped(self.jobs[idx], t)  # type: ignore[union-attr]
        if kind == TICK:
            if self._next_tick <= t:
                self._next_tick = float("inf")
            return True
        job = self.jobs[idx]
        if kind == ARRIVE:
            if not self.cluster.could_ever_fit(job.spec, check_memory=True):
                self._terminate(job, FAILED, t, "unschedulable: no node can ever hold it")
                return False
            if not self.policy.can_ever_place(job):
                self._terminate(job, FAILED, t, f"unschedulable by {self.policy.name}")
                return False
            self._enqueue(job, t)
            return True
        if kind == RESUBMIT:
            self._enqueue(job, t)
            return True
        if kind == CKPT:  # a move's checkpoint is saved: the job waits again with its progress
            if token != job.token or job.ckpt_start_s < 0:
                return False
            self._mover.checkpointed(job)
            self._stop(job, t)
            self._mover.resize(job)
            job.preempted_at_s = t
            self._enqueue(job, t)
            return True
        if token != job.token or job.state != RUNNING:
            return False  # stale
        if kind == FINISH and self._thermal is not None:  # throttled: work left to make up
            late_s = self._thermal.deferral_s(idx)
            if late_s > 0:
                self._push(t + late_s, FINISH, idx, token)
                return False
        if kind == FINISH and self.sharing is not None:  # slowed by neighbours: work left
            late_s = self.sharing.deferral_s(idx, t)
            if late_s > 0:
                self._push(t + late_s, FINISH, idx, token)
                return False
        self._stop(job, t)
        if kind == FINISH:
            self._terminate(job, COMPLETED, t)
        else:
            job.failed_attempts += 1
            if self.failures.gives_up(job.failed_attempts):
                self._terminate(job, FAILED, t, f"OOM {job.failed_attempts} times")
            else:
                job.state = BACKOFF
                self._push(t + self.failures.resubmit_delay_s, RESUBMIT, idx)
        return True

    def _stale(self, kind: int, idx: int, token: int) -> bool:
        """An attempt's end that no longer stands (the job was moved, or ended otherwise)."""
        if kind not in (FINISH, OOM, CKPT, STOPPED):
            return False
        job = self.jobs[idx]
        if kind == CKPT:
            return token != job.token or job.ckpt_start_s < 0
        return token != job.token or job.state != RUNNING

    def _placeable(self) -> bool:
        """Could any pending request shape fit anywhere now? Cheap, and never wrong in the
        "no" direction: a memory-aware check only for policies that check memory, and any
        request wider than the smallest node counts as placeable (as a gang) once that many
        GPUs are free in total."""
        if not self.queue:
            return False
        c = self.cluster
        if c.allocated_gpus >= c.capacity_gpus - EPS:
            return False
        mem_aware = getattr(self.policy, "checks_memory", True)
        total_free: int | None = None
        order = self._shape_order
        if order is None:  # smallest asks first: the likeliest to fit end the search early
            order = self._shape_order = sorted(self._shapes)
        for gpus, mem in order:
            if gpus > self._narrowest:
                if total_free is None:
                    total_free = c.total_whole_free()
                if total_free >= gpus:
                    return True
            elif c.might_fit(gpus, mem if mem_aware else 0.0):
                return True
        return False

    # ----- the loop ------------------------------------------------------------------------
    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        for j in self.jobs:
            self._heap.append((j.submit_s, j.idx, ARRIVE, j.idx, 0))
        self._seq = len(self.jobs)
        heapq.heapify(self._heap)
        if self.services is not None:  # load points, curve ends (libs.sim.serving)
            self.services.start(self)
        t0 = self._heap[0][0] if self._heap else 0.0
        if self._thermal is not None:
            self._thermal.start(t0)
        last_submit = max((j.submit_s for j in self.jobs), default=t0)
        step = max(1.0, (last_submit - t0) / max(1, self._samples))
        samples = Samples(t0, step)
        t_prev = t0
        alloc_gpu_s = busy_s = busy_alloc = 0.0
        cap = self.cluster.capacity_gpus
        events = passes = 0
        n_jobs = max(1, len(self.jobs))
        done_report = 0
        heap = self._heap
        while heap:
            live = self.services is not None and not self.services.done  # a curve plays on
            if heap[0][2] >= RESUMED and self.finished >= len(self.jobs) and not live:
                heapq.heappop(heap)  # every job is done: a power check must not extend the run
                continue
            t = heap[0][0]
            dt = t - t_prev
            if dt > 0:
                a = self.cluster.allocated_gpus
                alloc_gpu_s += a * dt
                if a + self.pending_gpus >= cap - EPS:
                    busy_s += dt
                    busy_alloc += a * dt
                t_prev = t
            wake = False
            real = 0
            if self._thermal is not None:  # temperatures up to t, a sample when one is due
                wake = self._thermal.at(t)
            while heap and heap[0][0] == t:
                _, _, kind, idx, token = heapq.heappop(heap)
                events += 1
                if self._stale(kind, idx, token):
                    continue
                real += 1
                wake |= self._handle(t, kind, idx, token)
            if not real:  # only stale events (a moved job's old finish): not an instant
                continue
            if self.services is not None:  # the scaler's orders, before the pass
                wake |= self.services.step(t)
            if wake and self._placeable():
                passes += 1
                # dict views (ordered, sized, iterable): a policy that ignores them pays nothing
                chosen = self.policy.schedule(
                    self.queue.values(), self.cluster, self.running.values(), t
                )
                for job, allocs in chosen:
                    self._start(job, allocs, t)
                if self._tick is not None:
                    nxt = self._tick()
                    if nxt is not None and t < nxt < self._next_tick - 1e-9:
                        self._next_tick = nxt
                        self._push(nxt, TICK, 0)
            if self._move_step is not None:  # every instant, full cluster too: libs.sim.moves
                orders = self._move_step(t)
                if orders:
                    self._mover.apply(orders, t)
                nxt = self.policy.next_move_s(t)  # type: ignore[attr-defined]
                if nxt is not None and t < nxt < self._next_tick - 1e-9:
                    self._next_tick = nxt
                    self._push(nxt, TICK, 0)
            if self.services is not None:
                self.services.after(t)
            if self._power is not None and self.finished < len(self.jobs):
                self._power_step(t)
            if not heap and self.queue:
                raise StuckSimulation(
                    f"policy {self.policy.name}: {len(self.queue)} jobs pending, none running, "
                    f"and the pass placed nothing at t={t:.0f}"
                )
            if samples.due(t):
                frag = fragmentation(self.cluster, self._shapes, len(self.queue))
                samples.take(t, self.cluster.allocated_gpus / cap, len(self.queue), frag)
                if self._progress is not None and self.finished - done_report > n_jobs // 100:
                    done_report = self.finished
                    self._progress(min(0.999, self.finished / n_jobs))
        end_idle_w = None
        if self._power is not None:
            down = ~np.isnan(self._down_since)
            for n in np.flatnonzero(down).tolist():
                self._account_down(n, t_prev)
            end_idle_w = float(self._node_idle_w[~down].sum() + self._node_standby_w[down].sum())
        for j in self.jobs:
            if j.terminal_count != 1 or j.state not in TERMINAL:
                raise AssertionError(f"job {j.spec.id} ended in state {j.state}")
        if self._progress is not None:
            self._progress(1.0)
        return SimResult(
            policy=self.policy.name,
            jobs=self.jobs,
            capacity_gpus=cap,
            idle_power_w=self.idle_total_w,
            t0_s=t0,
            t_end_s=t_prev,
            alloc_gpu_s=alloc_gpu_s,
            busy_s=busy_s,
            busy_alloc_gpu_s=busy_alloc,
            **samples.arrays(),
            events=events,
            passes=passes,
            wall_s=time.perf_counter() - wall0,
            node_models=dict(self._node_model),
            idle_saved_j=self.idle_saved_j,
            node_suspend_s=self.node_suspend_s,
            end_idle_power_w=end_idle_w,
            preempted_non_checkpointable=self._mover.refused_non_checkpointable,
        )


def simulate(
    trace_jobs: Sequence[Any],
    nodes: Sequence[NodeSpec],
    policy: Policy,
    profiles: Any,
    **kwargs: Any,
) -> SimResult:
    """Run ``policy`` over ``trace_jobs`` (each: ``spec``, ``submit_s``, ``runtime_by_model``)."""
    return Engine(trace_jobs, nodes, policy, profiles, **kwargs).run()
