"""A replayable job trace: what the simulator consumes, whatever public trace it came from.

Why a separate type from ``JobSpec``: a trace adds *when* each job arrives and, for traces that
measured it (Gavel), how long it runs on each GPU model. Public traces leave most scheduler
fields empty; every rule a loader used to fill them is kept in ``Trace.assumptions`` so a result
can always be read next to the guesses it rests on.

Times are seconds from the trace start (``submit_s``); ``JobSpec.deadline`` is an absolute trace
second, so replaying on a clock that starts at 0 needs no translation.
"""

from __future__ import annotations

import math
from collections import Counter

import msgspec

from proto.jobs import HIGH_PRIORITY, JobSpec
from proto.nodes import NodeSpec
from proto.validation import FieldError, validate_job

# The GPU whose runtime ``JobSpec.est_runtime_s`` states. Traces that do not say which GPU a job
# ran on are read as if it ran on this one (each loader says so in its assumptions).
REFERENCE_MODEL = "v100-32gb"


class TraceJob(msgspec.Struct, frozen=True, kw_only=True):
    """One job of a trace: the submission, its arrival time and, when measured, per-GPU runtimes.

    ``runtime_by_model`` maps canonical GPU models to the job's runtime in seconds on that model;
    ``None`` means the trace gives only ``spec.est_runtime_s`` (on ``REFERENCE_MODEL``).
    ``est_factor``: ``spec.est_runtime_s`` is the true runtime x this (``libs.sim.loaders.noise``:
    what the policy is told); the engine divides it out, 1 = the estimate is the truth.
    """

    spec: JobSpec
    submit_s: float
    runtime_by_model: dict[str, float] | None = None
    source: str = ""
    est_factor: float = 1.0


class Trace(msgspec.Struct, frozen=True, kw_only=True):
    """Jobs sorted by ``submit_s``, the fill rules used, and the inventory if the trace has one."""

    name: str
    jobs: tuple[TraceJob, ...]
    assumptions: tuple[str, ...] = ()
    nodes: tuple[NodeSpec, ...] = ()

    def __post_init__(self) -> None:
        # a simulator replays in order; an unsorted trace would silently reorder arrivals
        for a, b in zip(self.jobs, self.jobs[1:], strict=False):
            if b.submit_s < a.submit_s:
                raise ValueError(f"trace {self.name!r}: jobs must be sorted by submit_s")

    def slice(
        self,
        max_jobs: int | None = None,
        start_s: float | None = None,
        end_s: float | None = None,
    ) -> Trace:
        """Jobs submitted in ``[start_s, end_s)``, at most the first ``max_jobs`` of them.

        When ``start_s`` is given the window is re-based to start at 0 (submit times and
        deadlines shift together), so a slice from day 30 replays like a trace of its own.
        """
        if max_jobs is not None and max_jobs < 0:
            raise ValueError(f"max_jobs must be >= 0, got {max_jobs}")
        lo = -math.inf if start_s is None else start_s
        hi = math.inf if end_s is None else end_s
        picked = [j for j in self.jobs if lo <= j.submit_s < hi]
        if max_jobs is not None:
            picked = picked[:max_jobs]
        shift = 0.0 if start_s is None else start_s
        jobs = tuple(_shifted(j, shift, 1.0) for j in picked) if shift else tuple(picked)
        notes = list(self.assumptions)
        if start_s is not None or end_s is not None or max_jobs is not None:
            first = "all" if max_jobs is None else str(max_jobs)
            rebased = f", re-based by -{shift:g} s" if shift else ""
            notes.append(f"slice: submit in [{lo:g}, {hi:g}) s, first {first} jobs{rebased}")
        return Trace(name=self.name, jobs=jobs, assumptions=tuple(notes), nodes=self.nodes)

    def scale_arrivals(self, factor: float) -> Trace:
        """Divide every submit time by ``factor`` (> 1 compresses arrivals and raises load).

        Runtimes are unchanged, so offered load (GPU-seconds per second) grows by ``factor``.
        Deadlines keep their slack: ``deadline - submit`` is preserved, because a deadline is a
        promise about the job, not about the arrival process.
        """
        if not math.isfinite(factor) or factor <= 0:
            raise ValueError(f"scale factor must be a positive number, got {factor}")
        jobs = tuple(_shifted(j, 0.0, factor) for j in self.jobs)
        note = (
            f"arrivals scaled: submit_s divided by {factor:g} (offered load x{factor:g}); "
            "runtimes unchanged; each deadline keeps its slack after submit"
        )
        return Trace(
            name=self.name, jobs=jobs, assumptions=(*self.assumptions, note), nodes=self.nodes
        )

    def summary(self) -> dict[str, object]:
        """Headline numbers to print beside a result: size mix, GPU-hours, span, fill shares."""
        n = len(self.jobs)
        specs = [j.spec for j in self.jobs]
        gpu_hours = sum(s.gpus * s.est_runtime_s for s in specs) / 3600.0
        span_s = self.jobs[-1].submit_s - self.jobs[0].submit_s if n else 0.0
        mix = Counter(_size_bucket(s.gpus) for s in specs)
        share = lambda k: round(k / n, 4) if n else 0.0  # noqa: E731
        return {
            "name": self.name,
            "jobs": n,
            "gpu_hours": round(gpu_hours, 1),
            "span_s": span_s,
            "span_days": round(span_s / 86400.0, 2),
            "size_mix": {k: mix.get(k, 0) for k in _SIZE_BUCKETS},
            "high_priority_share": share(sum(s.priority >= HIGH_PRIORITY for s in specs)),
            "deadline_share": share(sum(s.deadline is not None for s in specs)),
            "gpu_mem_over_16gb_share": share(sum(s.gpu_mem_gb > 16 for s in specs)),
            "gpu_mem_over_32gb_share": share(sum(s.gpu_mem_gb > 32 for s in specs)),
            "inference_share": share(sum(s.kind == "inference" for s in specs)),
            "nodes": len(self.nodes),
        }

    def cluster_models(self) -> list[tuple[str, float]]:
        """(gpu_model, gpu_mem_gb) of this trace's inventory, for ``validate_job``."""
        return sorted({(n.gpu_model, n.gpu_mem_gb) for n in self.nodes})

    def invalid_jobs(self) -> list[tuple[str, list[FieldError]]]:
        """Jobs that ``validate_job`` refuses when submitted at their own arrival time."""
        models = self.cluster_models()
        bad = []
        for j in self.jobs:
            errs = validate_job(j.spec, now=j.submit_s, cluster_models=models)
            if errs:
                bad.append((j.spec.id, errs))
        return bad


_SIZE_BUCKETS = ("fractional", "1", "2-4", "5-8", "9-32", "33-64")


def _size_bucket(gpus: float) -> str:
    if gpus < 1:
        return "fractional"
    if gpus == 1:
        return "1"
    if gpus <= 4:
        return "2-4"
    if gpus <= 8:
        return "5-8"
    if gpus <= 32:
        return "9-32"
    return "33-64"


def _shifted(job: TraceJob, shift_s: float, factor: float) -> TraceJob:
    """``job`` arriving at ``(submit_s - shift_s) / factor``, its deadline slack kept."""
    submit = (job.submit_s - shift_s) / factor
    spec = job.spec
    if spec.deadline is not None:
        spec = msgspec.structs.replace(spec, deadline=submit + (spec.deadline - job.submit_s))
    return msgspec.structs.replace(job, spec=spec, submit_s=submit)
