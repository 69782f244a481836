"""Cancel requests (``jobs.cancel``), handled by the active placer only.

Why the placer: a pending job is cancelled by whoever owns the ledger (it must not be placed a
moment later), a running one by its executor (kill, then its ``Cancelled``). A running job whose
node then dies is in ``cancelling``: the reconciliation ends it as cancelled instead of
requeueing it. A mixin of ``Placer``.
"""

from __future__ import annotations

import asyncio

from libs.bus.connection import Bus
from libs.clock import Clock
from proto import subjects
from proto.commands import KillCommand
from proto.events import Cancelled
from proto.jobs import CancelRequest
from proto.ledger import Allocation
from services.placer.tracker import JobTracker


class Cancels:
    bus: Bus
    clock: Clock
    log: object
    ledger: dict[str, Allocation]
    tracker: JobTracker
    ended_here: set[str]
    cancelling: set[str]
    _lock: asyncio.Lock

    async def _on_cancel(self, req: CancelRequest) -> None:
        async with self._lock:
            job = req.job_id
            if self.tracker.is_terminal(job) or job in self.ended_here:
                return
            alloc = self.ledger.get(job)
            if alloc is not None:  # the executor stops it and answers Cancelled
                self.cancelling.add(job)
                await self.bus.publish(
                    subjects.node_command(alloc.node, "kill"),
                    KillCommand(job_id=job, reason=req.reason),
                    msg_id=f"kill-{job}-{alloc.attempt}",
                )
                self.log.info("cancel_running", job=job, node=alloc.node)
                return
            if job not in self.tracker.specs:
                self.log.warning("cancel_unknown_job", job=job)
            await self.bus.publish(
                subjects.lifecycle(job),
                Cancelled(job_id=job, time=self.clock.now(), reason=req.reason),
                msg_id=f"cancelled-{job}",
            )
            self.ended_here.add(job)
            self.log.info("cancel_pending", job=job)
