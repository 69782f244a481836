"""``libs.obs.jobspans``: a decision span joins the job's stored trace, a bad trace makes a
root (never an error), and wait spans are rate-limited per job and overall."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from libs.obs.jobspans import (
    WaitSpanLimiter,
    clean_traceparent,
    job_span,
    trace_id_of,
    traceparent_of,
)

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BAD = [
    "",
    "garbage",
    "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",  # all-zero span id
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff is invalid
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
    GOOD + "x" * 600,  # oversized
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
]


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_clean_traceparent_keeps_only_valid_ones() -> None:
    assert clean_traceparent(GOOD) == GOOD
    assert clean_traceparent(f"  {GOOD}  ") == GOOD  # canonical form
    for bad in BAD:
        assert clean_traceparent(bad) == "", bad
        assert trace_id_of(bad) is None
    assert trace_id_of(GOOD) == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_job_span_is_a_child_of_the_jobs_trace(spans) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("gateway.submit") as root:
        stored = traceparent_of()
    assert stored == traceparent_of(root)
    with (
        tracer.start_as_current_span("an unrelated cycle"),
        job_span(tracer, "placer.place", stored, job="j1", node="n1", score=None) as span,
    ):
        inner = traceparent_of()
    assert inner == traceparent_of(span)
    place = next(s for s in exporter.get_finished_spans() if s.name == "placer.place")
    assert place.context.trace_id == root.get_span_context().trace_id
    assert place.parent is not None and place.parent.span_id == root.get_span_context().span_id
    assert dict(place.attributes) == {"job": "j1", "node": "n1"}  # None values left out


@pytest.mark.parametrize("bad", BAD)
def test_a_malformed_trace_makes_a_new_root_never_an_error(spans, bad: str) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("t")
    with (
        tracer.start_as_current_span("an unrelated cycle") as cycle,
        job_span(tracer, "placer.wait", bad, job="j1"),
    ):
        pass
    wait = next(s for s in exporter.get_finished_spans() if s.name == "placer.wait")
    assert wait.parent is None  # a root of its own, not the cycle's child
    assert wait.context.is_valid and wait.context.trace_id != cycle.get_span_context().trace_id


def test_errors_are_recorded_and_cancellation_is_not_an_error(spans) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("t")
    with pytest.raises(RuntimeError), job_span(tracer, "fails", GOOD):
        raise RuntimeError("boom")

    async def cancelled() -> None:
        with job_span(tracer, "killed", GOOD):
            await asyncio.sleep(10)

    async def run() -> None:
        task = asyncio.create_task(cancelled())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    assert by_name["fails"].status.status_code is StatusCode.ERROR
    assert by_name["fails"].events[0].name == "exception"
    assert by_name["killed"].status.status_code is StatusCode.UNSET
    assert by_name["killed"].attributes["cancelled"] is True


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_wait_spans_once_per_interval_or_when_the_reason_changes() -> None:
    clock = FakeClock()
    lim = WaitSpanLimiter(every_s=60.0, per_s=100.0, clock=clock)
    allowed = []
    for cycle in range(300):  # 300 cycles, 2 s apart: 600 s of waiting
        clock.t += 2.0
        reason = "Priority" if cycle < 150 else "Resources"
        allowed.append(lim.allow("j1", reason))
    # 300 s each reason: a span at its start and one each 60 s after -> 5 + 5
    assert sum(allowed) == 10
    assert allowed[150]  # the new reason is news at once
    lim.retain(set())
    assert len(lim) == 0 and lim.allow("j1", "Resources")  # forgotten: a new wait is news


def test_the_global_cap_bounds_wait_spans_of_many_jobs() -> None:
    clock = FakeClock()
    lim = WaitSpanLimiter(every_s=60.0, per_s=5.0, clock=clock)
    jobs = [f"j{i}" for i in range(1000)]
    total = 0
    for _ in range(10):  # 10 cycles 1 s apart, 1000 jobs waiting in each
        clock.t += 1.0
        total += sum(lim.allow(j, "Resources") for j in jobs)
    assert total <= 5 + 10 * 5  # the burst, then per_s a second
    assert total >= 50 and lim.dropped > 9000
    # a job held back by the cap still gets its span once tokens are free
    clock.t += 1000.0
    assert lim.allow("j999", "Resources")


def test_limiter_settings_from_env(monkeypatch) -> None:
    monkeypatch.setenv("MOSAIC_WAIT_SPAN_EVERY_S", "5")
    monkeypatch.setenv("MOSAIC_WAIT_SPANS_PER_S", "2.5")
    lim = WaitSpanLimiter.from_env()
    assert (lim.every_s, lim.per_s) == (5.0, 2.5)
    with pytest.raises(ValueError):
        WaitSpanLimiter(per_s=0)
