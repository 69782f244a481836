"""An independent checker of the ledger: follows KV ``ledger`` and, after every change, proves
that no node holds more GPU share, GPU memory or host memory than it has."""

from __future__ import annotations

from collections import defaultdict

from libs.bus import Bus
from proto import subjects
from proto.ledger import Allocation
from proto.nodes import NodeSpec

EPS = 1e-6


def violations(ledger: dict[str, Allocation], nodes: dict[str, NodeSpec]) -> list[str]:
    out: list[str] = []
    share: dict[tuple[str, int], float] = defaultdict(float)
    mem: dict[tuple[str, int], float] = defaultdict(float)
    host: dict[str, float] = defaultdict(float)
    for a in ledger.values():
        node = nodes.get(a.node)
        if node is None:
            out.append(f"{a.job_id}: unknown node {a.node}")
            continue
        for g in a.gpu_indices:
            if not 0 <= g < node.gpu_count:
                out.append(f"{a.job_id}: GPU {g} not on {a.node}")
            share[(a.node, g)] += a.gpu_share
            mem[(a.node, g)] += a.gpu_mem_gb
        host[a.node] += a.host_mem_gb
    for (n, g), v in share.items():
        if v > 1 + EPS:
            out.append(f"{n} GPU {g}: share {v}")
        if mem[(n, g)] > nodes[n].gpu_mem_gb + EPS:
            out.append(f"{n} GPU {g}: {mem[(n, g)]} GB > {nodes[n].gpu_mem_gb}")
    for n, v in host.items():
        if v > nodes[n].host_mem_gb + EPS:
            out.append(f"{n}: host {v} GB > {nodes[n].host_mem_gb}")
    return out


class LedgerChecker:
    def __init__(self, nodes: list[NodeSpec]) -> None:
        self.nodes = {n.id: n for n in nodes}
        self.ledger: dict[str, Allocation] = {}
        self.problems: list[str] = []
        self.changes = 0
        self.peak = 0

    async def start(self, bus: Bus) -> None:
        kv = await bus.kv(subjects.KV_LEDGER, Allocation)
        await kv.watch(self._on_change)

    async def _on_change(self, key: str, value: Allocation | None) -> None:
        self.changes += 1
        if value is None:
            self.ledger.pop(key, None)
        else:
            self.ledger[key] = value
        self.peak = max(self.peak, len(self.ledger))
        self.problems += violations(self.ledger, self.nodes)
