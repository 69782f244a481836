"""``--node-spec JSON_OR_@FILE``: the node(s) a per-node service (executor, telemetry) hosts.

Shared here because both services take the same flag and ``mosaic up`` passes the same value to
both. Accepted: a NodeSpec JSON object, a JSON list of them, or ``@path`` to a file holding either
or a cluster file (``libs.policy_io.cluster_file`` format, with ``groups``/``nodes``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from proto.nodes import NodeSpec

_BAD_ID_CHARS = ". *>"


def parse_node_specs(value: str) -> list[NodeSpec]:
    """Parse one ``--node-spec`` value; ValueError naming the problem on bad input."""
    text: str | bytes = value
    where = "--node-spec"
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"--node-spec: cannot read {path}: {exc.strerror}") from None
        where = f"--node-spec {path}"
    try:
        raw = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ValueError(f"{where}: not valid JSON: {exc}") from None
    try:
        if isinstance(raw, dict) and ("groups" in raw or "nodes" in raw):
            from libs.policy_io.cluster_file import load_cluster_file

            nodes = load_cluster_file(msgspec.json.encode(raw))
        elif isinstance(raw, list):
            nodes = [msgspec.convert(item, NodeSpec) for item in raw]
        else:
            nodes = [msgspec.convert(raw, NodeSpec)]
    except msgspec.ValidationError as exc:
        raise ValueError(f"{where}: {exc}") from None
    for n in nodes:
        if not n.id or any(c in n.id for c in _BAD_ID_CHARS):
            raise ValueError(f"{where}: node id {n.id!r} must be non-empty without '.', '*', '>'")
        if n.gpu_count < 0 or n.gpu_mem_gb <= 0:
            raise ValueError(f"{where}: node {n.id!r} needs gpu_count >= 0 and gpu_mem_gb > 0")
    return nodes


def node_specs_from_args(values: list[str] | None) -> list[NodeSpec]:
    """Every node of every ``--node-spec``; ids must be unique."""
    nodes = [n for v in values or [] for n in parse_node_specs(v)]
    ids = [n.id for n in nodes]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"--node-spec: node ids given more than once: {', '.join(dup)}")
    return nodes


def add_node_spec_arg(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--node-spec",
        action="append",
        required=required,
        metavar="JSON_OR_@FILE",
        help="a NodeSpec JSON object or list, or @file (also a cluster file); repeatable",
    )
