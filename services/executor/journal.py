"""The executor's journal: one small JSON file per attempt it runs, so a restart can re-adopt it.

Why a file per attempt and not one file or a KV bucket: the journal must be written before a run
command is acked and must survive the executor, NATS and the node's network all at once; one
file per attempt is written atomically (temporary file, fsync, ``os.replace``) without
rewriting the others, and a crash leaves either the old version or the new one, never half.

An entry goes through three states, each a rewrite of the same file:

1. accepted: the run command (``cmd``) and the Mosaic time it started; written before the command
   is acked, so a redelivered command finds it and is ignored (no job runs twice);
2. running: ``started_sent`` (the Started event is out) and, in local mode, ``launch`` (the pid,
   its start time in ``/proc/<pid>/stat`` to defend against pid reuse, and its files);
3. ending: ``pending``, the lifecycle events still to publish, written before they are
   published; the file is removed once they are out. A restart re-publishes them with the same
   ``Nats-Msg-Id`` (JetStream drops the repeat) instead of running the job again.
   A checkpoint under way (``checkpoint``, ``services.executor.checkpoint``) is journaled
   before its command is acked: a restart completes it (or redoes what is left of it) instead
   of running the attempt on or losing it.
4. done: an empty ``<job>-<attempt>.done`` tombstone replaces the entry for ``DONE_KEEP_S``, so a
   run command whose ack was lost in a crash, redelivered after the attempt ended, is ignored
   instead of running the attempt a second time.

The format is the executor's private state, read by no other process, so it lives here rather
than in ``proto/`` (which holds what services exchange). ``version`` lets a later format refuse
an old file instead of misreading it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import msgspec

from proto.commands import RunCommand
from proto.events import LifecycleEvent

VERSION = 1
DONE_KEEP_S = 86_400.0  # wall s a tombstone is kept: far beyond a redelivery after a restart
_MAX_NAME = 120  # well under the 255 bytes a file name may have, with suffixes


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    """A local job's process: the wrapper's pid and what identifies that very process."""

    pid: int
    start_ticks: int  # field 22 of /proc/<pid>/stat: a reused pid has another start time
    rc_path: str  # the wrapper writes the job's exit status here before it exits
    log_path: str
    work_dir: str


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """A checkpoint of the attempt under way: what the executor needs to finish it after a
    restart, as when it was asked."""

    reason: str
    requested_at: float  # Mosaic clock
    done_at: float  # Mosaic clock: simulated mode, when its cost is paid
    estimate: float  # the progress from elapsed time at the request (the fallback)
    signal: str = "SIGUSR1"  # local mode: what the job's processes get
    grace_until: float = 0.0  # local mode: wall unix seconds, when SIGTERM follows
    shrink_to: int = 0  # an elastic shrink: named in the Preempted (``resize_gpus``)


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt this node runs (see the module docstring for its three states)."""

    version: int = VERSION
    node: str
    cmd: RunCommand
    started_at: float  # Mosaic clock
    boot_id: str  # the executor process that accepted it (for the logs)
    started_sent: bool = False
    launch: Launch | None = None
    pending: tuple[LifecycleEvent, ...] = ()
    checkpoint: Checkpoint | None = None

    @property
    def job_id(self) -> str:
        return self.cmd.allocation.job_id

    @property
    def attempt(self) -> int:
        return self.cmd.allocation.attempt


def job_stem(job_id: str) -> str:
    """A file name for a job whatever characters its id holds (no ``/``, no ``..`` on its
    own); a very long id is shortened with a hash so names stay distinct."""
    safe = quote(job_id, safe="._-")
    if not safe.strip("."):  # "", "." and ".." are no names of their own
        safe = f"~{safe.replace('.', '%2E')}"
    if len(safe) > _MAX_NAME:
        digest = hashlib.sha256(job_id.encode()).hexdigest()[:16]
        safe = f"{safe[: _MAX_NAME - 17]}~{digest}"
    return safe


def file_stem(job_id: str, attempt: int) -> str:
    """A file name for (job, attempt) (``job_stem`` and the attempt)."""
    return f"{job_stem(job_id)}-{attempt}"


class Journal:
    """The journal of one node, in ``root`` (created private to the executor's user)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(Entry)

    def path(self, job_id: str, attempt: int) -> Path:
        return self.root / f"{file_stem(job_id, attempt)}.json"

    def rc_path(self, job_id: str, attempt: int) -> Path:
        """Where a local job's wrapper writes its exit status: beside the entry, in a
        directory the job's unprivileged user cannot write (so it cannot forge its result)."""
        return self.root / f"{file_stem(job_id, attempt)}.rc"

    def put(self, entry: Entry) -> None:
        """Write ``entry`` atomically and durably: after this returns, a crash keeps it."""
        path = self.path(entry.job_id, entry.attempt)
        tmp = path.with_suffix(".json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, self._encoder.encode(entry))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._sync_dir()

    def done_path(self, job_id: str, attempt: int) -> Path:
        return self.root / f"{file_stem(job_id, attempt)}.done"

    def is_done(self, job_id: str, attempt: int) -> bool:
        """True when this attempt ran here and ended (within ``DONE_KEEP_S``)."""
        return self.done_path(job_id, attempt).exists()

    def prune_done(self, now_s: float | None = None) -> int:
        """Drop tombstones older than ``DONE_KEEP_S``; returns how many."""
        cutoff = (time.time() if now_s is None else now_s) - DONE_KEEP_S
        dropped = 0
        for path in self.root.glob("*.done"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    dropped += 1
        return dropped

    def remove(self, job_id: str, attempt: int) -> None:
        """Forget the attempt (its terminal event is out): a tombstone first, then the entry
        and its exit-status file."""
        fd = os.open(self.done_path(job_id, attempt), os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
        for path in (self.path(job_id, attempt), self.rc_path(job_id, attempt)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._sync_dir()

    def load(self) -> tuple[list[Entry], list[tuple[Path, str]]]:
        """Every entry, oldest start first, and the files that could not be read with why.

        An unreadable file is renamed ``*.bad`` so it is reported once and never blocks a
        start; its job is left to the placer's reconciliation (it no longer appears in this
        node's reports)."""
        entries: list[Entry] = []
        bad: list[tuple[Path, str]] = []
        for path in self._files():
            try:
                entry = self._decoder.decode(path.read_bytes())
                if entry.version != VERSION:
                    raise ValueError(f"journal version {entry.version}, expected {VERSION}")
            except (OSError, ValueError, msgspec.DecodeError) as exc:
                bad.append((path, str(exc)))
                with contextlib.suppress(OSError):
                    path.rename(path.with_suffix(".bad"))
                continue
            entries.append(entry)
        entries.sort(key=lambda e: e.started_at)
        return entries, bad

    def _files(self) -> Iterator[Path]:
        yield from sorted(self.root.glob("*.json"))

    def _sync_dir(self) -> None:
        """fsync the directory so a rename or unlink survives a power cut, not only a crash."""
        with contextlib.suppress(OSError):
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
