"""The job's trace in the folds that outlive its messages: the placer's tracker and the
scorer's pending set keep it per live job, through their snapshots (and read snapshots from
before the field), the gateway's read model through its own; and the placer's wait spans
are rate-limited however many cycles a job waits; a run command carries the placement's
trace, or the job's when resent."""

from __future__ import annotations

import asyncio

import msgspec
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libs.obs.jobspans import WaitSpanLimiter, job_span, traceparent_of
from proto.events import Completed, Submitted
from proto.jobs import JobSpec
from proto.ledger import Allocation
from services.gateway.jobs_view import JobsModel
from services.placer.announce import Announcer
from services.placer.tracker import JobTracker
from services.scorer.pending import PendingSet

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def submitted(job: str, trace: str = GOOD) -> Submitted:
    return Submitted(job_id=job, time=1.0, spec=JobSpec(id=job), trace=trace)


def _without(data: bytes, field: str) -> bytes:
    """A snapshot as an older version wrote it: the same map without ``field``."""
    raw = msgspec.msgpack.decode(data)
    del raw[field]
    return msgspec.msgpack.encode(raw)


def test_tracker_keeps_the_trace_until_the_end_and_through_snapshots() -> None:
    t = JobTracker()
    t.apply(submitted("a"))
    t.apply(submitted("b", trace="not a traceparent"))
    t.apply(submitted("a", trace="00-" + "1" * 32 + "-" + "2" * 16 + "-01"))  # first one counts
    assert (t.trace_of("a"), t.trace_of("b"), t.trace_of("zz")) == (GOOD, "", "")
    again = JobTracker().load(t.encode())
    assert again.trace_of("a") == GOOD
    old = JobTracker().load(_without(t.encode(), "traces"))  # a snapshot from before
    assert old.trace_of("a") == "" and "a" in old.specs
    t.apply(Completed(job_id="a", time=2.0))
    assert t.trace_of("a") == "" and t.traces == {}


def test_pending_set_keeps_the_trace_through_snapshots() -> None:
    p = PendingSet()
    p.apply(submitted("a"))
    p.apply(submitted("b", trace="00-zz"))
    assert (p.trace_of("a"), p.trace_of("b")) == (GOOD, "")
    assert PendingSet().load(p.encode()).trace_of("a") == GOOD
    assert PendingSet().load(_without(p.encode(), "traces")).trace_of("a") == ""
    p.apply(Completed(job_id="a", time=2.0))
    assert p.trace_of("a") == ""


def test_gateway_model_keeps_the_trace_through_its_snapshot() -> None:
    m = JobsModel()
    m.apply(submitted("a"))
    assert m.trace_of("a") == GOOD
    restored = JobsModel().load(m.encode())
    assert restored.trace_of("a") == GOOD and restored.events("a")[0] == submitted("a")
    raw = msgspec.msgpack.decode(m.encode())
    raw["jobs"] = [stored[:-1] for stored in raw["jobs"]]  # as written before the field
    old = JobsModel().load(msgspec.msgpack.encode(raw))
    assert old.trace_of("a") == "" and old.get("a") is not None


class _Waits(Announcer):
    def __init__(self, tracer, limiter: WaitSpanLimiter) -> None:
        self.tracer = tracer
        self.tracker = JobTracker()
        self.waiting = {}
        self.wait_spans = limiter


def test_placer_wait_spans_are_rate_limited_over_many_cycles() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    now = [0.0]
    placer = _Waits(provider.get_tracer("placer"), WaitSpanLimiter(30.0, 3.0, clock=lambda: now[0]))
    for i in range(20):
        placer.tracker.apply(submitted(f"j{i}"))
    placer.waiting = {f"j{i}": "Resources" for i in range(20)}
    for _ in range(120):  # 120 cycles, 0.5 s apart: 60 s of 20 jobs waiting
        now[0] += 0.5
        placer._trace_waits(placer.waiting)  # the worst case: every wait is news each cycle
    waits = [s for s in exporter.get_finished_spans() if s.name == "placer.wait"]
    # the cap: a burst of 3 then 3 a second; per job: once, then 30 s later
    assert len(waits) <= 3 + 60 * 3
    assert len(waits) <= 20 * 2
    per_job: dict[str, int] = {}
    for s in waits:
        per_job[s.attributes["job"]] = per_job.get(s.attributes["job"], 0) + 1
        assert s.parent is not None and f"{s.parent.trace_id:032x}" in GOOD  # the job's trace
        assert s.attributes["reason"] == "Resources"
    assert max(per_job.values()) <= 2 and len(per_job) == 20  # every job got one
    placer.waiting = {"j0": "Priority"}  # a new reason is news; the others stopped waiting
    now[0] += 0.5
    placer._trace_waits(placer.waiting)
    assert len(placer.wait_spans) == 1
    last = exporter.get_finished_spans()[-1]
    assert (last.name, last.attributes["reason"]) == ("placer.wait", "Priority")


class _Bus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    async def publish(self, subject: str, msg: object, **_: object) -> bool:
        self.sent.append((subject, msg))
        return True


class _Runs(Announcer):
    def __init__(self) -> None:
        self.bus = _Bus()
        self.tracker = JobTracker()
        self.tracker.apply(submitted("j1"))


def test_a_run_command_carries_its_placement_or_else_the_jobs_trace() -> None:
    tracer = TracerProvider().get_tracer("placer")
    alloc = Allocation(
        job_id="j1",
        node="n1",
        gpu_indices=(0,),
        gpu_share=1.0,
        gpu_mem_gb=8.0,
        host_mem_gb=16.0,
        cpus=4.0,
        time=1.0,
    )
    placer = _Runs()

    def sent_trace() -> str:
        return placer.bus.sent[-1][1].trace

    asyncio.run(placer._publish_run(alloc, 1.0, 0.0))  # a resend: no span
    assert sent_trace() == GOOD
    with job_span(tracer, "placer.place", GOOD, job="j1") as span:  # from the placement
        asyncio.run(placer._publish_run(alloc, 1.0, 0.0))
        assert sent_trace() == traceparent_of(span) != GOOD
    with tracer.start_as_current_span("an unrelated span"):  # never another trace
        asyncio.run(placer._publish_run(alloc, 1.0, 0.0))
        assert sent_trace() == GOOD
