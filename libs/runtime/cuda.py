"""Time spent in CUDA work, measured on the GPU with CUDA events when torch has CUDA.

Why events and not the wall: CUDA calls return before the kernels ran, so a wall timer around
them measures the launch, not the work. An event pair recorded around a section is timed by the
GPU; reading it would wait for the GPU, so finished pairs are collected later (``collect``, at
each step) with ``query()``, which never blocks.

Without torch, or without CUDA, ``available`` is False, ``section()`` measures nothing and the
exporter leaves the metric out (its HELP says why).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

MAX_PENDING = 4096  # event pairs not yet finished; beyond it the oldest are dropped (and counted)


def cuda_torch() -> Any | None:
    """The torch module when this process already imported it and CUDA works; else None.

    Only an already imported torch: importing it here would cost a job that does not use it
    seconds of start-up and gigabytes of memory."""
    torch = sys.modules.get("torch")
    try:
        return torch if torch is not None and torch.cuda.is_available() else None
    except Exception:  # a broken driver: no CUDA as far as we are concerned
        return None


class CudaTimer:
    def __init__(self, torch: Any | None = None) -> None:
        self.torch = torch if torch is not None else cuda_torch()
        self.total_s = 0.0
        self.dropped = 0
        self._pending: list[tuple[Any, Any]] = []

    @property
    def available(self) -> bool:
        return self.torch is not None

    @property
    def why_absent(self) -> str:
        if "torch" not in sys.modules:
            return "torch is not imported in this process"
        return "torch has no usable CUDA device in this process"

    @contextlib.contextmanager
    def section(self) -> Iterator[None]:
        """Time the CUDA work queued inside the block (on the current stream)."""
        if self.torch is None:
            yield
            return
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            yield
        finally:
            end.record()
            self._pending.append((start, end))
            if len(self._pending) > MAX_PENDING:
                self._pending.pop(0)
                self.dropped += 1

    def collect(self) -> float:
        """Add the sections the GPU has finished to ``total_s``; returns ``total_s``."""
        still: list[tuple[Any, Any]] = []
        for start, end in self._pending:
            if end.query():
                self.total_s += start.elapsed_time(end) / 1000.0  # milliseconds
            else:
                still.append((start, end))
        self._pending = still
        return self.total_s
