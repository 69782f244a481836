"""Checkpoint-preemption, the executor's side: ``node.<node>.checkpoint`` → the job saves and
gives its GPUs back → ``Checkpointed(progress)`` then ``Preempted(attempt)``. A mixin of
``NodeExecutor``.

Why the events come only when the checkpoint is done, not when it is asked for: until then
the job still holds its GPUs (a process saving its state; a simulated job paying its
``cost_s``), so the placer must not hand them to anyone. The attempt stays in ``running``
(and so in the node's reports) the whole time.

- Local mode: the job's process group gets its ``checkpoint_signal`` and has
  ``checkpoint_grace_s`` wall seconds to save and exit; then SIGTERM, then SIGKILL (the kill
  grace). The progress kept is the job's last reported one (its progress file,
  ``services.executor.progress``); a job that reported none gets the elapsed-time estimate.
  The ``Checkpointed`` reason says which.
- Simulated mode: the checkpoint costs ``cost_s`` Mosaic seconds (the command's, else the
  executor's ``--checkpoint-cost-s``), a timer on the executor's clock that the stepped clock
  honours (``SimRunner.deadline`` names its end to ``stepping.next_due``); the progress is the
  elapsed-time estimate at the request.

Crash safety: the checkpoint (reason, request time, end time, estimate, signal, grace) is
journaled before its command is acked. A restarted executor finishes it: a simulated one
waits for what is left of the cost, a local one sends the signal again if the job still runs
within its grace (so a crash between the journal and the signal loses nothing), waits, and
reads the same progress file. It never runs the attempt on, and never starts it again.

A job that reported its whole work done (progress 1) and exited 0 after the signal is
``Completed``, not preempted: running it again would run it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from proto import subjects
from proto.commands import CheckpointCommand
from proto.events import Checkpointed, Completed, LifecycleEvent, Preempted
from proto.nodes import NodeSpec
from proto.validation import describe, revalidate_checkpoint_command
from services.executor.journal import Checkpoint, Entry
from services.executor.progress import describe as describe_report
from services.executor.runners import CheckpointEnd, energy_kwh


def default_checkpoint_cost_s() -> float:
    """The policy's checkpoint cost (Mosaic seconds), so a live simulated node pays what the
    simulator charges a move (``PreemptConfig.checkpoint_cost_s``, 30 s)."""
    from libs.policy.config import PolicyConfig

    return PolicyConfig.default().preempt.checkpoint_cost_s


MAX_PROGRESS = 0.999  # a resumed attempt always has something left to run


def estimate_progress(entry: Entry, now: float) -> float:
    """The fraction done by ``now`` if the attempt went at the speed ``runtime_s`` says."""
    cmd = entry.cmd
    done = (now - entry.started_at) / cmd.runtime_s if cmd.runtime_s > 0 else 0.0
    return min(MAX_PROGRESS, cmd.progress + max(0.0, done))


def checkpoint_events(
    entry: Entry, end: CheckpointEnd, node: NodeSpec, now: float, *, local: bool
) -> tuple[LifecycleEvent, ...]:
    """What a finished checkpoint publishes (see the module docstring); ``local``: the job
    was a process (local mode), not a simulation."""
    ck = entry.checkpoint
    assert ck is not None
    at = end.time if end.time is not None else now
    same = {"job_id": entry.job_id, "time": at, "node": node.id}
    report = end.report
    done = report is not None and report.progress is not None and report.progress >= 1.0
    if done and end.status == 0:  # it was done: preempting it would run it again
        runtime_s = max(0.0, at - entry.started_at)
        energy = energy_kwh(node, entry.cmd, runtime_s)
        return (Completed(**same, runtime_s=runtime_s, energy_kwh=energy),)
    if report is not None and report.progress is not None:
        progress = min(MAX_PROGRESS, report.progress)
        how = f"progress reported by the job ({describe_report(report)})"
    else:
        progress = ck.estimate
        why = "the job reported none" if local else "simulated"
        how = f"progress estimated from elapsed time ({why})"
    if local and not end.in_grace:
        how += f"; no exit within its grace after {ck.signal}: stopped with SIGTERM/SIGKILL"
    elif end.status not in (None, 0):
        how += f"; the job exited with status {end.status}"
    return (
        Checkpointed(**same, reason=f"{ck.reason}: {how}", progress=progress),
        # the attempt (proto.events), and the size it waits again at when it was shrunk
        Preempted(**same, reason=ck.reason, attempt=entry.attempt, resize_gpus=ck.shrink_to),
    )


class Checkpoints:
    """The mixin: ``on_checkpoint`` (a command) and ``resume_checkpoint`` (a restart)."""

    bus: Any
    node: NodeSpec
    clock: Any
    log: Any
    runner: Any
    journal: Any
    running: dict[str, Any]  # job id -> RunningJob
    checkpoint_cost_s: float
    _report_now: asyncio.Event
    _finish: Callable[..., Awaitable[None]]
    _spawn: Callable[..., asyncio.Task[None]]
    _track: Callable[[Entry, asyncio.Task[None]], None]

    async def on_checkpoint(self, cmd: CheckpointCommand) -> None:
        """Journal the checkpoint (before the ack), stop the attempt's run and start the
        checkpoint in its place; a command for no running attempt, for another attempt, or
        for one already checkpointing changes nothing. Unsound: dead-lettered."""
        errors = revalidate_checkpoint_command(cmd)
        if errors:
            subject = subjects.node_command(self.node.id, "checkpoint")
            await self.bus.dead_letter(subject, msgspec.json.encode(cmd), describe(errors))
            return
        job = self.running.get(cmd.job_id)
        if job is None or cmd.attempt not in (None, job.entry.attempt):
            self.log.info("checkpoint_ignored", job_id=cmd.job_id, attempt=cmd.attempt)
            return
        if job.entry.checkpoint is not None:
            self.log.info("checkpoint_under_way", job_id=cmd.job_id)
            return
        entry = msgspec.structs.replace(job.entry, checkpoint=self._plan(job.entry, cmd))
        self.journal.put(entry)
        job.task.cancel()  # no await since the lookup: the run has not ended (see _run)
        self._track(entry, self._spawn(self._checkpoint(entry, job.task), f"ckpt:{cmd.job_id}"))
        self.log.info("checkpoint_started", job_id=cmd.job_id, attempt=entry.attempt)

    def _plan(self, entry: Entry, cmd: CheckpointCommand) -> Checkpoint:
        now = self.clock.now()
        spec = entry.cmd.allocation.spec
        cost_s = self.checkpoint_cost_s if cmd.cost_s is None else cmd.cost_s
        grace_s = spec.checkpoint_grace_s if spec is not None else 30.0
        return Checkpoint(
            reason=cmd.reason,
            requested_at=now,
            done_at=now + cost_s,
            estimate=estimate_progress(entry, now),
            signal=spec.checkpoint_signal if spec is not None else "SIGUSR1",
            grace_until=time.time() + grace_s,
            shrink_to=cmd.shrink_to,
        )

    def resume_checkpoint(self, entry: Entry) -> None:
        """A journaled checkpoint found by a restart: finish it (see the module docstring)."""
        self.log.info("checkpoint_resumed", job_id=entry.job_id, attempt=entry.attempt)
        self._track(entry, self._spawn(self._checkpoint(entry, None), f"ckpt:{entry.job_id}"))

    async def _checkpoint(self, entry: Entry, run: asyncio.Task[None] | None) -> None:
        if run is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await run
        try:
            end = await self.runner.checkpoint(entry)
        except asyncio.CancelledError:
            raise  # a kill while checkpointing: on_stop reports it
        except Exception:  # stopped all the same, and reported with the estimate
            self.log.exception("checkpoint_failed", job_id=entry.job_id)
            await self.runner.stop(entry)
            end = CheckpointEnd(in_grace=False)
        local = self.runner.outlives_executor
        events = checkpoint_events(entry, end, self.node, self.clock.now(), local=local)
        # no await between this pop and _finish marking the attempt ending (it is reported)
        self.running.pop(entry.job_id, None)
        self._report_now.set()
        await self._finish(entry, events)
