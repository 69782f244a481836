"""What the bus fuzzer sends: the targets (every subject and KV watch a service consumes, with
its real ``proto`` type and a real message) and the hypothesis strategies of garbage for them.
Kept apart from the harness in test_bus_fuzz.py so each reads on its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from hypothesis import strategies as st

from libs.bus.limits import DecodeLimits
from proto import subjects
from proto.commands import CheckpointCommand, KillCommand, RunCommand
from proto.decisions import CandidateScore, Decision
from proto.events import LifecycleEvent, Placed, Submitted
from proto.jobs import CancelRequest, Elastic, JobSpec
from proto.ledger import Allocation
from proto.nodes import ExecutorReport, GpuSample, NodeSpec, RunningAttempt, TelemetrySample

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
