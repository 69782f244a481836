"""Cluster files: ``mosaic up --cluster FILE`` and the simulator's ``--cluster FILE``, JSON with
``groups`` (``libs.policy.inventory.NodeGroup``, expanded into nodes) and/or ``nodes``
(``proto.nodes.NodeSpec``)."""

from __future__ import annotations

import msgspec

from libs.policy.inventory import NodeGroup, expand
from proto.nodes import NodeSpec


class ClusterFile(msgspec.Struct, frozen=True, kw_only=True):
    """``mosaic up --cluster FILE``: JSON with ``groups`` and/or ``nodes``."""

    groups: tuple[NodeGroup, ...] = ()
    nodes: tuple[NodeSpec, ...] = ()


def load_cluster_file(data: bytes | str) -> list[NodeSpec]:
    """Parse a cluster file (JSON). Node ids must be unique and subject-safe."""
    cf = msgspec.json.decode(data, type=ClusterFile)
    nodes = expand(cf.groups) + list(cf.nodes)
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ValueError("cluster file: node ids are not unique")
    for n in nodes:
        if not n.id or any(c in n.id for c in ". *>") or n.gpu_count < 0:
            raise ValueError(f"cluster file: bad node {n.id!r}")
    return nodes
