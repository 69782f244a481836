"""The stepped clock over NATS: the controller's barrier and the participants' side of it.

Protocol (``proto.clock``; subjects ``clock.step`` and ``clock.ack.<participant>``, core NATS):

1. the controller publishes ``Step(seq, now, round=0)``; every ``SteppedClock`` that follows
   the subject (``follow_steps``, started by ``libs.bus.runtime.serve`` in stepped mode) moves
   to ``now`` and wakes its sleepers;
2. each participant drains its work at that time (its own ``settle``: e.g. the executor waits
   until every job due by ``now`` has published its end and its command consumer is empty),
   then publishes ``StepAck(participant, seq, round, handled)``;
3. once every named participant acked the round, the controller probes again (same step,
   ``round + 1``); the step is over when a round's ``handled`` counts equal the previous
   round's for everyone: nobody did anything in between, so no message sent by one
   participant was still on its way to another (a message published before an ack reaches
   the server before the ack, hence before the next probe).

Why re-publish instead of a durable stream: a step that a participant missed (not yet
subscribed, or a lost core message) is simply sent again every ``RESEND_S`` until it answers,
and an old step is a no-op (the clock moves forward only), so nothing needs to be stored.
The participants are named up front by the controller: a barrier over "whoever is there" could
not tell a slow participant from an absent one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from libs.bus.connection import Bus
from libs.clock import Clock, SteppedClock
from proto import subjects
from proto.clock import Step, StepAck

RESEND_S = 0.25  # wall seconds between two publications of an unanswered step
STEP_TIMEOUT_S = 30.0  # wall seconds a step may take before the controller gives up


class StepTimeout(TimeoutError):
    """Some participants did not settle a step in time; ``missing`` names them."""

    def __init__(self, step: Step, missing: Sequence[str]) -> None:
        super().__init__(f"step {step.seq} (t={step.now}) not acked by {', '.join(missing)}")
        self.step = step
        self.missing = tuple(missing)


async def follow_steps(bus: Bus, clock: Clock) -> Any:
    """Move ``clock`` (a SteppedClock) with every ``clock.step``; returns the subscription.
    A scaled clock is left alone (returns None)."""
    if not isinstance(clock, SteppedClock):
        return None

    async def on_step(step: Step) -> None:
        clock.advance(step.seq, step.now)

    return await bus.subscribe(subjects.CLOCK_STEP, Step, on_step)


class StepParticipant:
    """One service's side of the barrier. The API the placer (and the executor) use::

        p = StepParticipant(bus, clock, "placer")
        await p.start()
        while True:
            step = await p.wait_step()   # the clock already shows step.now
            ...                          # do everything due at step.now, publish it
            await p.ack(step)            # then say so

    or ``await p.serve(settle)`` with ``settle(step)`` doing the middle part. ``handled`` is
    this participant's count of finished work items (commands handled, events published):
    ``count()`` bumps it, or pass ``handled=`` a callable that returns it.
    """

    def __init__(
        self,
        bus: Bus,
        clock: Clock,
        name: str,
        *,
        handled: Callable[[], int] | None = None,
        next_due: Callable[[], float | None] | None = None,
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.name = name
        self._handled = handled
        self._next_due = next_due
        self._count = 0
        self._latest: Step | None = None
        self._acked: tuple[int, int] = (0, -1)  # (seq, round) last acked
        self._new = asyncio.Event()
        self._sub: Any = None

    @property
    def handled(self) -> int:
        return self._count + (self._handled() if self._handled is not None else 0)

    def count(self, n: int = 1) -> None:
        self._count += n

    async def start(self) -> None:
        self._sub = await self.bus.subscribe(subjects.CLOCK_STEP, Step, self._on_step)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _on_step(self, step: Step) -> None:
        if isinstance(self.clock, SteppedClock):
            self.clock.advance(step.seq, step.now)  # before anyone is told of the step
        latest = self._latest
        if latest is None or (step.seq, step.round) >= (latest.seq, latest.round):
            self._latest = step
            self._new.set()

    async def wait_step(self) -> Step:
        """The newest step (or probe round) not acked yet; a repeat of the last acked one
        (the controller re-sends until every ack is in) is answered at once, not returned."""
        while True:
            step = self._latest
            if step is not None:
                if (step.seq, step.round) > self._acked:
                    return step
                if (step.seq, step.round) == self._acked:
                    self._latest = None
                    await self._publish_ack(step)  # our ack may have been lost: say it again
                    continue
            self._new.clear()
            await self._new.wait()

    async def ack(self, step: Step) -> None:
        """``step`` is settled here: nothing left to do at its time."""
        self._acked = max(self._acked, (step.seq, step.round))
        if self._latest is not None and (self._latest.seq, self._latest.round) <= self._acked:
            self._latest = None
        await self._publish_ack(step)

    async def _publish_ack(self, step: Step) -> None:
        nxt = self._next_due() if self._next_due is not None else None
        ack = StepAck(
            participant=self.name,
            seq=step.seq,
            round=step.round,
            handled=self.handled,
            next_s=nxt,
        )
        await self.bus.publish(subjects.clock_ack(self.name), ack, durable=False)

    async def serve(self, settle: Callable[[Step], Awaitable[None]]) -> None:
        """Settle and ack every step until cancelled."""
        while True:
            step = await self.wait_step()
            await settle(step)
            await self.ack(step)


class StepController:
    """The test's side: ``await controller.step(now)`` moves every participant to ``now`` and
    returns once all of them have settled (``StepTimeout`` otherwise)."""

    def __init__(
        self,
        bus: Bus,
        participants: Sequence[str],
        *,
        timeout_s: float = STEP_TIMEOUT_S,
        resend_s: float = RESEND_S,
    ) -> None:
        self.bus = bus
        self.participants = tuple(participants)
        self.timeout_s = timeout_s
        self.resend_s = resend_s
        self.seq = 0
        self._acks: dict[str, StepAck] = {}
        self._got = asyncio.Event()
        self._sub: Any = None

    async def start(self) -> None:
        self._sub = await self.bus.subscribe(subjects.CLOCK_ACKS_ALL, StepAck, self._on_ack)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _on_ack(self, ack: StepAck) -> None:
        old = self._acks.get(ack.participant)
        if old is None or (ack.seq, ack.round) >= (old.seq, old.round):
            self._acks[ack.participant] = ack
            self._got.set()

    async def step(
        self,
        now: float,
        *,
        max_rounds: int = 50,
        decide: bool = False,
        before_decide: Callable[[], Awaitable[None]] | None = None,
    ) -> Step:
        """Publish step ``seq + 1`` at ``now`` and wait for quiescence (see the module). With
        ``decide``: then ``before_decide()`` (a test submits what arrives at ``now``), then the
        decide phase (the same step, ``decide=True`` rounds) until quiet again."""
        self.seq += 1
        deadline = time.monotonic() + self.timeout_s
        last = await self._quiet(Step(seq=self.seq, now=now), deadline, max_rounds)
        if not decide:
            return last
        if before_decide is not None:
            await before_decide()
        first = Step(seq=self.seq, now=now, round=last.round + 1, decide=True)
        return await self._quiet(first, deadline, max_rounds)

    async def _quiet(self, first: Step, deadline: float, max_rounds: int) -> Step:
        """Rounds of ``first`` (round, round + 1, ...) until one changes no ``handled``."""
        before = await self._round(first, deadline)
        for r in range(first.round + 1, first.round + max_rounds + 1):
            step = Step(seq=first.seq, now=first.now, round=r, decide=first.decide)
            after = await self._round(step, deadline)
            if after == before:
                return step
            before = after
        raise StepTimeout(first, ["(never quiet)"])

    def next_of(self, participant: str) -> float | None:
        """When ``participant`` said (its last ack) it has something due next, or None."""
        ack = self._acks.get(participant)
        return None if ack is None else ack.next_s

    def next_s(self) -> float | None:
        """The earliest time a participant said it has something due at (last acks)."""
        due = [a.next_s for a in self._acks.values() if a.next_s is not None]
        return min(due) if due else None

    async def _round(self, step: Step, deadline: float) -> dict[str, int]:
        """Publish ``step`` until every participant acked it; their ``handled`` counts."""
        while True:
            await self.bus.publish(subjects.CLOCK_STEP, step, durable=False)
            resend_at = time.monotonic() + self.resend_s
            while True:
                self._got.clear()  # before looking: an ack arriving after the look sets it
                missing = [p for p in self.participants if not self._acked(p, step)]
                if not missing:
                    return {p: self._acks[p].handled for p in self.participants}
                if time.monotonic() >= deadline:
                    raise StepTimeout(step, missing)
                wait_s = min(resend_at, deadline) - time.monotonic()
                if wait_s <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._got.wait(), wait_s)

    def _acked(self, participant: str, step: Step) -> bool:
        ack = self._acks.get(participant)
        return ack is not None and (ack.seq, ack.round) >= (step.seq, step.round)
