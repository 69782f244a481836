"""Tiny traces and a flat profile, so expected metrics can be computed by hand."""

from __future__ import annotations

from dataclasses import dataclass

from proto.jobs import JobSpec
from proto.nodes import NodeSpec


@dataclass(frozen=True)
class TJ:
    """A trace job as the engine reads it (spec, submit_s, runtime_by_model)."""

    spec: JobSpec
    submit_s: float
    runtime_by_model: dict[str, float] | None = None


class FlatProfiles:
    """Every model runs every class at reference speed x ``speed[model]``; fixed powers."""

    def __init__(self, speed=None, active_w=None, idle_w=None):
        self._speed = speed or {}
        self._active = active_w or {}
        self._idle = idle_w or {}

    def speed(self, model, cls):
        return self._speed.get(model, 1.0)

    def runtime_s(self, spec, model):
        return spec.est_runtime_s / self.speed(model, spec.workload_class)

    def power_w(self, model, cls):
        return self._active.get(model, 300.0)

    def idle_power_w(self, model):
        return self._idle.get(model, 50.0)


def node(nid: str, model: str = "v100-32gb", gpus: int = 4, mem: float = 32.0) -> NodeSpec:
    return NodeSpec(
        id=nid,
        gpu_model=model,
        gpu_count=gpus,
        gpu_mem_gb=mem,
        host_mem_gb=64.0 * gpus,
        cpus=8 * gpus,
        idle_power_w=50.0,
        max_power_w=300.0,
    )


def job(jid: str, submit: float, runtime: float, gpus: float = 1, **kw) -> TJ:
    by_model = kw.pop("runtime_by_model", None)
    spec = JobSpec(
        id=jid,
        gpus=gpus,
        est_runtime_s=runtime,
        gpu_mem_gb=kw.pop("mem", 8.0),
        host_mem_gb=kw.pop("host", 8.0),
        cpus=kw.pop("cpus", 2.0),
        **kw,
    )
    return TJ(spec, submit, by_model)


def record_move_reasons(pol) -> list[str]:  # type: ignore[no-untyped-def]
    """Wrap ``pol.move_step`` so every move it orders has its reason appended, in order, to
    the list returned (the engine calls the wrapped step)."""
    reasons: list[str] = []
    decide = pol.move_step

    def move_step(now: float):  # type: ignore[no-untyped-def]
        out = decide(now)
        reasons.extend(m[2] for m in out)
        return out

    pol.move_step = move_step
    return reasons
