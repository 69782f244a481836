"""An independent checker of the LIFECYCLE stream: it trusts no service's bookkeeping.

It reads every lifecycle event in stream order straight from JetStream (nats-py, not
``libs.bus``), takes each job's spec from its Submitted event and each allocation from its
Placed event, frees it on Preempted / Completed / Failed / Cancelled, and after every event
checks each node against the cluster the test started (not against what services report):
GPU shares per GPU index <= 1, GPU memory per GPU index <= the GPU's memory, host memory <=
the node's. It also counts, per job, Submitted, terminal and Placed events.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import msgspec
import nats
from nats.js.errors import NotFoundError

from proto import subjects
from proto.events import (
    Cancelled,
    Completed,
    Failed,
    LifecycleEvent,
    Placed,
    Preempted,
    Submitted,
)
from proto.gpus import matches
from proto.jobs import JobSpec
from proto.nodes import NodeSpec

EPS = 1e-6
_TERMINAL = (Completed, Failed, Cancelled)


@dataclass
class _Held:
    node: str
    gpu_indices: tuple[int, ...]
    share: float
    gpu_mem_gb: float
    host_mem_gb: float


@dataclass
class Report:
    events: int = 0
    undecodable: list[str] = field(default_factory=list)  # subjects
    violations: list[str] = field(default_factory=list)
    submitted: Counter[str] = field(default_factory=Counter)
    terminal: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    placed: dict[str, list[tuple[str, int]]] = field(default_factory=lambda: defaultdict(list))
    preempted: Counter[str] = field(default_factory=Counter)
    specs: dict[str, JobSpec] = field(default_factory=dict)
    peak_gpus: dict[str, float] = field(default_factory=dict)

    def terminal_state(self, job_id: str) -> str | None:
        t = self.terminal.get(job_id)
        return t[0] if t else None


def check(events: list[tuple[str, bytes]], nodes: list[NodeSpec]) -> Report:
    """Replay ``(subject, data)`` in stream order; return what was seen and every violation."""
    by_id = {n.id: n for n in nodes}
    report = Report()
    held: dict[str, _Held] = {}
    shares: dict[str, list[float]] = {n.id: [0.0] * n.gpu_count for n in nodes}
    gmem: dict[str, list[float]] = {n.id: [0.0] * n.gpu_count for n in nodes}
    hmem: dict[str, float] = {n.id: 0.0 for n in nodes}

    def release(job_id: str) -> None:
        h = held.pop(job_id, None)
        if h is None:
            return
        for i in h.gpu_indices:
            shares[h.node][i] -= h.share
            gmem[h.node][i] -= h.gpu_mem_gb
        hmem[h.node] -= h.host_mem_gb

    for subject, data in events:
        report.events += 1
        try:
            ev: LifecycleEvent = msgspec.json.decode(data, type=LifecycleEvent)
        except (msgspec.DecodeError, msgspec.ValidationError):
            report.undecodable.append(subject)
            continue
        jid = ev.job_id
        if isinstance(ev, Submitted):
            report.submitted[jid] += 1
            report.specs.setdefault(jid, ev.spec)
        elif isinstance(ev, Placed):
            report.placed[jid].append((ev.node or "", ev.attempt))
            _place(ev, report, by_id, held, shares, gmem, hmem)
        elif isinstance(ev, Preempted):
            report.preempted[jid] += 1
            release(jid)
        elif isinstance(ev, _TERMINAL):
            report.terminal[jid].append(type(ev).__name__.lower())
            release(jid)
    return report


def _place(ev: Placed, report: Report, by_id, held, shares, gmem, hmem) -> None:  # type: ignore[no-untyped-def]
    jid, node_id = ev.job_id, ev.node or ""
    spec = report.specs.get(jid)
    node = by_id.get(node_id)
    where = f"event {report.events} ({jid} on {node_id})"
    if spec is None:
        report.violations.append(f"{where}: placed before it was submitted")
        return
    if node is None:
        report.violations.append(f"{where}: unknown node")
        return
    if report.terminal.get(jid):
        # the executor's terminal event may race the placer's Placed into the stream; the job
        # is over either way, so it holds nothing now
        return
    if jid in held:
        report.violations.append(f"{where}: placed again while still holding {held[jid].node}")
        return
    if spec.gpu_mem_gb > node.gpu_mem_gb + EPS:
        report.violations.append(
            f"{where}: {spec.gpu_mem_gb:g} GB per GPU on a {node.gpu_mem_gb:g} GB {node.gpu_model}"
        )
    if spec.constraints and not any(matches(c, node.gpu_model) for c in spec.constraints):
        report.violations.append(f"{where}: {node.gpu_model} not in {spec.constraints}")
    if any(not 0 <= i < node.gpu_count for i in ev.gpu_indices) or not ev.gpu_indices:
        report.violations.append(f"{where}: bad GPU indices {ev.gpu_indices}")
        return
    got = len(ev.gpu_indices) * ev.gpu_share
    lo = spec.elastic.min_gpus if spec.elastic else spec.gpus
    hi = spec.elastic.max_gpus if spec.elastic else spec.gpus
    if spec.gpus > node.gpu_count + EPS:
        # a gang (libs.policy.stages.gang): the Placed event names its leader's part only;
        # the other parts live in the ledger record (tests/e2e/test_gangs.py checks them)
        lo, hi = 1.0, float(node.gpu_count)
    if not lo - EPS <= got <= hi + EPS:
        report.violations.append(f"{where}: given {got:g} GPUs, asked {spec.gpus:g}")
    # gpu_mem_gb is per GPU, and for a fractional job already the memory of its share
    h = _Held(node_id, ev.gpu_indices, ev.gpu_share, spec.gpu_mem_gb, spec.host_mem_gb)
    held[jid] = h
    for i in h.gpu_indices:
        shares[node_id][i] += h.share
        gmem[node_id][i] += h.gpu_mem_gb
        if shares[node_id][i] > 1 + EPS:
            report.violations.append(f"{where}: GPU {i} shares {shares[node_id][i]:g} > 1")
        if gmem[node_id][i] > node.gpu_mem_gb + EPS:
            report.violations.append(
                f"{where}: GPU {i} memory {gmem[node_id][i]:g} > {node.gpu_mem_gb:g} GB"
            )
    hmem[node_id] += h.host_mem_gb
    if hmem[node_id] > node.host_mem_gb + EPS:
        report.violations.append(f"{where}: host memory {hmem[node_id]:g} > {node.host_mem_gb:g}")
    report.peak_gpus[node_id] = max(report.peak_gpus.get(node_id, 0.0), sum(shares[node_id]))


async def read_stream(
    nats_url: str, stream: str = subjects.STREAM_LIFECYCLE
) -> list[tuple[str, bytes]]:
    """Every message of ``stream`` in sequence order, as (subject, data)."""
    nc = await nats.connect(nats_url.split(","))  # a cluster: every server
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            return []
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(stream, seq)
            except NotFoundError:
                continue
            out.append((msg.subject, msg.data or b""))
        return out
    finally:
        await nc.close()
