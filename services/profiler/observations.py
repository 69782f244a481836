"""What the lifecycle stream and telemetry say about a job's speed and power: the profiler's
read model.

Folded from the lifecycle stream and ``telemetry.*``, pure (no I/O). A job's ``Submitted``
gives its spec (its runtime on the reference GPU, its class and framework); its ``Placed`` the
node and GPUs; a ``Checkpointed`` the progress its next attempt resumes from; its ``Completed``
the attempt's runtime. That ``Completed`` is one observation: speed = reference runtime x work
done / runtime (``libs.policy.profile_learning.observed_speed``).

Power comes from telemetry, not from the executor's energy figure: that is board power x GPUs x
runtime, an estimate, and learning it would only teach the table the board limit. Each sample
of a node adds, for each started job holding whole GPUs there, the mean power of its GPUs; the
observation's power is the mean over the attempt's samples, or None when there was none (a job
shorter than the telemetry interval, a fractional job sharing its GPU, an attempt that started
before a restart of the profiler). A job that failed or was cancelled says nothing and is
forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.policy.profile_learning import observed_speed
from proto.events import (
    Checkpointed,
    Completed,
    LifecycleEvent,
    Placed,
    Preempted,
    Started,
    Submitted,
    is_terminal,
)
from proto.jobs import JobSpec
from proto.nodes import TelemetrySample
from proto.validation import revalidate_submitted


@dataclass(frozen=True, slots=True)
class Observation:
    job_id: str
    time: float  # the Completed event's (Mosaic clock)
    node: str
    workload_class: str
    framework: str
    speed: float
    power_w: float | None


@dataclass(slots=True)
class _Attempt:
    node: str
    gpus: tuple[int, ...]
    whole: bool  # holds whole GPUs (a shared GPU's power is not this job's alone)
    started: bool = False
    power_sum_w: float = 0.0
    samples: int = 0


class CompletedJobs:
    """Specs of the live jobs, their current attempts and the progress each resumes from;
    ``apply`` returns the observation a ``Completed`` makes, if any."""

    def __init__(self) -> None:
        self.specs: dict[str, JobSpec] = {}
        self.progress: dict[str, float] = {}
        self.attempts: dict[str, _Attempt] = {}
        self.on_node: dict[str, set[str]] = {}  # node -> jobs with an attempt there

    def apply(self, ev: LifecycleEvent) -> Observation | None:
        job = ev.job_id
        if isinstance(ev, Submitted):
            if job not in self.specs and not revalidate_submitted(ev):
                self.specs[job] = ev.spec
        elif isinstance(ev, Placed):
            if job in self.specs and ev.node:
                self._drop_attempt(job)
                whole = ev.gpu_share >= 1.0
                self.attempts[job] = _Attempt(ev.node, tuple(ev.gpu_indices), whole)
                self.on_node.setdefault(ev.node, set()).add(job)
        elif isinstance(ev, Started):
            a = self.attempts.get(job)
            if a is not None:
                a.started = True
        elif isinstance(ev, Checkpointed):
            if job in self.specs and 0.0 <= ev.progress < 1.0:
                self.progress[job] = ev.progress
        elif isinstance(ev, Preempted):
            self._drop_attempt(job)
        elif is_terminal(ev):
            return self._end(ev)
        return None

    def sample(self, s: TelemetrySample) -> None:
        """One telemetry sample: its power, for each started whole-GPU job on its node."""
        jobs = self.on_node.get(s.node)
        if not jobs or s.asleep:
            return
        by_index = {g.index: g.power_w for g in s.gpus}
        for job in jobs:
            a = self.attempts[job]
            watts = [by_index[i] for i in a.gpus if i in by_index]
            if a.started and a.whole and watts and len(watts) == len(a.gpus):
                a.power_sum_w += sum(watts) / len(watts)
                a.samples += 1

    def _drop_attempt(self, job: str) -> _Attempt | None:
        a = self.attempts.pop(job, None)
        if a is not None:
            on = self.on_node.get(a.node)
            if on is not None:
                on.discard(job)
                if not on:
                    del self.on_node[a.node]
        return a

    def _end(self, ev: LifecycleEvent) -> Observation | None:
        job = ev.job_id
        spec = self.specs.pop(job, None)
        resumed_from = self.progress.pop(job, 0.0)
        attempt = self._drop_attempt(job)
        if not isinstance(ev, Completed) or spec is None or not ev.node:
            return None
        speed = observed_speed(spec.est_runtime_s, 1.0 - resumed_from, ev.runtime_s)
        if speed is None:
            return None
        power_w = None
        if attempt is not None and attempt.node == ev.node and attempt.samples:
            power_w = attempt.power_sum_w / attempt.samples
        return Observation(
            job, ev.time, ev.node, spec.workload_class, spec.framework, speed, power_w
        )
