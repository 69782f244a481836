"""What a node's executor says about itself on ``executor.<node>``: the attempts it runs and the
node's power state (``proto.nodes.ExecutorReport``). A mixin of ``NodeExecutor``.

Why one report for both: the placer reconciles its ledger with the attempts and folds the
power state from the same message (``services.placer.power.NodePower``); a reader that keeps
the latest report per node has both, consistent with each other.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from libs.bus import Bus
from libs.clock import Clock
from proto import subjects
from proto.nodes import ExecutorReport, NodeSpec, RunningAttempt

REPORT_INTERVAL_S = 5.0


class Reports:
    bus: Bus
    node: NodeSpec
    clock: Clock
    boot_id: str
    report_interval_s: float
    running: dict[str, Any]  # job id -> RunningJob
    ending: dict[str, Any]  # job id -> Entry
    power: Any  # NodePowerControl
    log: Any
    _report_now: asyncio.Event

    def report(self) -> ExecutorReport:
        """What runs now: every attempt between its start and the moment its end is published
        (an attempt whose terminal event is still being published is listed, without a pid)."""
        entries = {job.entry.job_id: job.entry for job in self.running.values()}
        for job_id, entry in self.ending.items():
            entries.setdefault(job_id, entry)
        running = tuple(
            RunningAttempt(
                job_id=e.job_id,
                attempt=e.attempt,
                pid=e.launch.pid
                if e.job_id in self.running and e.launch and e.launch.pid > 0
                else None,
            )
            for e in sorted(entries.values(), key=lambda e: e.job_id)
        )
        return ExecutorReport(
            node=self.node.id,
            time=self.clock.now(),
            boot_id=self.boot_id,
            interval_s=self.report_interval_s,
            running=running,
            power=self.power.state,
        )

    async def publish_report(self) -> None:
        """One report now, flushed to the server: before a suspend hook takes the machine down,
        the placer must have heard ``suspending`` (or it would take the silence for a fault)."""
        try:
            await self.bus.publish(
                subjects.executor_report(self.node.id), self.report(), durable=False
            )
            await self.bus.nc.flush(timeout=2)
        except Exception as exc:  # a failed publish is retried by the next report
            self.log.warning("report_failed", error=repr(exc))

    async def _report_loop(self) -> None:
        """Plain NATS (the latest report wins)."""
        while True:
            self._report_now.clear()
            await self.publish_report()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._report_now.wait(), self.report_interval_s)
