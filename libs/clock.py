"""The Mosaic clock, shared by every service of one deployment.

Why scaled wall time and not a per-process counter: services are separate processes that must
agree on "now" (deadlines, runtimes, ages) without talking. Each reads ``MOSAIC_CLOCK_EPOCH`` (the
unix second at which the deployment started) and ``MOSAIC_CLOCK_FACTOR`` (60 = an hour of job
time passes in a wall minute) and computes the same answer. Production runs with factor 1.

``MOSAIC_CLOCK_MODE=stepped`` (tests: the sim ≡ live comparison of issue 13) replaces the wall
by a controller: time stands at ``MOSAIC_CLOCK_EPOCH`` (default 0) until a ``proto.clock.Step``
on ``clock.step`` moves it (``SteppedClock.advance``; ``libs.bus.steps`` feeds it and holds the
barrier that waits for every participant to drain its work at each step).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

CLOCK_MODES = ("scaled", "stepped")


@dataclass(frozen=True)
class Clock:
    epoch: float
    factor: float = 1.0

    #: True for a ``SteppedClock``: time moves only when a controller says so
    stepped = False

    def now(self) -> float:
        """Mosaic-clock unix seconds."""
        return self.epoch + (time.time() - self.epoch) * self.factor

    def wall_seconds(self, mosaic_seconds: float) -> float:
        """How long ``mosaic_seconds`` of job time lasts on the wall."""
        return mosaic_seconds / self.factor

    async def sleep(self, mosaic_seconds: float) -> None:
        await asyncio.sleep(max(0.0, self.wall_seconds(mosaic_seconds)))

    @classmethod
    def from_env(cls) -> Clock:
        mode = os.environ.get("MOSAIC_CLOCK_MODE", "") or "scaled"
        if mode not in CLOCK_MODES:
            raise ValueError(f"MOSAIC_CLOCK_MODE must be one of {CLOCK_MODES}, got {mode!r}")
        epoch = float(os.environ.get("MOSAIC_CLOCK_EPOCH", "0") or 0)
        if mode == "stepped":
            return SteppedClock(epoch=epoch)
        factor = float(os.environ.get("MOSAIC_CLOCK_FACTOR", "1") or 1)
        if factor <= 0:
            raise ValueError(f"MOSAIC_CLOCK_FACTOR must be > 0, got {factor}")
        if factor != 1 and not epoch:
            # each process would pick its own start and their clocks would disagree
            raise ValueError("MOSAIC_CLOCK_FACTOR != 1 needs MOSAIC_CLOCK_EPOCH, the shared start")
        return cls(epoch=epoch or time.time(), factor=factor)

    def env(self) -> dict[str, str]:
        """The variables a child process needs to share this clock."""
        return {"MOSAIC_CLOCK_EPOCH": repr(self.epoch), "MOSAIC_CLOCK_FACTOR": repr(self.factor)}


@dataclass
class _StepState:
    """The mutable half of a SteppedClock (the dataclass itself stays frozen, like Clock)."""

    now: float
    seq: int = 0
    waiters: list[tuple[float, asyncio.Future[None]]] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class SteppedClock(Clock):
    """Mosaic time set by a controller, never by the wall.

    ``now()`` is the latest step's time; ``sleep(s)`` returns at the first step that reaches
    ``now() + s`` (a sleep of 0 or less only yields). Steps only move forward: an older or
    repeated one (the barrier re-publishes steps) changes nothing. ``wall_seconds`` is the
    identity, so code that waits on the wall (report intervals, retries) still waits a little.
    """

    stepped = True
    _state: _StepState = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self._state is None:
            object.__setattr__(self, "_state", _StepState(now=self.epoch))

    @property
    def seq(self) -> int:
        """The last step applied (0: none yet)."""
        return self._state.seq

    def now(self) -> float:
        return self._state.now

    def wall_seconds(self, mosaic_seconds: float) -> float:
        return mosaic_seconds

    def advance(self, seq: int, now: float) -> bool:
        """Apply step ``seq`` (time ``now``); returns whether it was new. Wakes every sleeper
        whose time has come, in the order of their deadlines."""
        st = self._state
        if seq <= st.seq:
            return False
        st.seq = seq
        st.now = max(st.now, now)
        due = sorted((w for w in st.waiters if w[0] <= st.now), key=lambda w: w[0])
        st.waiters = [w for w in st.waiters if w[0] > st.now]
        for _, fut in due:
            if not fut.done():
                fut.set_result(None)
        return True

    def next_deadline(self) -> float | None:
        """The earliest time a sleeper waits for (None: nobody sleeps)."""
        live = [t for t, f in self._state.waiters if not f.done()]
        return min(live) if live else None

    async def sleep(self, mosaic_seconds: float) -> None:
        if mosaic_seconds <= 0:
            await asyncio.sleep(0)
            return
        target = self._state.now + mosaic_seconds
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (target, fut)
        self._state.waiters.append(entry)
        try:
            await fut
        finally:
            if entry in self._state.waiters:
                self._state.waiters.remove(entry)

    def env(self) -> dict[str, str]:
        return {"MOSAIC_CLOCK_MODE": "stepped", "MOSAIC_CLOCK_EPOCH": repr(self.epoch)}
