"""A gang's part on this node (issue 15): it starts when every part is ready and ends when any
part ends, so the job has one start and exactly one terminal state. A mixin of ``NodeExecutor``.

The placer sends each node of a gang its own part (``RunCommand.gang`` names every node, the
leader first). Here, per part:

- **Start barrier.** The part is journaled and tracked (so a kill finds it, and the node's
  reports list it), then says ``ready`` on ``gang.<job>.<attempt>`` (``proto.gangs``) every
  ``HEARTBEAT_S`` wall seconds and waits until every other node said ``ready`` or
  ``running``. Then it launches. If that takes more than ``gang_start_timeout_s``, or a peer
  says ``ended`` first, the part ends without running: the leader reports ``Failed`` (the
  placer requeues the job as for any failed attempt); the others end silently.
- **One voice.** Only the leader publishes the job's lifecycle events (``Started``, then one
  terminal event); the other parts publish none (``speaks``).
- **End together.** While running each part says ``running`` (a heartbeat: a peer that
  subscribed late still hears it). When a part stops for any reason (completed, failed,
  killed) it says ``ended`` (``ok`` when it completed) ``ENDED_REPEATS`` times; a peer that
  hears it stops its own part: the leader then reports ``Completed`` when the peer completed,
  else ``Failed`` naming the peer and its reason; the others stop silently. The leader's own
  end is told the same way, so a kill sent to the leader (a cancel) ends every part.

Why signals between executors, not through the placer: the barrier must hold until every
process is about to run, which only the executors know, and an end must stop the peers even
while the placer is down (its lease moving). The placer still sees one job in one ledger
entry with one lifecycle.

Known limits: a peer that dies without saying ``ended`` (its executor killed and not
restarted) is not noticed by the others until the placer's reconciliation sees the leader's
node alone (the leader runs on); a restarted executor re-joins its journaled parts' signals
but does not run the barrier again for a part that had started.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from proto import subjects
from proto.events import Completed, Failed, LifecycleEvent
from proto.gangs import GangSignal, GangState
from services.executor.journal import Entry
from services.executor.runners import energy_kwh

HEARTBEAT_S = 0.2  # wall seconds between a part's signals
ENDED_REPEATS = 10  # an ended part says so this many times, HEARTBEAT_S apart


class GangLink:
    """One part's signals: what it says (``state``) and what it heard from its peers."""

    def __init__(self, entry: Entry, me: str) -> None:
        self.entry = entry
        self.me = me
        self.nodes = entry.cmd.gang
        self.state: GangState = "ready"
        self.ok = False
        self.reason = ""
        self.heard: set[str] = set()
        self.ended: GangSignal | None = None  # the first peer that said ended
        self.ready = asyncio.Event()  # every peer ready or running, or one ended
        self.sub: Any = None
        self.beat: asyncio.Task[None] | None = None

    def signal(self) -> GangSignal:
        e = self.entry
        return GangSignal(job_id=e.job_id, attempt=e.attempt, node=self.me, state=self.state,
                          ok=self.ok, reason=self.reason)  # fmt: skip

    def hear(self, sig: GangSignal) -> bool:
        """Take a peer's signal; True when it is the first ``ended`` heard."""
        e = self.entry
        if (sig.job_id, sig.attempt) != (e.job_id, e.attempt) or sig.node == self.me:
            return False
        if sig.node not in self.nodes:
            return False
        self.heard.add(sig.node)
        first_end = sig.state == "ended" and self.ended is None
        if first_end:
            self.ended = sig
        if first_end or all(n in self.heard for n in self.nodes if n != self.me):
            self.ready.set()
        return first_end


class GangParts:
    """The ``NodeExecutor`` side (see the module docstring)."""

    bus: Any
    node: Any
    log: Any
    clock: Any
    running: dict[str, Any]
    runner: Any
    _gang_links: dict[tuple[str, int], GangLink]

    def speaks(self, entry: Entry) -> bool:
        """Whether this part publishes the job's lifecycle events: a job on one node, or a
        gang's leader."""
        gang = entry.cmd.gang
        return not gang or gang[0] == self.node.id

    async def _gang_open(self, entry: Entry, state: GangState) -> GangLink:
        key = (entry.job_id, entry.attempt)
        link = self._gang_links.get(key)
        if link is not None:
            return link
        link = self._gang_links[key] = GangLink(entry, self.node.id)
        link.state = state

        async def on_signal(sig: GangSignal) -> None:
            if link.hear(sig) and link.state == "running":
                self._spawn(self._gang_peer_ended(link), f"gang-end:{entry.job_id}")  # type: ignore[attr-defined]

        link.sub = await self.bus.subscribe(subjects.gang(*key), GangSignal, on_signal)
        link.beat = self._spawn(self._gang_beat(link), f"gang:{entry.job_id}")  # type: ignore[attr-defined]
        return link

    async def _gang_beat(self, link: GangLink) -> None:
        """Say the part's state every ``HEARTBEAT_S``; ``ended`` a few times, then close."""
        subject = subjects.gang(link.entry.job_id, link.entry.attempt)
        left = ENDED_REPEATS
        try:
            while left > 0:
                with contextlib.suppress(Exception):  # a lost beat is repeated by the next
                    await self.bus.publish(subject, link.signal(), durable=False)
                if link.state == "ended":
                    left -= 1
                await asyncio.sleep(HEARTBEAT_S)
        finally:
            self._gang_links.pop((link.entry.job_id, link.entry.attempt), None)
            if link.sub is not None:
                with contextlib.suppress(Exception):
                    await link.sub.unsubscribe()

    def gang_start(self, entry: Entry) -> None:
        """A journaled gang part: wait for its peers, then launch (module docstring)."""
        task = self._spawn(self._gang_barrier(entry), f"gang-start:{entry.job_id}")  # type: ignore[attr-defined]
        self._track(entry, task)  # type: ignore[attr-defined]

    async def _gang_barrier(self, entry: Entry) -> None:
        link = await self._gang_open(entry, "ready")
        timeout_s = entry.cmd.gang_start_timeout_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(link.ready.wait(), timeout_s)
        if link.ended is not None or not link.ready.is_set():
            missing = sorted(n for n in link.nodes if n != self.node.id and n not in link.heard)
            why = (
                f"gang part on {link.ended.node} ended before the start: {link.ended.reason}"
                if link.ended is not None
                else f"gang start: {', '.join(missing)} not ready within {timeout_s:g} s"
            )
            self.log.warning("gang_not_started", job_id=entry.job_id, reason=why)
            self.running.pop(entry.job_id, None)
            event = Failed(job_id=entry.job_id, time=self.clock.now(), node=self.node.id,
                           reason=why)  # fmt: skip
            await self._finish(entry, (event,))  # type: ignore[attr-defined]
            return
        link.state = "running"
        self.log.info("gang_started", job_id=entry.job_id, nodes=list(link.nodes))
        await self._launch(entry)  # type: ignore[attr-defined]

    async def _gang_peer_ended(self, link: GangLink) -> None:
        """A peer ended: stop this part; the leader reports the job's end."""
        entry, peer = link.entry, link.ended
        assert peer is not None
        job = self.running.get(entry.job_id)
        if job is None or job.entry.attempt != entry.attempt:
            return  # ending already (its own end won the race)
        self.running.pop(entry.job_id, None)
        job.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await job.task
        await self.runner.stop(job.entry)
        now = self.clock.now()
        event: LifecycleEvent
        if peer.ok:
            runtime_s = max(0.0, now - job.entry.started_at)
            kwh = energy_kwh(self.node, job.entry.cmd, runtime_s)
            event = Completed(job_id=entry.job_id, time=now, node=self.node.id,
                              runtime_s=runtime_s, energy_kwh=kwh)  # fmt: skip
        else:
            event = Failed(job_id=entry.job_id, time=now, node=self.node.id,
                           reason=f"gang part on {peer.node} ended: {peer.reason}")  # fmt: skip
        self.log.info("gang_part_stopped", job_id=entry.job_id, by=peer.node, ok=peer.ok)
        await self._finish(job.entry, (event,))  # type: ignore[attr-defined]

    async def gang_ended(self, entry: Entry, events: tuple[LifecycleEvent, ...]) -> None:
        """This part stopped (``events``: its end, whether or not this part publishes it):
        tell the peers, once."""
        if not entry.cmd.gang:
            return
        link = self._gang_links.get((entry.job_id, entry.attempt))
        if link is None:  # a part ending after a restart, before it re-joined
            link = await self._gang_open(entry, "ready")
        if link.state == "ended":
            return
        link.ok = any(isinstance(e, Completed) for e in events)
        link.reason = next((getattr(e, "reason", "") for e in events if not link.ok), "")
        link.reason = link.reason or ("completed" if link.ok else "stopped")
        link.state = "ended"
