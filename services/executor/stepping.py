"""The executor as a participant of the stepped clock (``libs.bus.steps``; tests only).

Why these conditions make a node's executor "settled" at Mosaic time ``now``: everything it
owes at ``now`` is then out. Every simulated attempt due by ``now`` has published its end
(``Completed`` at its deadline, not at the step's time: ``SimRunner.wait``; a checkpoint's
events at the end of its cost, which ``SimRunner.deadline`` names), a boot due by
``now`` has made the node awake, and its command consumer holds no message it has not handled
(the server's count, so a command the placer published before acking the step is seen even if
it is still on its way to this process).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from libs.bus.steps import StepParticipant
from proto.clock import Step
from services.executor.executor import NodeExecutor

POLL_S = 0.01  # wall seconds between two looks while not settled


async def is_settled(ex: NodeExecutor, now: float) -> bool:
    if ex.ending or not ex.power.settled(now) or ex.consumer is None:
        return False
    if any(link.state == "ready" for link in ex._gang_links.values()):
        return False  # a gang part waits for its peers (gang.py): it starts at this instant
    deadline = getattr(ex.runner, "deadline", None)
    if deadline is not None and any(deadline(j.entry, ex.node) <= now for j in ex.running.values()):
        return False
    info = await ex.consumer.sub.consumer_info()
    return not info.num_pending and not info.num_ack_pending


async def settle(executors: Sequence[NodeExecutor], now: float) -> None:
    """Return once every executor is settled at ``now`` (the controller times out if never)."""
    while True:
        states = await asyncio.gather(*(is_settled(e, now) for e in executors))
        if all(states):
            return
        await asyncio.sleep(POLL_S)


def next_due(executors: Sequence[NodeExecutor]) -> float | None:
    """The earliest Mosaic time something is due on these nodes: a simulated attempt's end
    or a boot's end (the controller steps there)."""
    due: list[float] = []
    for ex in executors:
        deadline = getattr(ex.runner, "deadline", None)
        if deadline is not None:
            due += [deadline(j.entry, ex.node) for j in ex.running.values()]
        ready = ex.power.ready_at()
        if ready is not None:
            due.append(ready)
    return min(due) if due else None


async def participate(executors: Sequence[NodeExecutor], name: str) -> None:
    """Settle and ack every step until cancelled; one participant per executor process."""
    first = executors[0]
    participant = StepParticipant(
        first.bus,
        first.clock,
        name,
        handled=lambda: sum(e.handled for e in executors),
        next_due=lambda: next_due(executors),
    )
    await participant.start()

    async def on_step(step: Step) -> None:
        await settle(executors, step.now)

    try:
        await participant.serve(on_step)
    finally:
        await participant.stop()
