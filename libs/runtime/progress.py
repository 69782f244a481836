"""The progress file: how a job tells its executor how far it is and how fast it goes.

Why a file and not a socket or the bus: it needs no connection, no credentials and no
listener, so it survives an executor restart (the next executor reads the same file) and a job
that cannot reach NATS still reports. The executor names the file in ``MOSAIC_PROGRESS_FILE``
(one per attempt, in the job's working directory, which the job's user may write); the job
rewrites it whole and atomically (a temporary file beside it, then ``os.replace``), so a reader
sees the previous record or the new one, never half of one.

The record is one JSON object (``docs/runtime-contract.md``, "Job side"): ``version``,
``progress`` (fraction 0..1 of the whole job, or null), ``steps``, ``samples``,
``step_time_s``, ``steps_per_s``, ``samples_per_s``, ``saved`` (a checkpoint was saved by this
process) and ``time`` (wall unix seconds of the write).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

FORMAT_VERSION = 1
MIN_INTERVAL_S = 1.0  # wall seconds between two unforced writes: a step loop stays cheap


class ProgressWriter:
    """Writes the record to ``path`` (None: nowhere, a job run outside Mosaic), at most every
    ``min_interval_s`` unless forced (a checkpoint, the end)."""

    def __init__(self, path: str | None, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self.path = path or None
        self.min_interval_s = min_interval_s
        self._last_write = -float("inf")
        self.writes = 0

    def write(self, record: dict[str, Any], *, force: bool = False) -> bool:
        """Write ``record`` (plus ``version`` and ``time``) now, or skip it when the last write
        was less than ``min_interval_s`` ago; returns whether it was written."""
        if self.path is None:
            return False
        now = time.monotonic()
        if not force and now - self._last_write < self.min_interval_s:
            return False
        body = json.dumps({"version": FORMAT_VERSION, **record, "time": time.time()})
        tmp = f"{self.path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(body)
            if force:  # a checkpoint's record must survive a crash of the machine too
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._last_write = now
        self.writes += 1
        return True
