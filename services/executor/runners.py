"""How a job actually runs: simulated (sleep on the Mosaic clock) or as a local subprocess.

A runner only runs; it knows nothing of NATS. It returns an ``Outcome`` or is cancelled (kill,
checkpoint), so the executor decides which lifecycle event to publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from libs.clock import Clock
from proto.commands import RunCommand
from proto.nodes import NodeSpec

OOM_AFTER_S = 30.0  # Mosaic seconds before a simulated out-of-memory failure shows up
KILL_GRACE_S = 10.0  # wall seconds between SIGTERM and SIGKILL of a local job


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str = ""


class Runner(Protocol):
    async def run(self, cmd: RunCommand, node: NodeSpec) -> Outcome: ...


def job_mem_gb(cmd: RunCommand) -> float:
    """Per-GPU memory the job needs: its spec when present, else what was allocated."""
    spec = cmd.allocation.spec
    return spec.gpu_mem_gb if spec is not None else cmd.allocation.gpu_mem_gb


def oom_reason(cmd: RunCommand, node: NodeSpec) -> str | None:
    need = job_mem_gb(cmd)
    if need > node.gpu_mem_gb:
        return f"OOM: job needs {need:g} GB per GPU, {node.gpu_model} has {node.gpu_mem_gb:g} GB"
    return None


class SimRunner:
    """Sleeps ``runtime_s × (1 − progress)`` Mosaic seconds; an over-memory job fails early."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def run(self, cmd: RunCommand, node: NodeSpec) -> Outcome:
        remaining_s = max(0.0, cmd.runtime_s * (1.0 - cmd.progress))
        reason = oom_reason(cmd, node)
        if reason is not None:
            await self.clock.sleep(min(OOM_AFTER_S, remaining_s))
            return Outcome(False, reason)
        await self.clock.sleep(remaining_s)
        return Outcome(True)


class LocalRunner:
    """Runs ``spec.command`` in a shell with ``CUDA_VISIBLE_DEVICES`` = the allocated GPUs.

    Output goes to ``<log_dir>/<job>-<attempt>.log``; a non-zero exit fails the job with the last
    line of that log in the reason. Cancellation (kill, checkpoint, shutdown) terminates the
    process group: SIGTERM, then SIGKILL after ``KILL_GRACE_S``.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir

    async def run(self, cmd: RunCommand, node: NodeSpec) -> Outcome:
        alloc = cmd.allocation
        spec = alloc.spec
        if spec is None or not spec.command:
            return Outcome(False, "local mode: the job has no command to run")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{alloc.job_id}-{alloc.attempt}.log"
        env = dict(os.environ)
        env.update(
            CUDA_VISIBLE_DEVICES=",".join(str(i) for i in alloc.gpu_indices),
            MOSAIC_JOB_ID=alloc.job_id,
            MOSAIC_ATTEMPT=str(alloc.attempt),
            MOSAIC_PROGRESS=repr(cmd.progress),
            MOSAIC_NODE=node.id,
        )
        with open(log_path, "ab") as log:
            proc = await asyncio.create_subprocess_shell(
                spec.command,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group, so we can stop all of it
            )
            try:
                rc = await proc.wait()
            except asyncio.CancelledError:
                await _terminate(proc)
                raise
        if rc == 0:
            return Outcome(True)
        return Outcome(False, f"exit code {rc}: {_last_line(log_path)}".rstrip(": "))


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), KILL_GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


def _last_line(path: Path, max_chars: int = 300) -> str:
    try:
        lines = path.read_bytes()[-4096:].decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:max_chars] if lines else ""
