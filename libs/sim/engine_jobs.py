"""The engine's job transitions: queued, dequeued, started, stopped, ended, each checked
against the rules a policy must keep (no job started twice, given the GPUs it asked for, on
a node that is up; no job ended twice) and accounted (waits, GPU time, energy).

Apart from ``engine`` because these are what a job goes through, whatever event causes it;
``Engine`` inherits them and keeps the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from libs.sim.event_kinds import FINISH, OOM
from libs.sim.moves import Mover
from libs.sim.state import PENDING, RUNNING, SimJob

if TYPE_CHECKING:
    from libs.sim.engine import Engine


class JobTransitions:
    """``Engine``'s job transitions (see the module docstring)."""

    def _enqueue(self: Engine, job: SimJob, now: float) -> None:
        job.state = PENDING
        job.enqueue_s = now
        self.queue[job.idx] = job
        self._need[job.spec.gpus] += 1
        key = (job.spec.gpus, job.spec.gpu_mem_gb)
        n = self._shapes[key]
        if not n:
            self._shape_order = None
        self._shapes[key] = n + 1
        self.pending_gpus += job.spec.gpus
        self.policy.enqueued(job, now)
        if self.services is not None:
            self.services.queued(job)

    def _dequeue(self: Engine, job: SimJob) -> None:
        del self.queue[job.idx]
        self._need[job.spec.gpus] -= 1
        if self._need[job.spec.gpus] == 0:
            del self._need[job.spec.gpus]
        key = (job.spec.gpus, job.spec.gpu_mem_gb)
        self._shapes[key] -= 1
        if self._shapes[key] == 0:
            del self._shapes[key]
            self._shape_order = None
        self.pending_gpus -= job.spec.gpus

    def _terminate(self: Engine, job: SimJob, state: str, now: float, reason: str = "") -> None:
        if job.terminal_count:
            raise AssertionError(f"job {job.spec.id} reached a terminal state twice")
        job.terminal_count += 1
        self.finished += 1
        job.state = state
        job.end_s = now
        job.reason = reason

    def _start(self: Engine, job: SimJob, allocs: list, now: float) -> None:
        if job.state != PENDING or job.idx not in self.queue:
            raise AssertionError(f"policy {self.policy.name} started job {job.spec.id} twice")
        if not allocs:
            raise AssertionError(f"policy {self.policy.name} gave job {job.spec.id} no resources")
        got = sum(a.gpu_share * len(a.gpu_indices) for a in allocs)
        if abs(got - job.spec.gpus) > 1e-6 and not (job.spec.gpus < 1 and len(allocs) == 1):
            raise AssertionError(
                f"policy {self.policy.name} gave job {job.spec.id} {got} GPUs, not {job.spec.gpus}"
            )
        self._dequeue(job)
        fits = True
        if self._power is not None:
            for a in allocs:
                n = self._node_idx[a.node]
                if self._down_since[n] == self._down_since[n] or self._up_at[n] == self._up_at[n]:
                    raise AssertionError(
                        f"{self.policy.name} placed {job.spec.id} on a node "
                        f"that is not up ({a.node})"
                    )
        for a in allocs:
            fits &= self.cluster.allocate(a)
        job.attempts += 1
        job.allocs = list(allocs)
        job.wait_s += now - job.enqueue_s
        if job.first_start_s < 0:
            job.first_start_s = now
        job.start_s = now
        if len(allocs) == 1:  # one node (every gang that fits a node)
            job.model = self._node_model[allocs[0].node]
            slowest = job.runtime_s[self._model_pos[job.model]]
        else:  # a gang over several nodes runs at its slowest GPU
            slowest = max(job.runtime_s[self._model_pos[self._node_model[a.node]]] for a in allocs)
            job.model = max(
                (self._node_model[a.node] for a in allocs),
                key=lambda m: job.runtime_s[self._model_pos[m]],
            )
        job.attempt_full_s = float(slowest)
        Mover.started(job, now)
        job.state = RUNNING
        job.token += 1
        self.running[job.idx] = job
        if not job.spec.service:  # a replica serves until the scaler stops it (libs.sim.serving)
            left_s = float(slowest) * (1 - job.progress)
            duration, job.oom = self.failures.attempt_duration_s(left_s, fits)
            self._push(now + duration, OOM if job.oom else FINISH, job.idx, job.token)
        self.policy.started(job, now)
        if self.services is not None:
            self.services.started(job, now)
        if self._thermal is not None:
            self._thermal.started(job, now)
        if self.sharing is not None:
            self.sharing.started(job, now)

    def _stop(self: Engine, job: SimJob, now: float) -> None:
        """Release an attempt's resources and account its GPU time and energy."""
        dur = now - job.start_s
        if self.sharing is not None:
            self.sharing.stopped(job, now)
        for a in job.allocs:
            self.cluster.release(a)
            gpus = a.gpu_share * len(a.gpu_indices)
            job.energy_active_j += (
                gpus * self._extra_w[(job.spec.workload_class, self._node_model[a.node])] * dur
            )
            job.attained_gpu_s += gpus * dur
        job.run_s += dur
        del self.running[job.idx]
        self.policy.ended(job, now)
        if self.services is not None:
            self.services.ended(job)
        job.allocs = []
