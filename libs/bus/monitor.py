"""One receive loop (consumer, subscription, KV watch) as the service health sees it.

Why: a loop task that ends or hangs leaves a process that looks alive — its port answers, its
other loops run — while it no longer does its work (issue 12: six consumer loops ended silently
and ``/healthz`` stayed 200). Each loop gets a ``Heartbeat`` registered as a health check, so
``/healthz`` says 503 with the reason and the supervisor restarts the service; the end is logged
and counted too. Only ``stop()`` (its owner's ``Consumer.stop()``, ``KvWatch.stop()``, an
unsubscribe, ``Bus.close()``) ends a loop quietly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from libs.obs.health import Heartbeat
from libs.obs.metrics import LOOPS_ENDED

T = TypeVar("T")


class LoopMonitor:
    """The health of one loop: died (its task ended without ``stop()``) or wedged.

    ``idle_ok`` loops (core subscriptions, KV watches) may wait for a message for ever — a
    quiet subject is no fault — so they count as wedged only when one message has been in hand
    longer than ``wedged_after_s``. Other loops (pull consumers, which wake at least every
    fetch timeout) are wedged when they have not beaten for ``wedged_after_s``.
    """

    def __init__(
        self,
        name: str,
        *,
        service: str,
        wedged_after_s: float,
        idle_ok: bool,
        log: Any,
        on_stop: Callable[[LoopMonitor], None],
    ) -> None:
        self.name = name
        self.service = service
        self.heartbeat = Heartbeat(name, wedged_after_s)
        self.idle_ok = idle_ok
        self.busy = False
        self.stopped = False
        self.task: asyncio.Task[Any] | None = None
        self._log = log
        self._on_stop = on_stop
        self._end_reason: str | None = None

    def attach(self, task: asyncio.Task[T]) -> asyncio.Task[T]:
        """Watch ``task``, the loop itself; returns it."""
        self.task = task
        task.add_done_callback(self._on_done)
        return task

    def beat(self) -> None:
        self.heartbeat.beat()

    def begin(self) -> None:
        """A message is in hand (the wedge clock of an ``idle_ok`` loop runs)."""
        self.busy = True
        self.heartbeat.beat()

    def end(self) -> None:
        self.busy = False
        self.heartbeat.beat()

    def ended(self, reason: str) -> None:
        """The loop is about to return by itself, for ``reason``."""
        self._end_reason = reason

    def stop(self) -> None:
        """Its owner ends the loop: no longer a health check, no alarm."""
        if not self.stopped:
            self.stopped = True
            self._on_stop(self)

    def check(self) -> str | None:
        if self.stopped:
            return None
        if self.heartbeat.died is None and self.idle_ok and not self.busy:
            return None
        return self.heartbeat.check()

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        if self.stopped:
            return
        if task.cancelled():
            reason = "its task was cancelled (not by stop() or Bus.close())"
        else:
            exc = task.exception()
            reason = repr(exc) if exc else (self._end_reason or "its task returned")
        self.heartbeat.dead(reason)
        LOOPS_ENDED.labels(self.service, self.name).inc()
        self._log.error("receive_loop_ended", loop=self.name, reason=reason)
