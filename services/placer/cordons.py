"""Which nodes the placer must not place new work on: the operator's cordons and label cordons.

Why the placer only reads: the gateway owns KV ``cordons`` (``POST /v1/nodes/{id}/cordon``;
DESIGN rule 2), and a node's labels are its telemetry agent's. The placer folds both into the
``cordoned`` set of its cycle, where ``libs.policy`` filters those nodes out (``f_cordon``): a
job only a cordoned node could hold waits with the reason ``Cordoned`` instead of being refused
as never fitting, and lands there once the node is uncordoned. Jobs already running stay.

Why ``ids`` takes the nodes: the label half is read from the very specs the cycle plans with,
so a node that appears with a cordon label can never be seen by the cycle before its label is.

Wiring (``services.placer.service``)::

    cordons = Cordons(on_change=kick)     # kick: start a cycle now (an uncordon frees room)
    await cordons.start(bus)              # returns once the current cordons are in
    plan_cycle(..., cordoned=down | cordons.ids(nodes.values()))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from proto import subjects
from proto.cordons import Cordon, is_cordoned
from proto.nodes import NodeSpec


class Cordons:
    """Node id -> the operator's ``Cordon``, from the watch of KV ``cordons``; pure otherwise."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self.records: dict[str, Cordon] = {}
        self._on_change = on_change
        self._watch: Any = None

    async def start(self, bus: Any) -> Cordons:
        """Watch KV ``cordons`` (the current values first: this returns once they are in, so the
        first cycle after a restart already honours every cordon). Returns ``self``."""
        kv = await bus.kv(subjects.KV_CORDONS, Cordon)
        self._watch = await kv.watch(self._on_cordon)
        return self

    async def stop(self) -> None:
        if self._watch is not None:
            await self._watch.stop()
            self._watch = None

    async def _on_cordon(self, node_id: str, cordon: Cordon | None) -> None:
        self.put(node_id, cordon)

    def put(self, node_id: str, cordon: Cordon | None) -> None:
        """One KV update (None = uncordoned); the key, not the record's ``node``, names the
        node. Calls ``on_change`` when the set changed."""
        before = node_id in self.records
        if cordon is None:
            self.records.pop(node_id, None)
        else:
            self.records[node_id] = cordon
        if before != (node_id in self.records) and self._on_change is not None:
            self._on_change()

    def ids(self, nodes: Iterable[NodeSpec]) -> frozenset[str]:
        """Every cordoned node id: those with a record, and those of ``nodes`` a label cordons.
        A record of a node not in ``nodes`` is included (the cycle ignores unknown ids)."""
        return frozenset(self.records) | {n.id for n in nodes if is_cordoned(n)}
