"""Bus fuzzing (issue 12): generated garbage on every subject a service consumes, typed with the
real ``proto`` types, against a real nats-server.

Each example is one message — deep nesting, huge and non-finite numbers, wrong types, bytes that
are not UTF-8, empty, oversized, truncated or mutated real messages, and real messages too —
published on one target (a JetStream consumer, a core subscription or a KV watch). The harness
waits until the bus has either handed it to the handler or dead-lettered it, and checks which: a
message the decoder (within the bus's limits) rejects must be a dead letter, any other must reach
the handler. At the end: every loop is alive (a valid message on each is still handled), the DLQ
stream holds one letter per bad message, and the service health is ok.

``make test`` runs a short version; the ``slow`` one (``make test-all``) does 10,000 per target.
Its counts are in docs/benchmarks.md ("Fuzzing (bus)").
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from libs.bus import Bus
from libs.bus.limits import DecodeLimits
from libs.bus.receive import guarded_decode, make_decoder
from libs.bus.server import NatsServer, start_nats_server
from proto import subjects
from proto.commands import CheckpointCommand, KillCommand, RunCommand
from proto.decisions import CandidateScore, Decision, RankedEntry, RankedQueue
from proto.events import LifecycleEvent, Placed, Submitted
from proto.jobs import CancelRequest, Elastic, JobSpec
from proto.ledger import Allocation
from proto.nodes import ExecutorReport, GpuSample, NodeSpec, RunningAttempt, TelemetrySample

R = TypeVar("R")
LIMITS = DecodeLimits(max_bytes=256 * 1024, max_depth=64)
SPEC = JobSpec(id="j1", gpus=2.0, elastic=Elastic(1, 4), deadline=1e9, command="true")
ALLOC = Allocation(
    job_id="j1",
    node="n1",
    gpu_indices=(0, 1),
    gpu_share=1.0,
    gpu_mem_gb=8.0,
    host_mem_gb=16.0,
    cpus=4.0,
    time=1.0,
    spec=SPEC,
)


@dataclass
class Target:
    """One thing a service consumes: how to publish on it, its type, and a real message."""

    name: str
    kind: str  # durable | core | kv
    pattern: str  # the subscription subject, or the bucket
    type_: Any
    samples: tuple[msgspec.Struct, ...]
    subjects: st.SearchStrategy[str]
    home: str  # where the first sample goes (for the final "still alive" message)
    stream: str = ""
    handled: int = 0
    sent: int = 0
    bad: int = 0

    @property
    def dead_label(self) -> str:
        return f"kv.{self.pattern}" if self.kind == "kv" else self.pattern


token = st.from_regex(r"\A[a-zA-Z0-9_-]{1,10}\Z")
# KV keys from a fixed set, as in a real bucket (one per node, per job): a bucket is bounded
# and refuses writes when full (KV streams discard new), so endless fresh keys would fill it
kv_key = st.sampled_from([f"k{i}" for i in range(20)])
node_cmd = st.sampled_from(["run", "kill", "checkpoint", "bogus"]).map(lambda v: f"node.n1.{v}")
TARGETS = [
    Target(
        "lifecycle",
        "durable",
        "lifecycle.>",
        LifecycleEvent,
        (Submitted(job_id="j1", time=1.0, spec=SPEC), Placed(job_id="j1", time=2.0, node="n1")),
        token.map(subjects.lifecycle),
        "lifecycle.last",
        subjects.STREAM_LIFECYCLE,
    ),
    Target(
        "decisions",
        "durable",
        "decisions.>",
        Decision,
        (
            Decision(
                job_id="j1",
                time=1.0,
                action="place",
                service="placer",
                node="n1",
                candidates=(CandidateScore(node="n1", total=0.5, terms={"u": 0.5}),),
            ),
        ),
        token.map(subjects.decisions),
        "decisions.last",
        subjects.STREAM_DECISIONS,
    ),
    Target(
        "cancel",
        "durable",
        subjects.SUBJECT_CANCEL,
        CancelRequest,
        (CancelRequest(job_id="j1", time=3.0),),
        st.just(subjects.SUBJECT_CANCEL),
        subjects.SUBJECT_CANCEL,
        subjects.STREAM_JOBS,
    ),
    Target(
        "submit",
        "durable",
        subjects.SUBJECT_SUBMIT,
        JobSpec,
        (SPEC,),
        st.just(subjects.SUBJECT_SUBMIT),
        subjects.SUBJECT_SUBMIT,
        subjects.STREAM_JOBS,
    ),
    Target(
        "node-commands",
        "durable",
        subjects.node_commands("n1"),
        {
            "node.*.run": RunCommand,
            "node.*.kill": KillCommand,
            "node.*.checkpoint": CheckpointCommand,
        },
        (RunCommand(allocation=ALLOC, runtime_s=60.0), KillCommand(job_id="j1", reason="x")),
        node_cmd,
        "node.n1.run",
        subjects.STREAM_NODECMD,
    ),
    Target(
        "telemetry",
        "core",
        subjects.TELEMETRY_ALL,
        TelemetrySample,
        (
            TelemetrySample(
                node="n1",
                time=1.0,
                backend="sim",
                gpus=(GpuSample(index=0, util=0.5, mem_used_gb=1.0, temp_c=50.0, power_w=100.0),),
            ),
        ),
        token.map(subjects.telemetry),
        "telemetry.last",
    ),
    Target(
        "executor-report",
        "core",
        subjects.EXECUTOR_REPORTS_ALL,
        ExecutorReport,
        (
            ExecutorReport(
                node="n1",
                time=1.0,
                boot_id="b",
                interval_s=5.0,
                running=(RunningAttempt(job_id="j1", attempt=1, pid=42),),
            ),
        ),
        token.map(subjects.executor_report),
        "executor.last",
    ),
    Target(
        "queue",
        "core",
        subjects.QUEUE_UPDATED,
        RankedQueue,
        (
            RankedQueue(
                time=1.0, load=0.5, regime="busy", entries=(RankedEntry(spec=SPEC, score=1.0),)
            ),
        ),
        st.just(subjects.QUEUE_UPDATED),
        subjects.QUEUE_UPDATED,
    ),
    Target(
        "kv-nodes",
        "kv",
        subjects.KV_NODES,
        NodeSpec,
        (
            NodeSpec(
                id="n1",
                gpu_model="A100",
                gpu_count=8,
                gpu_mem_gb=80.0,
                host_mem_gb=1024.0,
                cpus=128,
                idle_power_w=50.0,
                max_power_w=400.0,
            ),
        ),
        kv_key,
        "last",
    ),
    Target(
        "kv-ledger",
        "kv",
        subjects.KV_LEDGER,
        Allocation,
        (ALLOC,),
        kv_key,
        "last",
    ),
]

# --- garbage --------------------------------------------------------------------------------

RAW = b"\x00RAW\x00"
NUMBERS = [
    b"1e999",
    b"-1e999",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1" + b"0" * 400,
    b"-0",
    b"1e-400",
    b"9223372036854775808",
    b"18446744073709551616",
    b"0x10",
    b"1.",
    b".5",
    b"+1",
    b"01",
    b"1e",
    b"--1",
    b"true",
    b"null",
    b'"1"',
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    return [_replace(v, rest, new) if i == head else v for i, v in enumerate(value)]


@st.composite
def mutated(draw: st.DrawFn, sample: msgspec.Struct) -> bytes:
    """A real message with one field (at any depth) made wrong: a raw number token (huge,
    non-finite, malformed), a value of another type, deep nesting, or an unknown field."""
    doc = msgspec.json.decode(msgspec.json.encode(sample))
    paths = _paths(doc)
    how = draw(st.sampled_from(["number", "wrong-type", "deep", "extra"]))
    if how == "extra" or not paths:
        doc = {**doc, draw(st.text(max_size=8)): draw(json_values)}
        return msgspec.json.encode(doc)
    path = draw(st.sampled_from(paths))
    if how == "wrong-type":
        return msgspec.json.encode(_replace(doc, path, draw(json_values)))
    data = msgspec.json.encode(_replace(doc, path, RAW.decode()))
    if how == "number":
        return data.replace(b'"' + RAW + b'"', draw(st.sampled_from(NUMBERS)))
    return data.replace(b'"' + RAW + b'"', draw(deep()))


@st.composite
def deep(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(1, 20_000))
    opener = draw(st.sampled_from([b"[", b'{"a":', b'[{"a":']))
    closer = {b"[": b"]", b'{"a":': b"}", b'[{"a":': b"}]"}[opener]
    closed = draw(st.booleans())
    return opener * n + b"1" + (closer * n if closed else b"")


@st.composite
def broken(draw: st.DrawFn, sample: msgspec.Struct) -> bytes:
    """A real message truncated, or with bytes overwritten (often not UTF-8)."""
    data = msgspec.json.encode(sample)
    if draw(st.booleans()):
        return data[: draw(st.integers(0, len(data) - 1))]
    at = draw(st.integers(0, len(data) - 1))
    junk = draw(st.binary(min_size=1, max_size=4))
    return data[:at] + junk + data[at + len(junk) :]


def garbage(target: Target) -> st.SearchStrategy[bytes]:
    samples = st.sampled_from(target.samples)
    oversized = st.integers(LIMITS.max_bytes + 1, LIMITS.max_bytes + 50_000).map(
        lambda n: b'"' + b"x" * (n - 2) + b'"'
    )
    return st.one_of(
        st.binary(max_size=300),  # anything, empty and non-UTF-8 included
        json_values.map(msgspec.json.encode),  # JSON of the wrong shape
        deep(),
        samples.flatmap(mutated),
        samples.flatmap(broken),
        samples.map(msgspec.json.encode),  # the real thing: must be handled
        st.just(b""),
        oversized,
    )


# --- harness --------------------------------------------------------------------------------


@dataclass
class Harness:
    """A nats-server and a Bus whose loops run in a thread of their own, so hypothesis (which
    is synchronous) can drive them one example at a time."""

    store: Path
    server: NatsServer | None = None
    bus: Bus | None = None
    service: str = field(default_factory=lambda: f"fuzz-{uuid.uuid4().hex[:8]}")
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    kvs: dict[str, Any] = field(default_factory=dict)
    decoders: dict[str, Callable[[str, bytes], Any]] = field(default_factory=dict)

    def run(self, coro: Coroutine[Any, Any, R], timeout_s: float = 30.0) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def start(self) -> None:
        threading.Thread(target=self.loop.run_forever, name="fuzz-bus", daemon=True).start()
        self.server = start_nats_server(self.store)
        self.run(self._setup())

    async def _setup(self) -> None:
        assert self.server is not None
        self.bus = bus = await Bus.connect(self.server.url, self.service)
        bus.limits = LIMITS
        await bus.ensure_topology()
        for t in TARGETS:
            self.decoders[t.name] = make_decoder(t.type_)

            async def handler(_value: Any, t: Target = t) -> None:
                t.handled += 1

            if t.kind == "durable":
                await bus.consume(t.stream, t.pattern, t.type_, handler, durable=t.name)
            elif t.kind == "core":
                await bus.subscribe(t.pattern, t.type_, handler)
            else:
                kv = await bus.kv(t.pattern, t.type_)
                self.kvs[t.name] = kv

                async def on_change(_key: str, _v: Any, t: Target = t) -> None:
                    t.handled += 1

                await kv.watch(on_change)

    def dead(self, t: Target) -> int:
        labels = {"service": self.service, "subject": t.dead_label}
        return int(REGISTRY.get_sample_value("mosaic_dead_letters_total", labels) or 0)

    def send(self, t: Target, subject: str, data: bytes) -> None:
        """Publish one example and wait until the bus handled or dead-lettered it."""
        _, rejected = guarded_decode(LIMITS, lambda d: self.decoders[t.name](subject, d), data)
        bad_before, handled_before = self.dead(t), t.handled
        t.sent += 1
        t.bad += rejected is not None
        self.run(self._publish(t, subject, data))
        deadline = time.monotonic() + 20.0
        while self.dead(t) + t.handled < bad_before + handled_before + 1:
            assert time.monotonic() < deadline, f"{t.name}: example neither handled nor dead"
            time.sleep(0.0005)
        # the right one of the two, and only once
        assert (self.dead(t) - bad_before, t.handled - handled_before) == (
            (1, 0) if rejected else (0, 1)
        ), (t.name, subject, data[:200], rejected)

    async def _publish(self, t: Target, subject: str, data: bytes) -> None:
        assert self.bus is not None
        if t.kind == "durable":
            await self.bus.js.publish(subject, data)
        elif t.kind == "core":
            await self.bus.nc.publish(subject, data)
            await self.bus.nc.flush()
        else:
            await self.kvs[t.name].raw.put(subject, data)

    def finish(self) -> dict[str, tuple[int, int]]:
        """A valid message through every target (its loop is alive), then the DLQ and health
        checks; returns {target: (sent, dead letters)}."""
        for t in TARGETS:
            self.send(t, t.home, msgspec.json.encode(t.samples[0]))
        assert self.bus is not None
        info = self.run(self.bus.js.stream_info(subjects.STREAM_DLQ))
        total_bad = sum(t.bad for t in TARGETS)
        assert info.state.last_seq == total_bad  # one letter per bad message, none lost
        assert self.bus.health.problems() == {}
        assert all(m.task is not None and not m.task.done() for m in self.bus._monitors.values())
        return {t.name: (t.sent, t.bad) for t in TARGETS}

    def stop(self) -> None:
        if self.bus is not None:
            self.run(self.bus.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.server is not None:
            self.server.stop()


def run_target(harness: Harness, target: Target, examples: int) -> None:
    """``examples`` generated messages on ``target``, one hypothesis run."""

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(subject=target.subjects, data=garbage(target))
    def one(subject: str, data: bytes) -> None:
        harness.send(target, subject, data)

    one()


def fuzz(tmp: Path, examples_per_target: int) -> dict[str, tuple[int, int]]:
    for t in TARGETS:
        t.handled = t.sent = t.bad = 0
    harness = Harness(tmp)
    harness.start()
    try:
        for t in TARGETS:
            run_target(harness, t, examples_per_target)
        return harness.finish()
    finally:
        harness.stop()


def test_bus_fuzz_short(tmp_path: Path) -> None:
    counts = fuzz(tmp_path, 30)
    assert sum(sent for sent, _ in counts.values()) >= 30 * len(TARGETS)
    assert all(bad > 0 for _, bad in counts.values())  # garbage did reach every target


@pytest.mark.slow
def test_bus_fuzz_10k_per_subject(tmp_path: Path) -> None:
    t0 = time.monotonic()
    counts = fuzz(tmp_path, 10_000)
    print(f"\nbus fuzz: {time.monotonic() - t0:.0f} s")
    for name, (sent, bad) in counts.items():
        print(f"{name:16} sent {sent:6}  dead letters {bad:6}  handled {sent - bad:6}")
    assert all(sent >= 10_000 for sent, _ in counts.values())
