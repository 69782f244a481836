"""The gateway's read model of nodes: specs (KV ``nodes``), allocations (KV ``ledger``), cordons
(KV ``cordons``), the latest telemetry sample per node and the power state of each node's latest
executor report (``executor.<node>``), combined into ``NodeView`` records.

Why several sources: each fact has one writer (rule 2) - a node's telemetry service owns its spec
and samples, the placer the ledger, the gateway's API the cordons - so the gateway listens and
joins them here. A node is cordoned when its record or a label says so (``proto.cordons``). Pure:
the service feeds it KV watch updates and samples; nothing here touches NATS.
"""

from __future__ import annotations

from collections.abc import Callable

from proto.cordons import CORDON_LABELS, Cordon, is_cordoned, label_reason
from proto.ledger import Allocation, node_allocations
from proto.nodes import ExecutorReport, NodeSpec, TelemetrySample
from proto.power import PowerState
from proto.validation import FieldError
from proto.validation_records import (
    revalidate_allocation,
    revalidate_node_spec,
    revalidate_report,
    revalidate_sample,
)
from proto.views import NodeView

MAX_AHEAD_S = 3600.0  # a sample's time may be this far ahead of the reader's clock (skew)
# (record kind, reasons) -> True when the record is to be ignored; the service counts and logs
Refuse = Callable[[str, list[FieldError]], bool]

__all__ = ["CORDON_LABELS", "NodesModel", "is_cordoned"]  # the label rules live in proto


class NodesModel:
    """Node id -> spec, job id -> allocation, node id -> latest sample.

    Each record is re-checked (``proto.validation_records``): an unsound one counts as absent,
    as one that does not decode would (a node of 10^9 GPUs made the dashboard answer 500), and
    goes to ``refuse``."""

    def __init__(self, refuse: Refuse | None = None) -> None:
        self.refuse: Refuse = refuse or (lambda _record, errors: bool(errors))
        self.specs: dict[str, NodeSpec] = {}
        self.ledger: dict[str, Allocation] = {}
        self.samples: dict[str, TelemetrySample] = {}
        self.cordons: dict[str, Cordon] = {}  # KV ``cordons``: the operator's (issue 13)
        self.power: dict[str, PowerState] = {}
        self._report_at: dict[str, tuple[str, float]] = {}  # node -> (boot id, time)

    def put_spec(self, node_id: str, spec: NodeSpec | None) -> None:
        """A KV ``nodes`` update; None = deleted."""
        if spec is None or self.refuse("node", revalidate_node_spec(spec, node_id)):
            self.specs.pop(node_id, None)
        else:
            self.specs[node_id] = spec

    def put_allocation(self, job_id: str, alloc: Allocation | None) -> None:
        """A KV ``ledger`` update; None = the allocation was freed."""
        node = None if alloc is None else self.specs.get(alloc.node)
        if alloc is None or self.refuse("allocation", revalidate_allocation(alloc, node)):
            self.ledger.pop(job_id, None)
        else:
            self.ledger[job_id] = alloc

    def put_cordon(self, node_id: str, cordon: Cordon | None) -> None:
        """A KV ``cordons`` update; None = uncordoned. Kept for a node not (yet) in KV
        ``nodes`` too: the cordon applies once the node appears."""
        if cordon is None:
            self.cordons.pop(node_id, None)
        else:
            self.cordons[node_id] = cordon

    def put_sample(self, sample: TelemetrySample, now: float | None = None) -> None:
        """Latest sample wins; an older one arriving late is ignored, and so is one of a node
        not in KV ``nodes``. One dated more than ``MAX_AHEAD_S`` after ``now`` (the Mosaic
        clock) is refused: it would hide every real sample after it for good."""
        node = self.specs.get(sample.node)
        errors = revalidate_sample(sample, node) if node is not None else []
        if now is not None and sample.time > now + MAX_AHEAD_S:
            errors.append(FieldError("time", f"more than {MAX_AHEAD_S:g} s ahead"))
        if node is None or self.refuse("telemetry", errors):
            return
        old = self.samples.get(sample.node)
        if old is None or sample.time >= old.time:
            self.samples[sample.node] = sample

    def cordon_reason(self, spec: NodeSpec) -> str:
        """The operator's reason (or that they gave none), else the label's; "" when neither."""
        if (c := self.cordons.get(spec.id)) is not None:
            return c.reason or f"cordoned by {c.by}"
        return label_reason(spec)

    def put_report(self, report: ExecutorReport) -> None:
        """An executor report: keep its power state (the executor owns it). A late, older
        report of the same executor boot is ignored; a new boot's is taken as it is."""
        if self.refuse("report", revalidate_report(report)):
            return
        last = self._report_at.get(report.node)
        if last is not None and last[0] == report.boot_id and report.time < last[1]:
            return
        self._report_at[report.node] = (report.boot_id, report.time)
        self.power[report.node] = report.power

    def cluster(self) -> list[NodeSpec]:
        return [self.specs[k] for k in sorted(self.specs)]

    def views(self) -> list[NodeView]:
        """One view per known node, by id. Allocations on an unknown node are not shown."""
        by_node: dict[str, list[Allocation]] = {}
        for entry in self.ledger.values():
            for alloc in node_allocations(entry):  # a gang shows on each of its nodes
                by_node.setdefault(alloc.node, []).append(alloc)
        out = []
        for spec in self.cluster():
            allocs = sorted(by_node.get(spec.id, ()), key=lambda a: a.job_id)
            out.append(
                NodeView(
                    spec=spec,
                    gpus_allocated=sum(len(a.gpu_indices) * a.gpu_share for a in allocs),
                    gpu_mem_allocated_gb=sum(len(a.gpu_indices) * a.gpu_mem_gb for a in allocs),
                    host_mem_allocated_gb=sum(a.host_mem_gb for a in allocs),
                    jobs=tuple(a.job_id for a in allocs),
                    cordoned=spec.id in self.cordons or is_cordoned(spec),
                    cordon_reason=self.cordon_reason(spec),
                    telemetry=self.samples.get(spec.id),
                    power=self.power.get(spec.id, PowerState()),
                )
            )
        return out
