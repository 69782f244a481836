"""One node's executor: consumes ``node.<node>.*`` and turns commands into lifecycle events.

Every lifecycle publish is durable with a ``Nats-Msg-Id`` of ``<event>-<job>-<attempt>``, so a
redelivered command or a retried publish never produces a second event.

Known limit: running jobs live in this process only. If the executor restarts, their tasks are
gone and no terminal event is published for them (sim mode: the job is simply lost; local
mode: its process is terminated on a clean stop). Reconciling the ledger with what an executor
actually runs after a restart is a later step.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import msgspec

from libs.bus import Bus, Consumer
from libs.clock import Clock
from proto import subjects
from proto.commands import CheckpointCommand, KillCommand, RunCommand
from proto.events import (
    Cancelled,
    Checkpointed,
    Completed,
    Failed,
    LifecycleEvent,
    Preempted,
    Started,
    event_type,
)
from proto.nodes import NodeSpec
from proto.validation import describe, revalidate_command
from services.executor.runners import Outcome, Runner

COMMAND_TYPES = {
    "node.*.run": RunCommand,
    "node.*.kill": KillCommand,
    "node.*.checkpoint": CheckpointCommand,
}


def energy_kwh(node: NodeSpec, cmd: RunCommand, runtime_s: float) -> float:
    """Estimate: every allocated GPU share at the node's max power for the whole run."""
    gpus = len(cmd.allocation.gpu_indices) * cmd.allocation.gpu_share
    return node.max_power_w * gpus * runtime_s / 3.6e6


@dataclass
class RunningJob:
    cmd: RunCommand
    started_at: float  # Mosaic clock
    task: asyncio.Task[None]


class NodeExecutor:
    """Runs the jobs of one node with ``runner``. ``running`` and ``accepted`` are in memory."""

    def __init__(
        self, bus: Bus, node: NodeSpec, runner: Runner, clock: Clock, log: Any = None
    ) -> None:
        self.bus = bus
        self.node = node
        self.runner = runner
        self.clock = clock
        self.log = (log or bus.log).bind(node=node.id)
        self.running: dict[str, RunningJob] = {}
        self.accepted: set[tuple[str, int]] = set()  # (job, attempt) runs already started
        self.consumer: Consumer | None = None

    @property
    def durable_name(self) -> str:
        return f"executor-{self.node.id}"

    async def start(self) -> None:
        self.consumer = await self.bus.consume(
            subjects.STREAM_NODECMD,
            subjects.node_commands(self.node.id),
            COMMAND_TYPES,
            self.handle,
            durable=self.durable_name,
        )
        self.log.info("executor_ready", durable=self.durable_name)

    async def shutdown(self) -> None:
        """Stop consuming and abandon running jobs (see the module docstring)."""
        if self.consumer is not None:
            await self.consumer.stop()
        for job_id, job in list(self.running.items()):
            self.log.warning("job_abandoned", job_id=job_id)
            job.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job.task
        self.running.clear()

    async def handle(self, cmd: RunCommand | KillCommand | CheckpointCommand) -> None:
        if isinstance(cmd, RunCommand):
            await self.on_run(cmd)
        elif isinstance(cmd, KillCommand):
            await self.on_stop(cmd.job_id, cmd.reason, checkpoint=False)
        else:
            await self.on_stop(cmd.job_id, cmd.reason, checkpoint=True)

    async def _emit(self, event: LifecycleEvent, attempt: int) -> None:
        """Durable publish, retried until NATS takes it (nats-py reconnects meanwhile)."""
        msg_id = f"{event_type(event)}-{event.job_id}-{attempt}"
        delay_s = 0.2
        while True:
            try:
                await self.bus.publish(subjects.lifecycle(event.job_id), event, msg_id=msg_id)
                self.log.info(event_type(event), job_id=event.job_id, attempt=attempt)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.warning("publish_retry", msg_id=msg_id, error=repr(exc))
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 5.0)

    async def on_run(self, cmd: RunCommand) -> None:
        alloc = cmd.allocation
        errors = revalidate_command(cmd)  # dead-lettered, not Failed: see revalidate_command
        if alloc.node != self.node.id or errors:
            await self.bus.dead_letter(
                subjects.node_command(self.node.id, "run"),
                msgspec.json.encode(cmd),
                describe(errors) or f"allocation is for node {alloc.node!r}, not {self.node.id!r}",
            )
            return
        key = (alloc.job_id, alloc.attempt)
        if alloc.job_id in self.running or key in self.accepted:
            self.log.info("run_ignored_duplicate", job_id=alloc.job_id, attempt=alloc.attempt)
            return
        now = self.clock.now()
        started = Started(job_id=alloc.job_id, time=now, node=self.node.id, attempt=alloc.attempt)
        await self._emit(started, alloc.attempt)
        self.accepted.add(key)
        task = asyncio.create_task(self._run(cmd, now), name=f"job:{alloc.job_id}")
        self.running[alloc.job_id] = RunningJob(cmd=cmd, started_at=now, task=task)

    async def _run(self, cmd: RunCommand, started_at: float) -> None:
        alloc = cmd.allocation
        try:
            outcome = await self.runner.run(cmd, self.node)
        except asyncio.CancelledError:
            raise  # kill / checkpoint / shutdown: whoever cancelled reports it
        except Exception as exc:
            self.log.exception("runner_failed", job_id=alloc.job_id)
            outcome = Outcome(False, f"executor error: {exc!r}")
        # no await between the runner's return and this pop: a kill sees either a running job
        # (and cancels it) or none (and does nothing), never both a Completed and a Cancelled
        self.running.pop(alloc.job_id, None)
        now = self.clock.now()
        if outcome.ok:
            runtime_s = max(0.0, now - started_at)
            event: LifecycleEvent = Completed(
                job_id=alloc.job_id,
                time=now,
                node=self.node.id,
                runtime_s=runtime_s,
                energy_kwh=energy_kwh(self.node, cmd, runtime_s),
            )
        else:
            event = Failed(job_id=alloc.job_id, time=now, node=self.node.id, reason=outcome.reason)
        await self._emit(event, alloc.attempt)

    async def on_stop(self, job_id: str, reason: str, *, checkpoint: bool) -> None:
        job = self.running.pop(job_id, None)
        if job is None:
            # finished already (its terminal event is out), or never ran here
            self.log.info("stop_ignored_not_running", job_id=job_id, checkpoint=checkpoint)
            return
        job.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await job.task
        now = self.clock.now()
        attempt = job.cmd.allocation.attempt
        if checkpoint:
            done = (now - job.started_at) / job.cmd.runtime_s if job.cmd.runtime_s > 0 else 0.0
            progress = min(0.999, job.cmd.progress + done)
            await self._emit(
                Checkpointed(
                    job_id=job_id, time=now, node=self.node.id, reason=reason, progress=progress
                ),
                attempt,
            )
            await self._emit(
                Preempted(job_id=job_id, time=now, node=self.node.id, reason=reason), attempt
            )
        else:
            await self._emit(
                Cancelled(job_id=job_id, time=now, node=self.node.id, reason=reason), attempt
            )
