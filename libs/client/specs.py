"""From ``mosaic submit``'s flags to a ``JobSpec``, with deadlines on the stack's own clock.

Why apart from the CLI: the translation is pure (flags and a clock in, a spec out), so it is
unit-tested without a terminal or a gateway; the CLI only wires it to typer.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from libs.client import parse
from libs.clock import Clock
from proto.jobs import WORKLOAD_CLASSES, Elastic, JobSpec


class FlagError(ValueError):
    """A flag that does not parse; the message names the flag and what was expected."""


def build_spec(*, now, **f) -> JobSpec:  # type: ignore[no-untyped-def]
    """Flags -> JobSpec; a flag that does not parse is a FlagError naming it."""
    try:
        host_mem_gb = parse.parse_mem_gb(f["mem"])
        runtime_s = parse.parse_duration_s(f["runtime"])
        deadline = parse.parse_deadline(f["deadline"], now()) if f["deadline"] else None
        lo_hi = parse.parse_elastic(f["elastic"]) if f["elastic"] else None
    except ValueError as exc:
        raise FlagError(str(exc)) from None
    if f["workload_class"] not in WORKLOAD_CLASSES:
        raise FlagError(f"--class {f['workload_class']!r}: one of {', '.join(WORKLOAD_CLASSES)}")
    if f["kind"] not in ("training", "inference"):
        raise FlagError(f"--kind {f['kind']!r}: training or inference")
    return JobSpec(
        id=f["job_id"] or "",
        tenant=f["tenant"],
        priority=f["priority"],
        gpus=f["gpus"],
        gpu_mem_gb=f["gpu_mem"],
        host_mem_gb=host_mem_gb,
        cpus=f["cpus"],
        workload_class=f["workload_class"],
        constraints=parse.parse_list(f["constraint"]),
        deadline=deadline,
        energy_sensitivity=f["energy_sensitivity"],
        elastic=Elastic(*lo_hi) if lo_hi else None,
        checkpointable=f["checkpointable"],
        est_runtime_s=runtime_s,
        kind=f["kind"],
        command=f["command"],
        latency_p99_ms=f.get("latency_p99_ms"),
        solo_latency_p99_ms=f.get("solo_latency_p99_ms"),
    )


def server_now(gateway: str) -> float:
    """The Mosaic clock of the stack behind ``gateway``.

    The gateway is the authority: its ``/healthz`` says its ``now``. When it cannot be asked,
    the clock is rebuilt (scaled wall time, ``libs.clock``) from ``MOSAIC_CLOCK_EPOCH``/``FACTOR``
    when set, else from the ``stack.json`` that ``mosaic up`` writes for that gateway (default
    data dir ``.mosaic`` or ``MOSAIC_DATA_DIR``), else wall time (a production clock runs at 1x).
    """
    from libs.client.api import ClientError, MosaicClient

    try:
        now = MosaicClient(gateway).health().get("now")
        if isinstance(now, int | float):
            return float(now)
    except (ClientError, OSError, ValueError):
        pass
    if os.environ.get("MOSAIC_CLOCK_EPOCH"):
        return Clock.from_env().now()
    state = Path(os.environ.get("MOSAIC_DATA_DIR", ".mosaic")) / "stack.json"
    try:
        data = json.loads(state.read_text())
        if data.get("gateway_url", "").rstrip("/") == gateway.rstrip("/"):
            return Clock(float(data["clock_epoch"]), float(data["clock_factor"])).now()
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return time.time()
