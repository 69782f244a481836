"""How a job actually runs: simulated (sleep on the Mosaic clock) or as a local process
(``services.executor.local``).

A runner only runs; it knows nothing of NATS. ``start`` launches an attempt (``StartFailed`` when
it cannot), ``wait`` returns its ``Outcome`` and is also how a restarted executor resumes an
attempt it finds in its journal, ``stop`` ends it (kill), ``checkpoint`` saves and ends it (a
signal and a grace for a process, a cost in Mosaic time for a simulated run; see
``services.executor.checkpoint``); the executor decides which lifecycle event to publish.
Everything a runner needs to resume is in the journal ``Entry``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from libs.clock import Clock
from proto.commands import RunCommand
from proto.nodes import NodeSpec
from services.executor.journal import Entry, Launch
from services.executor.progress import JobProgress

OOM_AFTER_S = 30.0  # Mosaic seconds before a simulated out-of-memory failure shows up
# simulated mode: a node labelled with this runs every job at this speed x the reference GPU
# whatever the placer's profile says (issue 15: a cluster whose truth differs from the table,
# which the profiler must learn). Without it a job runs the runtime its run command says.
SIM_SPEED_LABEL = "mosaic/sim-speed"


def sim_runtime_s(cmd: RunCommand, node: NodeSpec) -> float:
    """The whole job's runtime on ``node`` in simulated mode (see ``SIM_SPEED_LABEL``)."""
    spec = cmd.allocation.spec
    try:
        speed = float(node.labels.get(SIM_SPEED_LABEL, "nan"))
    except ValueError:
        speed = float("nan")
    if spec is None or not (0.0 < speed < float("inf")):
        return cmd.runtime_s
    return spec.est_runtime_s / speed


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str = ""
    time: float | None = None  # when it ended, if the runner knows better than "now"


@dataclass(frozen=True)
class CheckpointEnd:
    """How a checkpoint ended: what the job reported last and how its process ended (local
    mode), or only when (simulated)."""

    report: JobProgress | None = None
    status: int | None = None  # the job's exit status (minus the signal), when known
    in_grace: bool = True  # it exited by itself within its grace (not by SIGTERM/SIGKILL)
    time: float | None = None  # when it was done, if the runner knows better than "now"


def energy_kwh(node: NodeSpec, cmd: RunCommand, runtime_s: float) -> float:
    """Estimate: every allocated GPU share at the node's max power for the whole run."""
    gpus = len(cmd.allocation.gpu_indices) * cmd.allocation.gpu_share
    return node.max_power_w * gpus * runtime_s / 3.6e6


class StartFailed(Exception):
    """The attempt cannot start (no command, no such user…); the message is the Failed reason."""


class Runner(Protocol):
    #: whether attempts go on by themselves while no executor watches them (local processes);
    #: a simulated run exists only while an executor sleeps through it
    outlives_executor: bool

    async def start(self, entry: Entry, node: NodeSpec, rc_path: Path) -> Launch | None: ...

    async def wait(self, entry: Entry, node: NodeSpec) -> Outcome: ...

    async def stop(self, entry: Entry) -> None: ...

    async def checkpoint(self, entry: Entry) -> CheckpointEnd: ...

    def adopt(self, entry: Entry, rc_path: Path) -> Entry: ...


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
    """Sleeps until ``started_at + runtime_s × (1 − progress)`` on the Mosaic clock; an
    over-memory job fails ``OOM_AFTER_S`` after its start.

    Deadlines are counted from the journaled start, not from when ``wait`` is called, so a
    restarted executor resuming the attempt ends it when an uninterrupted one would have."""

    outlives_executor = False

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def start(self, entry: Entry, node: NodeSpec, rc_path: Path) -> Launch | None:
        return None

    def deadline(self, entry: Entry, node: NodeSpec) -> float:
        """The Mosaic time the attempt ends (completes, fails out of memory, or is done
        checkpointing: the stepped clock's controller steps there, ``stepping.next_due``)."""
        if entry.checkpoint is not None:
            return entry.checkpoint.done_at
        cmd = entry.cmd
        remaining_s = max(0.0, sim_runtime_s(cmd, node) * (1.0 - cmd.progress))
        run_s = remaining_s if oom_reason(cmd, node) is None else min(OOM_AFTER_S, remaining_s)
        return entry.started_at + run_s

    async def wait(self, entry: Entry, node: NodeSpec) -> Outcome:
        """Sleep to the deadline. On a stepped clock the step that wakes it may be later than
        the deadline; the attempt is reported ended at its deadline, as the simulator has it."""
        end = self.deadline(entry, node)
        await self.clock.sleep(end - self.clock.now())
        at = end if self.clock.stepped else None
        reason = oom_reason(entry.cmd, node)
        return Outcome(True, time=at) if reason is None else Outcome(False, reason, time=at)

    async def stop(self, entry: Entry) -> None:
        return None

    async def checkpoint(self, entry: Entry) -> CheckpointEnd:
        """The checkpoint's cost: the job holds its GPUs until ``done_at`` on the Mosaic clock
        (on a stepped clock, reported done at ``done_at`` whatever step woke it)."""
        assert entry.checkpoint is not None
        done_at = entry.checkpoint.done_at
        await self.clock.sleep(done_at - self.clock.now())
        return CheckpointEnd(time=done_at if self.clock.stepped else None)

    def adopt(self, entry: Entry, rc_path: Path) -> Entry:
        return entry
