"""Helpers of the checkpoint tests: commands for node t4-0 with a full job spec."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from libs.bus import Bus
from proto import subjects
from proto.commands import CheckpointCommand, RunCommand
from proto.jobs import JobSpec
from proto.ledger import Allocation

NODE = "t4-0"


async def run(
    bus: Bus,
    spec: JobSpec,
    *,
    runtime_s: float = 60.0,
    attempt: int = 1,
    progress: float = 0.0,
) -> None:
    alloc = Allocation(
        job_id=spec.id,
        node=NODE,
        gpu_indices=(0,),
        gpu_share=1.0,
        gpu_mem_gb=spec.gpu_mem_gb,
        host_mem_gb=8,
        cpus=2,
        time=0.0,
        attempt=attempt,
        spec=spec,
    )
    cmd = RunCommand(allocation=alloc, runtime_s=runtime_s, progress=progress)
    await bus.publish(subjects.node_command(NODE, "run"), cmd, msg_id=f"run-{spec.id}-{attempt}")


async def checkpoint(bus: Bus, job_id: str, reason: str = "defrag", **fields: Any) -> None:
    cmd = CheckpointCommand(job_id=job_id, reason=reason, **fields)
    await bus.publish(subjects.node_command(NODE, "checkpoint"), cmd, msg_id=None)


def progress_record(work_root: Path, job_id: str, attempt: int) -> dict[str, Any] | None:
    try:
        return json.loads((work_root / f"{job_id}-{attempt}" / "mosaic-progress.json").read_text())
    except (OSError, ValueError):
        return None


async def until(cond: Callable[[], object], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)
