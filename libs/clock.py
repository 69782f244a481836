"""The Mosaic clock, shared by every service of one deployment.

Why scaled wall time and not a per-process counter: services are separate processes that must
agree on "now" (deadlines, runtimes, ages) without talking. Each reads ``MOSAIC_CLOCK_EPOCH`` (the
unix second at which the deployment started) and ``MOSAIC_CLOCK_FACTOR`` (60 = an hour of job
time passes in a wall minute) and computes the same answer. Production runs with factor 1.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    epoch: float
    factor: float = 1.0

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
        epoch = float(os.environ.get("MOSAIC_CLOCK_EPOCH", "0") or 0)
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
