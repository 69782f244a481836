"""The placer's lease loop: wait for the lease, take over, serve until it is lost, step down, again.

Why a module and a restart loop of its own: this task is what makes a replica active. If it ever
ended on an exception (a NATS timeout in ``try_acquire``, a takeover that failed), the replica
would stay a standby forever while its process looked healthy. So every turn runs under a
``try`` that logs, steps down and starts again after a short pause (growing while it keeps
failing), and ``check`` is registered as a health check: ``/healthz`` says 503 if the task has
ended anyway, so the supervisor restarts the process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from libs.bus.lease import Lease
from libs.bus.tasks import cancel_and_wait

RETRY_MAX_S = 10.0  # longest pause between failed turns (wall s)


class Leadership:
    """Runs ``take_over`` each time ``lease`` is acquired and ``step_down`` each time it is lost.

    ``take_over`` failing counts as losing: the loop steps down and tries again after
    ``retry_s`` (doubling up to ``RETRY_MAX_S`` while turns keep failing)."""

    def __init__(
        self,
        lease: Lease,
        take_over: Callable[[], Awaitable[None]],
        step_down: Callable[[], Awaitable[None]],
        log: object,
        retry_s: float = 1.0,
    ) -> None:
        self.lease = lease
        self.take_over = take_over
        self.step_down = step_down
        self.log = log
        self.retry_s = retry_s
        self.failures = 0  # turns that ended on an exception (tests, logs)
        self.task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None

    def start(self, stop: asyncio.Event) -> asyncio.Task[None]:
        self._stop = stop
        self.task = asyncio.create_task(self.run(stop), name="placer:lease")
        return self.task

    def check(self) -> str | None:
        """Health: the lease task must run for as long as the service does."""
        if self.task is None or self._stop is None or self._stop.is_set():
            return None
        if self.task.done():
            exc = None if self.task.cancelled() else self.task.exception()
            return f"lease task ended ({exc!r})" if exc else "lease task ended"
        return None

    async def run(self, stop: asyncio.Event) -> None:
        """Turn after turn until ``stop``; an exception ends a turn, never the loop."""
        pause = self.retry_s
        while not stop.is_set():
            try:
                await self._turn(stop)
                pause = self.retry_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                self.log.exception("lease_turn_failed", error=repr(exc), failures=self.failures)
                with contextlib.suppress(Exception):
                    await self.step_down()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=pause)
                pause = min(pause * 2, RETRY_MAX_S)

    async def _turn(self, stop: asyncio.Event) -> None:
        if not await _until(self.lease.acquire(), stop):
            return
        try:
            await self.take_over()
        except asyncio.CancelledError:
            raise
        except Exception:
            # we hold the lease but could not act on it: hand it back so a healthy standby
            # does not wait for the expiry, then let ``run`` pause and try again
            with contextlib.suppress(Exception):
                await self.lease.release()
            raise
        await _until(self.lease.lost.wait(), stop)
        await self.step_down()


async def _until(aw: Awaitable[object], stop: asyncio.Event) -> bool:
    """Await ``aw`` unless ``stop`` comes first (then cancel it): True when ``aw`` finished.
    An exception from ``aw`` propagates."""
    task = asyncio.ensure_future(aw)
    halt = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, halt}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        halt.cancel()
        await cancel_and_wait(task)
    if task.cancelled():
        return False
    task.result()
    return True
