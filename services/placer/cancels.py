"""Cancel requests (``jobs.cancel``), handled by the active placer only.

Why the placer: a pending job is cancelled by whoever owns the ledger (it must not be placed a
moment later), a running one by its executor (kill, then its ``Cancelled``). A running job whose
node then dies is in ``cancelling``: the reconciliation ends it as cancelled instead of
requeueing it. A mixin of ``Placer``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager

from opentelemetry.trace import Span

from libs.bus.connection import Bus
from libs.bus.refusals import refused
from libs.clock import Clock
from proto import subjects
from proto.commands import KillCommand
from proto.events import Cancelled
from proto.jobs import CancelRequest
from proto.ledger import Allocation
from proto.validation import FieldError, sound_id
from services.placer.tracker import JobTracker

MAX_REASON = 1024  # characters of a cancel's reason passed on (it must fit the events' limit)


class Cancels:
    bus: Bus
    clock: Clock
    log: object
    ledger: dict[str, Allocation]
    tracker: JobTracker
    ended_here: set[str]
    cancelling: set[str]
    killed_in_cycle: set[str]
    _lock: asyncio.Lock
    _job_span: Callable[..., AbstractContextManager[Span]]  # services.placer.announce

    async def _on_cancel(self, req: CancelRequest) -> None:
        if refused(self.bus, "cancel", _errors(req), job=req.job_id[:64]):
            return  # no subject to answer on (``lifecycle.<job>``), or no such attempt
        async with self._lock:
            job = req.job_id
            if self.tracker.is_terminal(job) or job in self.ended_here:
                return
            alloc = self.ledger.get(job)
            attrs = {"job": job, "running": alloc is not None}
            with self._job_span("placer.cancel", job, attrs):  # in the job's trace
                await self._cancel(req, alloc)

    async def _cancel(self, req: CancelRequest, alloc: Allocation | None) -> None:
        job = req.job_id
        if alloc is not None:  # the executor stops it and answers Cancelled
            self.cancelling.add(job)
            self.killed_in_cycle.add(job)  # services.placer.stepping waits for its answer
            await self.bus.publish(
                subjects.node_command(alloc.node, "kill"),
                KillCommand(job_id=job, reason=req.reason[:MAX_REASON]),
                msg_id=f"kill-{job}-{alloc.attempt}",
            )
            self.log.info("cancel_running", job=job, node=alloc.node)
            return
        if job not in self.tracker.specs:
            self.log.warning("cancel_unknown_job", job=job)
        await self.bus.publish(
            subjects.lifecycle(job),
            Cancelled(job_id=job, time=self.clock.now(), reason=req.reason[:MAX_REASON]),
            msg_id=f"cancelled-{job}",
        )
        self.ended_here.add(job)
        self.log.info("cancel_pending", job=job)


def _errors(req: CancelRequest) -> list[FieldError]:
    """A cancel the placer can act on names a sound job id: it becomes the subject of the
    ``Cancelled`` event (``lifecycle.a b`` is no subject NATS takes)."""
    return [] if sound_id(req.job_id) else [FieldError("job_id", "must be a sound job id")]
