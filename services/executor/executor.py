"""One node's executor: consumes ``node.<node>.*``, turns commands into lifecycle events, and
reports what it runs on ``executor.<node>``.

Every lifecycle publish is durable with a ``Nats-Msg-Id`` of ``<event>-<job>-<attempt>``, so a
redelivered command or a retried publish never produces a second event.

No crash loses a job: every attempt is in the node's journal (``services.executor.journal``)
from before its run command is acked until after its terminal event is out. A restarted
executor re-adopts each entry before it consumes commands: a simulated run resumes for the
Mosaic time it had left, a local process (started in a session of its own, so a kill -9 of the
executor does not take it along) is polled until it exits and its status read from the file its
wrapper writes; a process that is gone without a status is reported Failed ("lost: …"), and
events that were about to go out are re-published (JetStream drops the repeats). A redelivered
run command for a journaled attempt is ignored, so no attempt runs twice. Every
``report_interval_s`` wall seconds, and at once after a start and after each job starts or
ends, an ``ExecutorReport`` lists the running attempts with this process's ``boot_id``, so the
placer can reconcile its ledger with what runs and notice a restart. A checkpoint command
(``services.executor.checkpoint``) replaces an attempt's run by its checkpoint, journaled
like the rest, and the attempt is reported until its ``Checkpointed``/``Preempted`` are out.

Known limits: an attempt whose journal file is unreadable, or a node whose state directory is
lost, is not re-adopted; it disappears from the node's reports and the placer's reconciliation
requeues it (a local process of it may still run). An attempt that ended leaves a tombstone
for a day (``journal.DONE_KEEP_S``), so a run command redelivered after a restart (its ack lost
in the crash) is ignored rather than run again. With a temporary state directory (no
``--state-dir``), nothing survives the process: a clean stop then terminates local jobs, as
nobody could re-adopt them.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec

from libs.bus import Bus, Consumer
from libs.bus.tasks import cancel_and_wait
from libs.clock import Clock
from proto import subjects
from proto.commands import CheckpointCommand, KillCommand, RunCommand
from proto.events import (
    Cancelled,
    Completed,
    Failed,
    LifecycleEvent,
    Started,
    event_type,
)
from proto.nodes import NodeSpec
from proto.power import PowerCommand
from proto.validation import describe, revalidate_command
from proto.validation_records import revalidate_allocation
from services.executor.checkpoint import Checkpoints, default_checkpoint_cost_s
from services.executor.gang import GangLink, GangParts
from services.executor.journal import Entry, Journal
from services.executor.power import (
    NodePowerControl,
    PowerHandling,
    PowerHooks,
    default_boot_s,
)
from services.executor.recovery import Recovery
from services.executor.reports import REPORT_INTERVAL_S, Reports
from services.executor.runners import Outcome, Runner, StartFailed, energy_kwh
from services.executor.spans import event_span, traced_run

COMMAND_TYPES = {
    "node.*.run": RunCommand,
    "node.*.kill": KillCommand,
    "node.*.checkpoint": CheckpointCommand,
    "node.*.power": PowerCommand,
}


@dataclass
class RunningJob:
    entry: Entry  # as journaled; ``entry.started_at`` is on the Mosaic clock
    task: asyncio.Task[None]


class NodeExecutor(Recovery, Reports, PowerHandling, Checkpoints, GangParts):
    """Runs the jobs of one node with ``runner``, journaled in ``journal``, and keeps its power
    state (``services.executor.power``; ``boot_s`` Mosaic seconds to wake, default the policy's
    ``resume_s``; ``power_hooks`` the operator's commands, none by default). Checkpoints:
    ``services.executor.checkpoint`` (``checkpoint_cost_s``: simulated mode's default cost,
    by default the policy's).

    ``keep_on_stop``: a clean stop leaves the running attempts to the next executor on the same
    journal (their processes go on); else (a temporary journal) it terminates local ones."""

    def __init__(
        self,
        bus: Bus,
        node: NodeSpec,
        runner: Runner,
        clock: Clock,
        log: Any = None,
        *,
        journal: Journal,
        report_interval_s: float = REPORT_INTERVAL_S,
        keep_on_stop: bool = True,
        boot_s: float | None = None,
        power_hooks: PowerHooks | None = None,
        checkpoint_cost_s: float | None = None,
    ) -> None:
        self.bus = bus
        self.node = node
        self.runner = runner
        self.clock = clock
        self.journal = journal
        self.report_interval_s = report_interval_s
        self.keep_on_stop = keep_on_stop
        self.checkpoint_cost_s = (
            default_checkpoint_cost_s() if checkpoint_cost_s is None else checkpoint_cost_s
        )
        self.boot_id = uuid.uuid4().hex  # fresh per start: the placer sees a restart by it
        self.log = (log or bus.log).bind(node=node.id)
        self.running: dict[str, RunningJob] = {}
        self.accepted: set[tuple[str, int]] = set()  # (job, attempt) runs already started
        self.ending: dict[str, Entry] = {}  # attempts whose terminal events are being published
        self.consumer: Consumer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._report_now = asyncio.Event()
        self.handled = 0  # commands handled and events published (the stepped clock's barrier)
        self._gang_links: dict[tuple[str, int], GangLink] = {}  # gang parts here (gang.py)
        self.power = NodePowerControl(
            node.id,
            clock,
            boot_s=default_boot_s() if boot_s is None else boot_s,
            hooks=power_hooks,
            changed=self._report_now.set,
            announce=self.publish_report,
            log=self.log,
        )

    @property
    def durable_name(self) -> str:
        return f"executor-{self.node.id}"

    async def start(self) -> None:
        """Re-adopt the journal, then report, then take commands: a redelivered run command
        must find its attempt already adopted."""
        await self.recover()
        self._spawn(self._report_loop(), "report")
        self.consumer = await self.bus.consume(
            subjects.STREAM_NODECMD,
            subjects.node_commands(self.node.id),
            COMMAND_TYPES,
            self.handle,
            durable=self.durable_name,
        )
        self.log.info("executor_ready", durable=self.durable_name, boot_id=self.boot_id)

    async def shutdown(self) -> None:
        """Stop consuming and reporting; leave running attempts to the next executor on this
        journal, or terminate them when nobody could re-adopt them (see ``keep_on_stop``)."""
        if self.consumer is not None:
            await self.consumer.stop()
        await self.power.close()
        jobs = list(self.running.values())
        self.running.clear()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            await cancel_and_wait(task)
        for job in jobs:
            if self.keep_on_stop:
                self.log.info("job_left_running", job_id=job.entry.job_id)
            else:
                self.log.warning("job_abandoned", job_id=job.entry.job_id)
        if not self.keep_on_stop:  # all at once: each may take its kill grace
            await asyncio.gather(*(self.runner.stop(j.entry) for j in jobs), return_exceptions=True)

    async def handle(
        self, cmd: RunCommand | KillCommand | CheckpointCommand | PowerCommand
    ) -> None:
        self.handled += 1
        if isinstance(cmd, PowerCommand):
            await self.on_power(cmd)
        elif isinstance(cmd, RunCommand):
            await self.on_run(cmd)
        elif isinstance(cmd, KillCommand) and cmd.silent:
            await self.on_stop_superseded(cmd.job_id, cmd.attempt)
        elif isinstance(cmd, KillCommand):
            await self.on_stop(cmd.job_id, cmd.reason)
        else:
            await self.on_checkpoint(cmd)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=f"{name}:{self.node.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _emit(self, event: LifecycleEvent, entry: Entry) -> None:
        """Durable publish in the attempt's span (``spans``), retried until NATS takes it."""
        if not self.speaks(entry):  # a gang's part other than its leader (gang.py)
            return
        msg_id, delay_s = f"{event_type(event)}-{event.job_id}-{entry.attempt}", 0.2
        with event_span(event, entry):
            while True:
                try:
                    await self.bus.publish(subjects.lifecycle(event.job_id), event, msg_id=msg_id)
                    self.handled += 1
                    self.log.info(event_type(event), job_id=event.job_id, attempt=entry.attempt)
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.log.warning("publish_retry", msg_id=msg_id, error=repr(exc))
                    await asyncio.sleep(delay_s)
                    delay_s = min(delay_s * 2, 5.0)

    async def on_run(self, cmd: RunCommand) -> None:
        alloc = cmd.allocation
        # dead-lettered, not Failed: see revalidate_command; and its GPUs must exist here
        errors = revalidate_command(cmd) or revalidate_allocation(
            alloc, self.node, prefix="allocation."
        )
        if alloc.node != self.node.id or errors:
            await self.bus.dead_letter(
                subjects.node_command(self.node.id, "run"),
                msgspec.json.encode(cmd),
                describe(errors) or f"allocation is for node {alloc.node!r}, not {self.node.id!r}",
            )
            return
        key = (alloc.job_id, alloc.attempt)
        current = self.running.get(alloc.job_id)
        if (
            key in self.accepted
            or (current is not None and current.entry.attempt >= alloc.attempt)
            or self.journal.is_done(alloc.job_id, alloc.attempt)
        ):
            self.log.info("run_ignored_duplicate", job_id=alloc.job_id, attempt=alloc.attempt)
            return
        entry = Entry(node=self.node.id, cmd=cmd, started_at=self.clock.now(), boot_id=self.boot_id)
        if not self.power.awake:
            await self._refuse_run(entry)
            return
        if current is not None:
            await self._supersede(current, alloc.attempt)
        self.journal.put(entry)  # before the ack (when this returns): a redelivery finds it
        self.accepted.add(key)
        if cmd.gang:  # a gang's part: it starts with its peers (gang.py)
            self.gang_start(entry)
            return
        await self._launch(entry)

    async def _supersede(self, job: RunningJob, attempt: int) -> None:
        """A newer attempt of a job still running here: the placer gave the old one up (it
        requeued it, e.g. while this executor was down), so the old one stops without an event
        of its own and the new one runs: the job still ends in exactly one terminal state."""
        entry = job.entry
        self.log.warning(
            "attempt_superseded", job_id=entry.job_id, attempt=entry.attempt, by_attempt=attempt
        )
        self.running.pop(entry.job_id, None)
        job.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await job.task
        await self.runner.stop(entry)
        self.journal.remove(entry.job_id, entry.attempt)
        self._report_now.set()

    async def _launch(self, entry: Entry) -> None:
        """Publish Started (with the journaled start time), start the attempt unless it was
        started before, journal that, and watch it until it ends."""
        if not entry.started_sent:
            started = Started(
                job_id=entry.job_id, time=entry.started_at, node=self.node.id, attempt=entry.attempt
            )
            await self._emit(started, entry)
        failure: str | None = None
        launch = entry.launch
        if launch is None and not entry.started_sent:
            try:
                rc_path = self.journal.rc_path(entry.job_id, entry.attempt)
                launch = await self.runner.start(entry, self.node, rc_path)
            except StartFailed as exc:
                failure = str(exc)
            except Exception as exc:
                self.log.exception("runner_start_failed", job_id=entry.job_id)
                failure = f"executor error: {exc!r}"
        entry = msgspec.structs.replace(entry, started_sent=True, launch=launch)
        try:
            self.journal.put(entry)
        except OSError as exc:  # it runs now: watch it; a restart finds a process by /proc
            self.log.error("journal_write_failed", job_id=entry.job_id, error=repr(exc))
        self._track(entry, self._spawn(self._run(entry, failure), f"job:{entry.job_id}"))

    def _track(self, entry: Entry, task: asyncio.Task[None]) -> None:
        """``task`` is what the attempt does now (runs, or checkpoints): a kill cancels it."""
        self.running[entry.job_id] = RunningJob(entry=entry, task=task)
        self._report_now.set()

    async def _run(self, entry: Entry, failure: str | None) -> None:
        if failure is not None:
            outcome = Outcome(False, failure)
        else:
            try:
                outcome = await traced_run(entry, self.runner.wait(entry, self.node))
            except asyncio.CancelledError:
                raise  # kill / checkpoint / shutdown: whoever cancelled reports it
            except Exception as exc:
                self.log.exception("runner_failed", job_id=entry.job_id)
                outcome = Outcome(False, f"executor error: {exc!r}")
        # no await between the runner's return and this pop: a kill sees either a running job
        # (and cancels it) or none (and does nothing), never both a Completed and a Cancelled
        self.running.pop(entry.job_id, None)
        self._report_now.set()
        now = self.clock.now() if outcome.time is None else outcome.time
        event: LifecycleEvent
        if outcome.ok:
            runtime_s = max(0.0, now - entry.started_at)
            event = Completed(
                job_id=entry.job_id,
                time=now,
                node=self.node.id,
                runtime_s=runtime_s,
                energy_kwh=energy_kwh(self.node, entry.cmd, runtime_s),
            )
        else:
            event = Failed(job_id=entry.job_id, time=now, node=self.node.id, reason=outcome.reason)
        await self._finish(entry, (event,))

    async def _finish(self, entry: Entry, events: tuple[LifecycleEvent, ...]) -> None:
        """Journal the events, publish them, then forget the attempt: a crash in between
        re-publishes the same events (same message ids) rather than running it again."""
        await self.gang_ended(entry, events)  # a gang's part: its peers end too (gang.py)
        try:
            self.journal.put(msgspec.structs.replace(entry, pending=events))
        except OSError as exc:  # publish anyway: an event out beats a journal kept
            self.log.error("journal_write_failed", job_id=entry.job_id, error=repr(exc))
        # reported until its events are out: while NATS is slow to take them (a stream
        # electing a leader), the placer must not think the attempt lost and run it again
        self.ending[entry.job_id] = entry
        try:
            for event in events:
                await self._emit(event, entry)
        finally:
            if self.ending.get(entry.job_id) is entry:
                del self.ending[entry.job_id]
            self._report_now.set()
        try:
            self.journal.remove(entry.job_id, entry.attempt)
        except OSError as exc:
            self.log.error("journal_remove_failed", job_id=entry.job_id, error=repr(exc))

    async def on_stop_superseded(self, job_id: str, attempt: int | None) -> None:
        """The placer requeued this attempt while it ran here unseen (this node was down, or
        this executor was, past the placer's grace): stop it without an event of its own."""
        job = self.running.get(job_id)
        if job is None or attempt is None or job.entry.attempt != attempt:
            self.log.info("stale_stop_ignored", job_id=job_id, attempt=attempt)
            return
        await self._supersede(job, attempt + 1)

    async def on_stop(self, job_id: str, reason: str) -> None:
        """A kill: the attempt (running or checkpointing) ends ``Cancelled``."""
        job = self.running.pop(job_id, None)
        if job is None:
            # finished already (its terminal event is out), or never ran here
            self.log.info("stop_ignored_not_running", job_id=job_id)
            return
        job.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await job.task
        entry = job.entry
        await self.runner.stop(entry)
        self._report_now.set()
        event = Cancelled(job_id=job_id, time=self.clock.now(), node=self.node.id, reason=reason)
        await self._finish(entry, (event,))
