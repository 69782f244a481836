"""Releasing PyTorch's cached GPU memory on a timer.

Why: PyTorch's caching allocator keeps freed blocks for reuse, so ``nvidia-smi`` (and the
telemetry that reads NVML) shows the job holding memory it no longer uses; the field report saw
jobs taken for out of memory because of it, and fragmentation of the cache made real
allocations fail. ``torch.cuda.empty_cache()`` every so often gives the unused blocks back at
the cost of slower re-allocation, which is why it is off unless asked for
(``empty_cache_every_s`` or ``MOSAIC_EMPTY_CACHE_EVERY_S``).

A daemon thread: the allocator's release is thread-safe, and the job's loop needs no hook.
"""

from __future__ import annotations

import threading
from typing import Any

from .cuda import cuda_torch


class CacheReleaser:
    """Calls ``torch.cuda.empty_cache()`` every ``every_s`` wall seconds while running; a
    no-op (``active`` False) when torch with CUDA is not in the process."""

    def __init__(self, every_s: float, torch: Any | None = None) -> None:
        if not every_s > 0:
            raise ValueError(f"empty_cache_every_s: must be > 0, got {every_s!r}")
        self.every_s = every_s
        self.torch = torch if torch is not None else cuda_torch()
        self.releases = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self.torch is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="mosaic-empty-cache", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.torch.cuda.empty_cache()
            self.releases += 1
