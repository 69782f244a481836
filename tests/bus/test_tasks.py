"""cancel_and_wait ends a task even when one cancellation is swallowed (py3.11 wait_for)."""

from __future__ import annotations

import asyncio

from libs.bus.tasks import cancel_and_wait


async def _swallows_first_cancel(log: list[str]) -> None:
    """A loop that, like a nats-py request racing its reply, lets one cancellation through as a
    normal return and carries on."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        log.append("swallowed")
    while True:
        await asyncio.sleep(0.01)


async def test_a_swallowed_cancellation_is_repeated_until_the_task_ends() -> None:
    log: list[str] = []
    task = asyncio.create_task(_swallows_first_cancel(log))
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, retry_s=0.05), 5.0)
    assert task.done() and task.cancelled()
    assert log == ["swallowed"]


async def test_a_task_that_failed_or_ended_is_waited_without_raising() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await cancel_and_wait(failed)
    await cancel_and_wait(None)
    assert failed.done() and isinstance(failed.exception(), RuntimeError)
