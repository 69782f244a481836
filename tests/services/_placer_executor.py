"""A tiny stand-in for the executor: answers ``node.*.run`` with Started, then Completed after a
short wall time; ``node.*.kill`` with Cancelled. Duplicated run commands (same job and attempt)
are ignored and counted, as the real executor does. Jobs listed in ``hold`` run until killed."""

from __future__ import annotations

import asyncio
import contextlib

from libs.bus import Bus
from proto import subjects
from proto.commands import KillCommand, RunCommand
from proto.events import Cancelled, Completed, Started


class FakeExecutor:
    def __init__(self, bus: Bus, run_s: float = 0.3, hold: set[str] | None = None) -> None:
        self.bus = bus
        self.run_s = run_s
        self.hold = hold or set()
        self.runs: list[RunCommand] = []
        self.duplicates = 0
        self._seen: set[tuple[str, int]] = set()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._nodes: dict[str, str] = {}
        self._done: set[str] = set()

    async def start(self) -> None:
        await self.bus.consume(
            subjects.STREAM_NODECMD, "node.*.run", RunCommand, self._on_run, durable="fake-run"
        )
        await self.bus.consume(
            subjects.STREAM_NODECMD, "node.*.kill", KillCommand, self._on_kill, durable="fake-kill"
        )

    async def _on_run(self, cmd: RunCommand) -> None:
        a = cmd.allocation
        key = (a.job_id, a.attempt)
        if key in self._seen:
            self.duplicates += 1
            return
        self._seen.add(key)
        self.runs.append(cmd)
        self._nodes[a.job_id] = a.node
        await self.bus.publish(
            subjects.lifecycle(a.job_id),
            Started(job_id=a.job_id, time=0.0, node=a.node, attempt=a.attempt),
            msg_id=f"started-{a.job_id}-{a.attempt}",
        )
        if a.job_id not in self.hold:
            self._tasks[a.job_id] = asyncio.create_task(self._finish(a.job_id, a.node))

    async def _finish(self, job: str, node: str) -> None:
        await asyncio.sleep(self.run_s)
        await self.bus.publish(
            subjects.lifecycle(job),
            Completed(job_id=job, time=0.0, node=node, runtime_s=self.run_s),
            msg_id=f"completed-{job}",
        )
        self._done.add(job)

    async def _on_kill(self, cmd: KillCommand) -> None:
        task = self._tasks.pop(cmd.job_id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if cmd.job_id in self._nodes and cmd.job_id not in self._done:
            self._done.add(cmd.job_id)
            await self.bus.publish(
                subjects.lifecycle(cmd.job_id),
                Cancelled(
                    job_id=cmd.job_id, time=0.0, node=self._nodes[cmd.job_id], reason=cmd.reason
                ),
                msg_id=f"cancelled-{cmd.job_id}",
            )

    async def close(self) -> None:
        for t in self._tasks.values():
            t.cancel()
