"""Seeing the spans of services that run in this test process.

OpenTelemetry lets a process set its global TracerProvider once, and ``libs.obs.tracing``
installs it on the first ``setup_tracing`` (any in-process service's start). A test therefore
attaches a processor to that provider for its own duration (``attached``): spans end up in an
in-memory list (``captured``), or go over real OTLP/HTTP to a receiver in a thread of the test
(``OtlpReceiver``, ``exporting_to``); after the test the processor is switched off (a provider
cannot drop a processor).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libs.obs.tracing import setup_tracing


class _Switchable(SpanProcessor):
    """Forwards ended spans to ``inner`` while on; a no-op once the test is over."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.on = True

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            self.inner.on_end(span)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis) if self.on else True

    def shutdown(self) -> None:
        if self.on:
            self.on = False
            self.inner.shutdown()


def global_provider() -> TracerProvider:
    """The process's SDK provider (installed here when no service did yet)."""
    setup_tracing("tests")
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), provider
    return provider


@contextmanager
def attached(processor: SpanProcessor) -> Iterator[TracerProvider]:
    provider = global_provider()
    switch = _Switchable(processor)
    provider.add_span_processor(switch)
    try:
        yield provider
    finally:
        switch.force_flush(10_000)
        switch.shutdown()


@contextmanager
def captured() -> Iterator[InMemorySpanExporter]:
    """The spans that end in this process meanwhile, in memory."""
    exporter = InMemorySpanExporter()
    with attached(SimpleSpanProcessor(exporter)):
        yield exporter


@dataclass(frozen=True)
class Received:
    """One span as an OTLP receiver got it (ids as hex; ``parent`` "" for a root; ``service``
    the exporting process's ``service.name``)."""

    name: str
    trace_id: str
    span_id: str
    parent: str
    attributes: dict[str, object]
    service: str = ""


class OtlpReceiver:
    """An OTLP/HTTP trace receiver (``POST /v1/traces``, protobuf) on a free local port.

    In a thread of its own, not the test's event loop: the SDK's exporter posts synchronously
    (from its batch thread, or from a flush the test calls), and must never wait on a loop
    that is the one waiting for it."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.posts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                ok = self.path == "/v1/traces"
                if ok:
                    receiver._take(ExportTraceServiceRequest.FromString(body))
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, req: ExportTraceServiceRequest) -> None:
        got = [
            Received(
                s.name,
                s.trace_id.hex(),
                s.span_id.hex(),
                s.parent_span_id.hex(),
                _attrs(s.attributes),
                str(_attrs(rs.resource.attributes).get("service.name", "")),
            )
            for rs in req.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        ]
        with self._lock:
            self.posts += 1
            self.spans.extend(got)

    def named(self, name: str) -> list[Received]:
        with self._lock:
            return [s for s in self.spans if s.name == name]


@contextmanager
def exporting_to(receiver: OtlpReceiver) -> Iterator[TracerProvider]:
    """Spans that end in this process meanwhile go over OTLP/HTTP to ``receiver`` (batched,
    as in production: ``libs.obs.tracing.build_tracer_provider``'s exporter)."""
    exporter = OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")
    with attached(BatchSpanProcessor(exporter, schedule_delay_millis=200)) as provider:
        yield provider


def _attrs(kvs: Any) -> dict[str, object]:
    return {a.key: _value(a.value) for a in kvs}


def _value(v: Any) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


# a job's spans (issue 13), each once, and the service that emits each
CHAIN = {
    "gateway.submit": "gateway",
    "scorer.score": "scorer",
    "placer.place": "placer",
    "executor.start": "executor",
    "executor.run": "executor",
    "executor.complete": "executor",
}


def one_span(spans: list[Received], name: str, job: str) -> Received:
    """The one span ``name`` about ``job``."""
    mine = [s for s in spans if s.name == name and s.attributes.get("job") == job]
    assert len(mine) == 1, (name, job, mine)
    return mine[0]


def job_chain(spans: list[Received], job: str) -> dict[str, Received]:
    """The job's spans: one trace, rooted at the HTTP request, each with its cause as parent."""
    got = {name: one_span(spans, name, job) for name in CHAIN}
    submit = got["gateway.submit"]
    http = next(s for s in spans if s.span_id == submit.parent)
    assert (http.name, http.parent) == ("POST /v1/jobs", "")  # the root
    assert {s.trace_id for s in got.values()} == {http.trace_id}
    assert got["scorer.score"].parent == submit.span_id
    assert got["placer.place"].parent == submit.span_id
    place = got["placer.place"].span_id
    for name in ("executor.start", "executor.run", "executor.complete"):
        assert got[name].parent == place, name  # the attempt hangs under its placement
    return got
