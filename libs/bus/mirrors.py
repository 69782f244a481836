"""Read-only mirrors of the ``nodes`` and ``ledger`` KV buckets, each value revalidated.

Why one definition: the scorer, the defragmenter and the thermal guard each follow what nodes
exist and what runs where, and each must treat a value from the bus as untrusted (rule 6): a
node spec or an allocation that does not revalidate is refused (counted and logged by
``libs.bus.refusals``) and treated as absent. One watch per bucket delivers the current values
and then every change: a snapshot followed by a separate watch would miss a key deleted in
between.
"""

from __future__ import annotations

from typing import Any

from libs.bus.refusals import refused
from proto import subjects
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from proto.validation_records import revalidate_allocation, revalidate_node_spec


class ClusterMirror:
    """``nodes``: node id -> NodeSpec; ``ledger``: job id -> Allocation, kept by KV watches."""

    def __init__(self, bus: Any) -> None:
        self.bus = bus
        self.nodes: dict[str, NodeSpec] = {}
        self.ledger: dict[str, Allocation] = {}

    async def start(self) -> None:
        nodes_kv = await self.bus.kv(subjects.KV_NODES, NodeSpec)
        ledger_kv = await self.bus.kv(subjects.KV_LEDGER, Allocation)
        await nodes_kv.watch(self.on_node)
        await ledger_kv.watch(self.on_alloc)

    async def on_node(self, key: str, value: NodeSpec | None) -> None:
        if value is None or refused(self.bus, "node", revalidate_node_spec(value, key), key=key):
            self.nodes.pop(key, None)
        else:
            self.nodes[key] = value

    async def on_alloc(self, key: str, value: Allocation | None) -> None:
        errs = [] if value is None else revalidate_allocation(value)
        if value is None or refused(self.bus, "allocation", errs, key=key):
            self.ledger.pop(key, None)
        else:
            self.ledger[key] = value
