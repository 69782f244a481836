"""The job's handle on Mosaic: what the executor told it (environment) and what it tells back
(progress file, metrics), with the checkpoint signal wired to the job's save function."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .cache import CacheReleaser
from .checkpoint import DEFAULT_SIGNAL, CheckpointSignal
from .cuda import CudaTimer
from .exporter import Exporter, Metric, exposition
from .progress import ProgressWriter
from .stats import StepStats


def _env_float(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}: must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {raw!r}")
    return value


def _fraction(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: must be a number 0..1, got {value!r}")
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name}: must be a finite fraction 0..1, got {value!r}")
    return float(value)


class Runtime:
    """See the package docstring. ``save()`` saves a checkpoint (of whatever the job holds);
    it is called when the checkpoint signal arrives (at the next ``step()``, or at once with
    ``immediate``), after which the process exits with ``exit_code`` (0: the executor reads
    the exit after its signal as the checkpoint)."""

    def __init__(
        self,
        save: Callable[[], Any] | None,
        *,
        signal_name: str | None = None,
        immediate: bool = False,
        progress_file: str | None = None,
        checkpoint_dir: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        empty_cache_every_s: float | None = None,
        exit_code: int = 0,
    ) -> None:
        env = os.environ
        self.save = save
        self.exit_code = exit_code
        self.job_id = env.get("MOSAIC_JOB_ID", "")
        self.attempt = int(env.get("MOSAIC_ATTEMPT", "0") or 0)
        self.node = env.get("MOSAIC_NODE", "")
        resume = _env_float("MOSAIC_RESUME_PROGRESS", _env_float("MOSAIC_PROGRESS", 0.0))
        self.resume_progress = _fraction("MOSAIC_RESUME_PROGRESS", resume or 0.0)
        where = checkpoint_dir or env.get("MOSAIC_CHECKPOINT_DIR") or "checkpoints"
        self.checkpoint_dir = Path(where)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.stats = StepStats()
        self.cuda = CudaTimer()
        self.saved = False
        self._progress: float | None = None
        self._writer = ProgressWriter(progress_file or env.get("MOSAIC_PROGRESS_FILE"))
        # everything that can refuse a setting first, so a refusal leaves nothing installed
        name = signal_name or env.get("MOSAIC_CHECKPOINT_SIGNAL") or DEFAULT_SIGNAL
        self.signal = CheckpointSignal(name, self.checkpoint if immediate else None)
        every_s = empty_cache_every_s or _env_float("MOSAIC_EMPTY_CACHE_EVERY_S", None)
        self.cache = CacheReleaser(every_s) if every_s else None
        port = metrics_port
        if port is None:
            port = int(_env_float("MOSAIC_TASK_METRICS_PORT", 0) or 0)  # 0: off
        host = metrics_host or env.get("MOSAIC_TASK_METRICS_HOST") or "127.0.0.1"
        serve = metrics_port is not None or bool(port)  # an explicit 0 takes a free port
        self.exporter = Exporter(self.metrics, port, host) if serve else None
        if self.cache is not None:
            self.cache.start()
        self.signal.install()

    # --- what the job calls -------------------------------------------------------------

    def step(self, samples: int = 0) -> None:
        """The end of one step of ``samples`` samples: counts it, reports, and serves a pending
        checkpoint request (which does not return)."""
        self.stats.step(samples)
        self.cuda.collect()
        self._report()
        if self.signal.requested:
            self.checkpoint()

    def progress(self, fraction: float) -> None:
        """How much of the whole job is done (0..1, the resume point included)."""
        self._progress = _fraction("progress", fraction)
        self._report()

    @property
    def checkpoint_requested(self) -> bool:
        return self.signal.requested

    @contextlib.contextmanager
    def cuda_section(self) -> Iterator[None]:
        """Time the CUDA work inside the block (``mosaic_task_cuda_seconds_total``)."""
        with self.cuda.section():
            yield

    def checkpoint(self) -> None:
        """Save (the job's ``save``), report it, and exit: what the signal leads to."""
        try:
            if self.save is not None:
                self.save()
        except BaseException:
            self._report(force=True)
            raise
        self.saved = True
        self._report(force=True)
        self.close()
        sys.exit(self.exit_code)

    def close(self) -> None:
        """Stop the exporter and the cache thread, put the old signal handler back."""
        self._report(force=True)
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None
        if self.cache is not None:
            self.cache.stop()
        self.signal.uninstall()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what it tells -------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        s = self.stats
        return {
            "progress": self._progress,
            "steps": s.steps,
            "samples": s.samples,
            "step_time_s": s.step_time_s,
            "steps_per_s": s.steps_per_s(),
            "samples_per_s": s.samples_per_s(),
            "saved": self.saved,
            "attempt": self.attempt,
        }

    def _report(self, *, force: bool = False) -> None:
        try:
            self._writer.write(self.record(), force=force)
        except OSError as exc:  # a full disk must not end the job; the executor estimates
            print(f"mosaic runtime: progress not written: {exc}", file=sys.stderr)

    def metrics(self) -> str:
        """The exporter's page (``docs/runtime-contract.md`` lists the metrics)."""
        s = self.stats
        cuda_help = "Seconds of GPU time in the job's timed CUDA sections (CUDA events)."
        if not self.cuda.available:
            cuda_help += f" Not measured: {self.cuda.why_absent}."
        families = [
            Metric("mosaic_task_steps_total", "counter", "Steps done by this attempt.", s.steps),
            Metric("mosaic_task_samples_total", "counter", "Samples done.", s.samples),
            Metric(
                "mosaic_task_step_seconds",
                "gauge",
                "Wall seconds the last step took.",
                s.step_time_s,
            ),
            Metric(
                "mosaic_task_step_seconds_sum",
                "counter",
                "Wall seconds of all steps (with steps_total: the mean step time).",
                s.step_time_sum_s,
            ),
            Metric(
                "mosaic_task_steps_per_second",
                "gauge",
                "Throughput over the last 32 steps, steps per second.",
                s.steps_per_s(),
            ),
            Metric(
                "mosaic_task_samples_per_second",
                "gauge",
                "Throughput over the last 32 steps, samples per second.",
                s.samples_per_s(),
            ),
            Metric(
                "mosaic_task_progress",
                "gauge",
                "Fraction of the whole job done, as the job reports it.",
                self._progress,
            ),
            Metric(
                "mosaic_task_cuda_seconds_total",
                "counter",
                cuda_help,
                self.cuda.collect() if self.cuda.available else None,
            ),
        ]
        labels = {"job": self.job_id, "attempt": str(self.attempt or ""), "node": self.node}
        return exposition(families, labels)
