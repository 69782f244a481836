"""Write this GPU node's ``NodeSpec``, read from NVML, for ``services.executor --node-spec @FILE``.

Why: on Kubernetes the node agents are DaemonSets, so their arguments cannot name a node or its
GPUs. Telemetry (``--backend nvml --node-id ID``) reads the node's shape from NVML and registers it
in KV ``nodes``; the executor needs the same node as a spec. This init container builds it with
the telemetry's own NVML reader, so both agents describe the node identically, whatever GPU model
the node pool has. The id comes from the Kubernetes node name (downward API ``NODE_NAME``) made
subject-safe the way telemetry does it: dots become dashes (``ip-10-0-0-1.ec2.internal`` ->
``ip-10-0-0-1-ec2-internal``); the telemetry container is given the same id.

    NODE_NAME=... python render_node_spec.py /etc/mosaic/node/node.json
"""

from __future__ import annotations

import os
import sys
from typing import Any

import msgspec

from proto.nodes import NodeSpec
from services.telemetry.backends import NvmlGpuBackend, NvmlUnavailable, node_id_from_host


def node_spec(k8s_node_name: str, nvml: Any = None) -> NodeSpec:
    """This machine's NodeSpec under the id derived from ``k8s_node_name``."""
    if not k8s_node_name.strip():
        raise ValueError("NODE_NAME is empty: set it from the downward API (spec.nodeName)")
    backend = NvmlGpuBackend(node_id_from_host(k8s_node_name.strip()), nvml=nvml)
    try:
        spec = backend.node_specs()[0]
    finally:
        backend.close()
    return spec


def main(argv: list[str], nvml: Any = None) -> int:
    if len(argv) != 1:
        print("usage: render_node_spec.py OUT.json  (reads NODE_NAME)", file=sys.stderr)
        return 2
    try:
        spec = node_spec(os.environ.get("NODE_NAME", ""), nvml=nvml)
    except (ValueError, NvmlUnavailable) as exc:
        print(f"render_node_spec: {exc}", file=sys.stderr)
        return 1
    with open(argv[0], "wb") as f:
        f.write(msgspec.json.encode(spec))
    print(f"render_node_spec: {spec.id}: {spec.gpu_count}x {spec.gpu_model} -> {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
