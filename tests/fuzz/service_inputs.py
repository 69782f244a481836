"""What the service fuzzer sends: messages that *decode* (real ``proto`` Structs) but carry
hostile values - NaN, infinities, -0.0, 1e308, 1e-320, negative and huge integers, long and
odd strings, unknown and mismatched ids - plus raw garbage, for every subject and KV bucket a
service consumes. Kept apart from the harness (test_service_fuzz.py) so each reads on its own.

Job ids come from three pools, so that a forged event never concerns a job that really runs
(forging those is what NATS permissions stop, not validation; see docs/operations.md):
``SUBMIT_IDS`` only ever appear in ``Submitted`` events and cancels (such jobs are real once
submitted, and short), ``OTHER_IDS`` in every other event, command, report and ledger entry,
``BAD_IDS`` are no ids at all. Node specs written to KV ``nodes`` are always unsound (a sound
fake node would be a real node nobody runs), so each must be refused.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
from hypothesis import strategies as st

from proto.commands import CheckpointCommand, KillCommand, RunCommand
from proto.events import (
    Cancelled,
    Checkpointed,
    Completed,
    Failed,
    Placed,
    Preempted,
    Queued,
    Started,
    Submitted,
)
from proto.intents import HoldIntent, MoveIntent
from proto.jobs import CancelRequest, Elastic, JobSpec
from proto.ledger import Allocation
from proto.nodes import ExecutorReport, GpuSample, NodeSpec, RunningAttempt, TelemetrySample
from proto.tenants import TenantRecord
from proto.validation_records import revalidate_node_spec

REAL_NODES = ("v100-0", "t4-0")  # tests.services.test_placer.small_cluster
SUBMIT_IDS = tuple(f"fz-s{i}" for i in range(40))
OTHER_IDS = tuple(f"fz-x{i}" for i in range(40))
BAD_IDS = ("", "a b", "a.b", ">", "*", "x" * 300, "é", "lifecycle.>", "\t")
FAKE_NODES = tuple(f"fz-n{i}" for i in range(12))
KV_KEYS = tuple(f"fz-k{i}" for i in range(12))  # a bucket is bounded: a fixed set of keys

_INF = "\x00inf\x00"  # placeholders for what JSON has no literal for (see ``encode``)
_NINF = "\x00-inf\x00"

HOSTILE_FLOATS = (
    math.inf,
    -math.inf,
    -0.0,
    0.0,
    1e308,
    -1e308,
    1e-320,
    -1.0,
    1e9,
    2.0**63,
)
HOSTILE_INTS = (-1, 0, -(2**63), 2**31, 2**53 + 1, 2**63 - 1, 2**64 - 1, 10**9)

hostile_float = st.sampled_from(HOSTILE_FLOATS) | st.floats(allow_nan=False)
hostile_int = st.sampled_from(HOSTILE_INTS) | st.integers(-(2**63), 2**64 - 1)
text = st.text(max_size=40) | st.sampled_from(["", "x" * 5000, "\u202e\u0000", "🚀" * 100])
other_id = st.sampled_from(OTHER_IDS + BAD_IDS)
any_node = st.sampled_from(REAL_NODES + FAKE_NODES + BAD_IDS)
times = hostile_float | st.just(1.7e9)


def _either(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return good | bad


def job_specs(ids: tuple[str, ...]) -> st.SearchStrategy[JobSpec]:
    """Specs mostly unsound; the sound ones are short (a minute or two on the reference GPU)."""
    return st.builds(
        JobSpec,
        id=st.sampled_from(ids) | other_id,
        tenant=st.sampled_from(["default", "t1"]) | text,
        priority=_either(st.integers(0, 9), hostile_int),
        gpus=_either(st.sampled_from([0.5, 1.0, 2.0]), hostile_float),
        gpu_mem_gb=_either(st.sampled_from([4.0, 8.0]), hostile_float),
        host_mem_gb=_either(st.just(8.0), hostile_float),
        cpus=_either(st.just(2.0), hostile_float),
        constraints=st.just(()) | st.lists(text, max_size=20).map(tuple),
        deadline=st.none() | hostile_float,
        energy_sensitivity=_either(st.just(0.0), hostile_float),
        elastic=st.none() | st.builds(Elastic, hostile_int, hostile_int),
        est_runtime_s=_either(st.floats(1.0, 120.0), st.sampled_from(HOSTILE_FLOATS)),
        command=st.none() | text,
        submit_time=st.none() | times,
    )


def _event(cls: type, **fields: Any) -> st.SearchStrategy[Any]:
    return st.builds(
        cls, job_id=other_id, time=times, node=st.none() | any_node, reason=text, **fields
    )


events = st.one_of(
    st.builds(
        Submitted,
        job_id=st.sampled_from(SUBMIT_IDS) | st.sampled_from(BAD_IDS),
        time=times,
        spec=job_specs(SUBMIT_IDS),
    ),
    _event(
        Queued, rank=st.none() | hostile_int, score=st.none() | hostile_float, attempt=hostile_int
    ),
    _event(
        Placed,
        gpu_indices=st.lists(hostile_int, max_size=70).map(tuple),
        gpu_share=hostile_float,
        attempt=hostile_int,
    ),
    _event(Started, attempt=hostile_int),
    _event(Checkpointed, progress=hostile_float),
    _event(Preempted),
    _event(Completed, runtime_s=hostile_float, energy_kwh=hostile_float),
    _event(Failed),
    _event(Cancelled),
)

cancels = st.builds(
    CancelRequest,
    job_id=st.sampled_from(SUBMIT_IDS + OTHER_IDS + BAD_IDS),
    reason=text,
    time=times,
)

allocations = st.builds(
    Allocation,
    job_id=other_id,
    node=any_node,
    gpu_indices=_either(st.just((0,)), st.lists(hostile_int, max_size=70).map(tuple)),
    gpu_share=_either(st.just(1.0), hostile_float),
    gpu_mem_gb=_either(st.just(8.0), hostile_float),
    host_mem_gb=_either(st.just(8.0), hostile_float),
    cpus=_either(st.just(2.0), hostile_float),
    time=times,
    attempt=_either(st.just(1), hostile_int),
    spec=st.none() | job_specs(OTHER_IDS),
)

commands = st.one_of(
    st.builds(RunCommand, allocation=allocations, runtime_s=hostile_float, progress=hostile_float),
    st.builds(
        KillCommand,
        job_id=other_id,
        reason=text,
        attempt=st.none() | hostile_int,
        silent=st.booleans(),
    ),
    st.builds(CheckpointCommand, job_id=other_id, reason=text),
)

gpu_samples = st.builds(
    GpuSample,
    index=_either(st.integers(0, 3), hostile_int),
    util=hostile_float,
    mem_used_gb=hostile_float,
    temp_c=_either(st.floats(20, 90), hostile_float),
    power_w=hostile_float,
)
samples = st.builds(
    TelemetrySample,
    node=any_node,
    time=times,
    backend=st.sampled_from(["sim", "nvml"]) | text,
    gpus=st.lists(gpu_samples, max_size=8).map(tuple)
    | st.just(
        tuple(
            GpuSample(index=i, util=0, mem_used_gb=0, temp_c=-5, power_w=0) for i in range(10_000)
        )
    ),
)

reports = st.builds(
    ExecutorReport,
    node=st.sampled_from(FAKE_NODES + BAD_IDS),  # a forged report for a real node: see above
    time=times,
    boot_id=text,
    interval_s=hostile_float,
    running=st.lists(
        st.builds(
            RunningAttempt,
            job_id=other_id,
            attempt=hostile_int,
            pid=st.none() | hostile_int,
        ),
        max_size=20,
    ).map(tuple),
)


# what the defragmenter and the thermal guard send the placer. A hold names a fake or unsound
# node only: a sound hold of a real node is what NATS permissions stop (it would cordon it);
# a move names a job that never runs (OTHER_IDS), so each must be refused
_intent_common = {
    "id": st.sampled_from(OTHER_IDS + BAD_IDS) | text,
    "source": st.sampled_from(["defrag", "thermal"]) | text,
    "time": times,
    "reason": text,
    "trace": text,
}
intents = st.one_of(
    st.builds(
        MoveIntent,
        job_id=other_id,
        attempt=hostile_int,
        node=any_node,
        kind=st.sampled_from(["preempt", "migrate"]) | text,
        for_job=other_id | text,
        shrink_to=hostile_int,
        **_intent_common,
    ),
    st.builds(
        HoldIntent,
        node=st.sampled_from(FAKE_NODES + BAD_IDS),
        hold=st.just("hot") | text,
        on=st.booleans(),
        ttl_s=hostile_float,
        **_intent_common,
    ),
)


def _node_pair() -> st.SearchStrategy[tuple[str, NodeSpec]]:
    spec = st.builds(
        NodeSpec,
        id=st.sampled_from(FAKE_NODES) | st.sampled_from(BAD_IDS),
        gpu_model=st.sampled_from(["a100-80gb", "t4"]) | text,
        gpu_count=_either(st.integers(1, 8), hostile_int),
        gpu_mem_gb=_either(st.just(16.0), hostile_float),
        host_mem_gb=_either(st.just(64.0), hostile_float),
        cpus=_either(st.just(16), hostile_int),
        idle_power_w=_either(st.just(10.0), hostile_float),
        max_power_w=_either(st.just(300.0), hostile_float),
        labels=st.dictionaries(text, text, max_size=4),
    )
    pair = st.tuples(st.sampled_from(FAKE_NODES), spec)
    return pair.filter(lambda kv: bool(revalidate_node_spec(kv[1], kv[0])))


node_specs = _node_pair()
tenants = st.builds(
    TenantRecord,
    name=text,
    token_sha256=text,
    created_at=times,
    may_run_commands=st.booleans(),
)


def _floats_out(value: Any) -> Any:
    """Builtins with every infinity replaced by a placeholder (msgspec writes them as null)."""
    if isinstance(value, float) and math.isinf(value):
        return _INF if value > 0 else _NINF
    if isinstance(value, dict):
        return {k: _floats_out(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats_out(v) for v in value]
    return value


def encode(msg: msgspec.Struct) -> bytes:
    """JSON of ``msg`` as a forger would write it: an infinity as ``1e999``, which decodes to
    one (msgspec itself would write ``null``, which the typed decoder refuses)."""
    data = msgspec.json.encode(_floats_out(msgspec.to_builtins(msg)))
    return data.replace(b'"\\u0000inf\\u0000"', b"1e999").replace(
        b'"\\u0000-inf\\u0000"', b"-1e999"
    )


# raw garbage: every subject gets some of it too (the bus fuzzer has the full menu)
garbage = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"\xff\xfe\xfd",
            b"[" * 5000,
            b'{"a":' * 3000,
            b"null",
            b'{"type":"placed","job_id":5,"time":"now"}',
            b'{"job_id":"fz-x1","time":NaN}',
            b"1e999",
            b"",
        ]
    ),
)


def _fixed() -> dict[str, tuple[Any, ...]]:
    """The cases issue 12 names, sent first on each target whatever hypothesis draws."""
    v100, t4 = REAL_NODES
    alloc = Allocation(
        job_id="fz-x0",
        node=v100,
        gpu_indices=(99,),
        gpu_share=1.0,
        gpu_mem_gb=8.0,
        host_mem_gb=8.0,
        cpus=2.0,
        time=1.7e9,
    )
    cold = GpuSample(index=0, util=0.5, mem_used_gb=1.0, temp_c=-300.0, power_w=50.0)
    wide = tuple(
        GpuSample(index=i, util=0, mem_used_gb=0, temp_c=40, power_w=0) for i in range(10_000)
    )
    node = NodeSpec(
        id="fz-n0",
        gpu_model="t4",
        gpu_count=0,
        gpu_mem_gb=16,
        host_mem_gb=64,
        cpus=16,
        idle_power_w=10,
        max_power_w=70,
    )
    return {
        "lifecycle": (
            Submitted(job_id="fz-s0", time=1.7e9, spec=JobSpec(id="fz-s0", gpus=-1.0)),
            Submitted(job_id="fz-s1", time=1.7e9, spec=JobSpec(id="fz-x2")),
            Placed(job_id="fz-x3", time=1.7e9, node=v100, gpu_indices=(0,), attempt=1),
            Completed(job_id="fz-x4", time=1.7e9, node=v100, runtime_s=math.inf),
        ),
        "jobs.cancel": (CancelRequest(job_id="fz-x5"), CancelRequest(job_id="a b")),
        "node.<n>.*": (
            (
                v100,
                "run",
                RunCommand(allocation=msgspec.structs.replace(alloc, node=t4), runtime_s=1),
            ),
            (v100, "run", RunCommand(allocation=alloc, runtime_s=1.0)),
        ),
        "telemetry.*": (
            (v100, TelemetrySample(node=v100, time=1.7e9, backend="sim", gpus=wide)),
            (t4, TelemetrySample(node=t4, time=1.7e9, backend="sim", gpus=(cold,))),
        ),
        "executor.*": (
            (
                "fz-n1",
                ExecutorReport(
                    node="fz-n1",
                    time=1.7e9,
                    boot_id="b",
                    interval_s=1e308,
                    running=(RunningAttempt(job_id="fz-x6", attempt=2**63),),
                ),
            ),
        ),
        "kv nodes": (
            ("fz-n0", node),
            ("fz-n1", msgspec.structs.replace(node, id="fz-n1", gpu_count=10**9)),
        ),
        "kv ledger": (("fz-x0", alloc),),
        "kv tenants": (("fz-k0", TenantRecord(name="", token_sha256="", created_at=math.inf)),),
        "intents.*": (
            ("defrag", MoveIntent(id="fz-i0", source="x" * 5000, time=1.7e9, reason="r",
                                  job_id="fz-x7", attempt=1, node=v100)),
            ("thermal", HoldIntent(id="fz-i1", source="thermal", time=1.7e9, reason="hot",
                                   node="lifecycle.>", ttl_s=60.0)),
            ("thermal", HoldIntent(id="fz-i2", source="thermal", time=math.inf, reason="hot",
                                   node="fz-n2", ttl_s=1e308)),
        ),
    }  # fmt: skip


FIXED = _fixed()
