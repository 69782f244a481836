"""The profiler's fold (services.profiler.observations): what a Completed observes, and which
telemetry counts as the job's power."""

from __future__ import annotations

import pytest

from proto.events import Cancelled, Checkpointed, Completed, Placed, Preempted, Started, Submitted
from proto.jobs import JobSpec
from proto.nodes import GpuSample, TelemetrySample
from services.profiler.observations import CompletedJobs


def _sample(node: str, watts: list[float], asleep: bool = False) -> TelemetrySample:
    gpus = tuple(
        GpuSample(index=i, util=0.9, mem_used_gb=1, temp_c=50, power_w=w)
        for i, w in enumerate(watts)
    )
    return TelemetrySample(node=node, time=0.0, backend="sim", gpus=gpus, asleep=asleep)


def _start(f: CompletedJobs, job: str, gpus=(0, 1), share=1.0, **spec) -> None:
    s = JobSpec(id=job, est_runtime_s=1000.0, workload_class="rnn", **spec)
    f.apply(Submitted(job_id=job, time=0.0, spec=s))
    f.apply(Placed(job_id=job, time=0.0, node="n", gpu_indices=gpus, gpu_share=share))


def test_speed_from_the_last_attempt_and_power_from_its_own_started_gpus() -> None:
    f = CompletedJobs()
    _start(f, "j", framework="jax")
    f.sample(_sample("n", [300, 300, 90]))  # before Started: booting, not the job's power
    f.apply(Started(job_id="j", time=0.0, node="n"))
    f.sample(_sample("n", [200, 100, 90]))
    f.sample(_sample("n", [260, 240, 90]))
    f.sample(_sample("n", [999, 999, 999], asleep=True))
    f.sample(_sample("other", [999, 999, 999]))
    obs = f.apply(Completed(job_id="j", time=500.0, node="n", runtime_s=250.0))
    assert obs is not None and obs.framework == "jax" and obs.workload_class == "rnn"
    assert obs.speed == pytest.approx(4.0) and obs.power_w == pytest.approx(200.0)
    assert not f.specs and not f.attempts and not f.on_node  # forgotten once ended


def test_a_resumed_attempt_counts_only_its_share_of_the_work() -> None:
    f = CompletedJobs()
    _start(f, "j")
    f.apply(Checkpointed(job_id="j", time=1.0, node="n", progress=0.75))
    f.apply(Preempted(job_id="j", time=1.0, node="n"))
    assert "j" not in f.attempts
    f.apply(Placed(job_id="j", time=2.0, node="n", gpu_indices=(2,)))
    obs = f.apply(Completed(job_id="j", time=3.0, node="n", runtime_s=500.0))
    assert obs is not None and obs.speed == pytest.approx(0.5) and obs.power_w is None


def test_fractional_failed_and_unknown_jobs_say_nothing_of_power_or_speed() -> None:
    f = CompletedJobs()
    _start(f, "half", gpus=(0,), share=0.5)
    f.apply(Started(job_id="half", time=0.0, node="n"))
    f.sample(_sample("n", [300]))
    obs = f.apply(Completed(job_id="half", time=9.0, node="n", runtime_s=1000.0))
    assert obs is not None and obs.power_w is None  # a shared GPU's power is not its own
    _start(f, "gone")
    assert f.apply(Cancelled(job_id="gone", time=1.0)) is None
    assert f.apply(Completed(job_id="never-submitted", time=1.0, node="n", runtime_s=5)) is None
    _start(f, "zero")
    assert f.apply(Completed(job_id="zero", time=1.0, node="n", runtime_s=0.0)) is None
