"""Reading a local job's progress file (``libs.runtime.progress`` writes it).

The file is in the job's working directory and the job's user writes it, so it is untrusted
input: opened without following a symlink and without blocking on a FIFO, read only when it
is a regular file of at most ``MAX_BYTES``, decoded leniently (unknown fields ignored: a newer
runtime may add some) and kept only when its progress is a finite fraction. Anything else
counts as "the job reported nothing" and the executor falls back to its estimate. What a job
can forge this way is its own progress, which is what it reports anyway.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgspec

from proto.validation import sound_progress

PROGRESS_FILE = "mosaic-progress.json"  # in the attempt's working directory
MAX_BYTES = 64 * 1024


class JobProgress(msgspec.Struct, frozen=True, kw_only=True):
    """The record as the executor uses it (``docs/runtime-contract.md``, "Job side")."""

    version: int = 1
    progress: float | None = None
    steps: int = 0
    samples: int = 0
    step_time_s: float | None = None
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    saved: bool = False
    time: float = 0.0


_decoder = msgspec.json.Decoder(JobProgress)


def read_progress(path: Path) -> JobProgress | None:
    """The job's last record, or None when there is none worth believing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
            return None
        data = os.read(fd, MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        record = _decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    if record.progress is None or not sound_progress(record.progress):
        return None
    return record


def describe(record: JobProgress) -> str:
    """The record in a few words, for the Checkpointed event's reason."""
    parts = [f"step {record.steps}"]
    if record.step_time_s is not None and record.step_time_s >= 0:
        parts.append(f"{record.step_time_s:.3g} s/step")
    parts.append("saved" if record.saved else "no save reported")
    return ", ".join(parts)
