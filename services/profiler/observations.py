"""What the lifecycle stream says about a job's speed: the profiler's read model.

Folded from the lifecycle stream, pure (no I/O). A job's ``Submitted`` gives its spec (its
runtime on the reference GPU, its class and framework); a ``Checkpointed`` the progress its
next attempt resumes from; its ``Completed`` the node it finished on, the attempt's runtime and
energy. That ``Completed`` is one observation: speed = reference runtime x work done / runtime
(``libs.policy.profile_learning.observed_speed``), power per GPU = energy / GPU-seconds. A job
that failed or was cancelled says nothing about speed and is forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.policy.profile_learning import observed_power_w, observed_speed
from proto.events import Checkpointed, Completed, LifecycleEvent, Submitted, is_terminal
from proto.jobs import JobSpec
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


class CompletedJobs:
    """Specs of the live jobs and the progress each resumes from; ``apply`` returns the
    observation a ``Completed`` makes, if any."""

    def __init__(self) -> None:
        self.specs: dict[str, JobSpec] = {}
        self.progress: dict[str, float] = {}

    def apply(self, ev: LifecycleEvent) -> Observation | None:
        job = ev.job_id
        if isinstance(ev, Submitted):
            if job not in self.specs and not revalidate_submitted(ev):
                self.specs[job] = ev.spec
            return None
        if isinstance(ev, Checkpointed):
            if job in self.specs and 0.0 <= ev.progress < 1.0:
                self.progress[job] = ev.progress
            return None
        if not is_terminal(ev):
            return None
        spec = self.specs.pop(job, None)
        resumed_from = self.progress.pop(job, 0.0)
        if not isinstance(ev, Completed) or spec is None or not ev.node:
            return None
        speed = observed_speed(spec.est_runtime_s, 1.0 - resumed_from, ev.runtime_s)
        if speed is None:
            return None
        power_w = observed_power_w(ev.energy_kwh, spec.gpus, ev.runtime_s)
        return Observation(
            job, ev.time, ev.node, spec.workload_class, spec.framework, speed, power_w
        )
