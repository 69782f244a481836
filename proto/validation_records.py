"""Validation of the records services take from the bus besides jobs: node specs (KV
``nodes``), ledger allocations (KV ``ledger``), telemetry samples and executor reports.

Why: the bus is a trust boundary (rule 6), and fuzzing the real services with values that
decode but are hostile (a node of 10^9 GPUs, an allocation of GPU 99 on a 4-GPU node, a NaN
report interval, a temperature of -300) found handlers that raised on every such message or
every later round (tests/fuzz/test_service_fuzz.py). Each function is pure, never raises
whatever the values, and returns the reasons (``proto.validation.FieldError``); empty means
sound. A service ignores an unsound record with a log line and a count
(``libs.bus.refusals``). Same rules and helpers as ``proto.validation``.
"""

from __future__ import annotations

import math

from proto.ledger import Allocation
from proto.nodes import ExecutorReport, NodeSpec, TelemetrySample
from proto.power import PowerCommand
from proto.validation import (
    MAX_CPUS,
    MAX_GPU_MEM_GB,
    MAX_GPUS_PER_JOB,
    MAX_HOST_MEM_GB,
    MIN_GPU_FRACTION,
    FieldError,
    _number,
    _positive,
    _spec_errors,
    sound_id,
)

MAX_GPUS_PER_NODE = 64
MAX_POWER_W = 10_000.0  # per GPU
MAX_ATTEMPT = 1_000_000  # attempts of one job; beyond it a number is a forgery, not a retry
MAX_LABELS = 64
MAX_TEXT = 256  # a label, a boot id, a model name
TEMP_C = (-60.0, 200.0)  # what a GPU sensor can read
MAX_REPORT_INTERVAL_S = 3600.0
MAX_RUNNING = 4096  # attempts one executor report lists


def sound_attempt(attempt: int) -> bool:
    """An attempt number a service can use: a whole number 1..``MAX_ATTEMPT``."""
    return (
        isinstance(attempt, int) and not isinstance(attempt, bool) and 1 <= attempt <= MAX_ATTEMPT
    )


def _text(errs: list[FieldError], field: str, value: str, *, empty: bool = False) -> None:
    if len(value) > MAX_TEXT or (not empty and not value):
        errs.append(FieldError(field, f"must be {0 if empty else 1}-{MAX_TEXT} characters"))


def revalidate_node_spec(spec: NodeSpec, key: str | None = None) -> list[FieldError]:
    """Every reason a ``nodes`` KV value is unsound; ``key`` is the KV key it was stored under,
    which must be its id. Why: a node of 10^9 GPUs or of NaN memory in the scheduler's view
    makes every placement wrong (or its arrays too big to build)."""
    errs: list[FieldError] = []
    if not sound_id(spec.id) or (key is not None and key != spec.id):
        errs.append(FieldError("id", f"must be a sound id equal to its key {key!r}"))
    _text(errs, "gpu_model", spec.gpu_model)
    if isinstance(spec.gpu_count, bool) or not 1 <= spec.gpu_count <= MAX_GPUS_PER_NODE:
        errs.append(FieldError("gpu_count", f"must be 1-{MAX_GPUS_PER_NODE}"))
    _positive(errs, "gpu_mem_gb", spec.gpu_mem_gb, MAX_GPU_MEM_GB)
    _positive(errs, "host_mem_gb", spec.host_mem_gb, MAX_HOST_MEM_GB)
    _positive(errs, "cpus", spec.cpus, MAX_CPUS)
    if _number(errs, "max_power_w", spec.max_power_w, 0.0, MAX_POWER_W):
        _number(errs, "idle_power_w", spec.idle_power_w, 0.0, spec.max_power_w)
    if len(spec.labels) > MAX_LABELS:
        errs.append(FieldError("labels", f"at most {MAX_LABELS}"))
    for k, v in list(spec.labels.items())[:MAX_LABELS]:
        _text(errs, "labels", k)
        _text(errs, "labels", v, empty=True)
    return errs


def revalidate_allocation(
    alloc: Allocation, node: NodeSpec | None = None, *, key: str | None = None, prefix: str = ""
) -> list[FieldError]:
    """Every reason a ledger ``Allocation`` is unsound, on ``node`` when it is known (its GPU
    indices must exist there). The spec it carries is re-checked too. Memory is bounded, not
    held against the node's: a job that needs more than its GPU has fails there with an OOM,
    which is the executor's to report."""
    p = prefix
    errs = [FieldError(f"{p}spec.{e.field}", e.reason) for e in _spec_errors(alloc.spec)]
    spec_id = alloc.spec.id if alloc.spec is not None else alloc.job_id
    if not sound_id(alloc.job_id) or spec_id != alloc.job_id or key not in (None, alloc.job_id):
        errs.append(FieldError(f"{p}job_id", "must be a sound id, its spec's and its key"))
    if not sound_id(alloc.node) or (node is not None and node.id != alloc.node):
        errs.append(FieldError(f"{p}node", f"must be a sound node id, got {alloc.node[:64]!r}"))
    _number(errs, f"{p}gpu_share", alloc.gpu_share, MIN_GPU_FRACTION, 1.0)
    _number(errs, f"{p}gpu_mem_gb", alloc.gpu_mem_gb, 0.0, MAX_GPU_MEM_GB)
    _number(errs, f"{p}host_mem_gb", alloc.host_mem_gb, 0.0, MAX_HOST_MEM_GB)
    _number(errs, f"{p}cpus", alloc.cpus, 0.0, MAX_CPUS)
    _number(errs, f"{p}time", alloc.time, -math.inf, math.inf)
    idx, top = alloc.gpu_indices, node.gpu_count if node is not None else MAX_GPUS_PER_NODE
    if not idx or len(idx) > MAX_GPUS_PER_JOB:
        errs.append(FieldError(f"{p}gpu_indices", f"1-{MAX_GPUS_PER_JOB} GPUs"))
    elif any(not 0 <= i < top for i in idx) or len(set(idx)) != len(idx):
        errs.append(FieldError(f"{p}gpu_indices", f"must be distinct, 0-{top - 1}"))
    if not sound_attempt(alloc.attempt):
        errs.append(FieldError(f"{p}attempt", f"must be 1-{MAX_ATTEMPT}, got {alloc.attempt}"))
    if alloc.parts:
        errs += _parts_errors(alloc, p)
    return errs


def _parts_errors(alloc: Allocation, p: str) -> list[FieldError]:
    """A gang's parts (``proto.ledger.Part``): distinct sound nodes, the first this record's
    own, whole GPUs on each (their indices checked against the node where it is known)."""
    parts = alloc.parts
    first = parts[0]
    if (
        len(parts) > MAX_GPUS_PER_JOB
        or len({q.node for q in parts}) != len(parts)
        or (first.node, first.gpu_indices) != (alloc.node, alloc.gpu_indices)
        or alloc.gpu_share != 1.0
    ):
        return [FieldError(f"{p}parts", "distinct nodes of whole GPUs, the first this record's")]
    errs: list[FieldError] = []
    for k, q in enumerate(parts):
        if not sound_id(q.node):
            errs.append(FieldError(f"{p}parts[{k}].node", "must be a sound node id"))
        idx = q.gpu_indices
        if not idx or len(idx) > MAX_GPUS_PER_NODE or min(idx) < 0 or len(set(idx)) != len(idx):
            errs.append(FieldError(f"{p}parts[{k}].gpu_indices", "must be distinct, >= 0"))
        _number(errs, f"{p}parts[{k}].host_mem_gb", q.host_mem_gb, 0.0, MAX_HOST_MEM_GB)
        _number(errs, f"{p}parts[{k}].cpus", q.cpus, 0.0, MAX_CPUS)
    return errs


def revalidate_sample(sample: TelemetrySample, node: NodeSpec | None = None) -> list[FieldError]:
    """Every reason a ``telemetry.<node>`` sample is unsound (on ``node`` when known: one
    reading per GPU it has at most). A NaN or -300 degree reading must not steer placement."""
    errs: list[FieldError] = []
    if not sound_id(sample.node):
        errs.append(FieldError("node", "must be a sound node id"))
    _number(errs, "time", sample.time, -math.inf, math.inf)
    _text(errs, "backend", sample.backend)
    top = node.gpu_count if node is not None else MAX_GPUS_PER_NODE
    indices = [g.index for g in sample.gpus]
    if len(indices) > top or len(set(indices)) != len(indices):
        errs.append(FieldError("gpus", f"at most {top} distinct GPUs"))
        return errs
    for g in sample.gpus:
        if not 0 <= g.index < top:
            errs.append(FieldError("gpus.index", f"must be 0-{top - 1}, got {g.index}"))
        _number(errs, "gpus.util", g.util, 0.0, 1.0)
        _number(errs, "gpus.mem_used_gb", g.mem_used_gb, 0.0, MAX_GPU_MEM_GB)
        _number(errs, "gpus.temp_c", g.temp_c, *TEMP_C)
        _number(errs, "gpus.power_w", g.power_w, 0.0, MAX_POWER_W)
    return errs


def revalidate_report(report: ExecutorReport) -> list[FieldError]:
    """Every reason an ``executor.<node>`` report is unsound: an interval of NaN would keep a
    node from ever timing out, a listed attempt of 2^63 is no attempt anyone placed."""
    errs: list[FieldError] = []
    if not sound_id(report.node):
        errs.append(FieldError("node", "must be a sound node id"))
    _number(errs, "time", report.time, -math.inf, math.inf)
    _text(errs, "boot_id", report.boot_id)
    _positive(errs, "interval_s", report.interval_s, MAX_REPORT_INTERVAL_S)
    if len(report.running) > MAX_RUNNING:
        errs.append(FieldError("running", f"at most {MAX_RUNNING} attempts"))
    elif any(not sound_id(r.job_id) or not sound_attempt(r.attempt) for r in report.running):
        errs.append(FieldError("running", "each needs a sound job id and attempt"))
    power = report.power
    _number(errs, "power.since", power.since, -math.inf, math.inf)
    if power.ready_at is not None:
        _number(errs, "power.ready_at", power.ready_at, -math.inf, math.inf)
    if power.refused is not None:
        _number(errs, "power.refused.time", power.refused.time, -math.inf, math.inf)
        _text(errs, "power.refused.reason", power.refused.reason, empty=True)
    return errs


def revalidate_power_command(cmd: PowerCommand, node: str) -> list[FieldError]:
    """Every reason a ``node.<node>.power`` command is unsound: for another node, a NaN time,
    a reason past the text limit (it is logged and reported back)."""
    errs: list[FieldError] = []
    if cmd.node != node:
        errs.append(FieldError("node", f"must be {node!r}, the node it was sent to"))
    _number(errs, "time", cmd.time, -math.inf, math.inf)
    _text(errs, "reason", cmd.reason, empty=True)
    return errs
