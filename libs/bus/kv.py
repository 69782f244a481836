"""A typed view of a JetStream KV bucket, with revisions for compare-and-set.

Why revisions are exposed: the placer is the only writer of the ledger, but a restarted or standby
placer must never overwrite an allocation it did not see. ``update(key, value, revision)`` fails
with ``CasConflict`` when someone wrote in between, so a stale writer re-reads instead of
double-booking a GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from libs.bus.errors import CasConflict, KeyExists
from libs.bus.monitor import LoopMonitor
from libs.bus.receive import WEDGED_AFTER_S, guarded_decode
from libs.bus.tasks import cancel_and_wait

ITEMS_TIMEOUT_S = 5.0

if TYPE_CHECKING:
    from libs.bus.connection import Bus

T = TypeVar("T")

_DELETE_OPS = ("DEL", "PURGE")
CATCH_UP_TIMEOUT_S = 30.0  # watch() waits at most this long for the current values
# room under max_payload for the headers a KV write carries (expected-revision header)
_KV_WRITE_HEADERS = {"Nats-Expected-Last-Subject-Sequence": "18446744073709551615"}


@dataclass(frozen=True)
class Entry(Generic[T]):
    value: T
    revision: int


class KvWatch:
    """A running watch; ``stop()`` ends it."""

    def __init__(
        self, watcher: Any, task: asyncio.Task[None], monitor: LoopMonitor | None = None
    ) -> None:
        self._watcher = watcher
        self.task = task
        self.monitor = monitor

    async def stop(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        await cancel_and_wait(self.task)
        with contextlib.suppress(Exception):
            await self._watcher.stop()


class TypedKV(Generic[T]):
    """Values of ``type_`` (a msgspec Struct) stored as JSON under string keys.

    A stored value that does not decode, or is over the bus's decode limits, is dead-lettered
    (once per revision, thanks to the Nats-Msg-Id dedupe) and treated as absent, so one bad
    record cannot stop a reader. A write that could exceed the server's max payload raises
    ``PayloadTooLarge`` before anything is sent.
    """

    def __init__(self, bus: Bus, raw: KeyValue, bucket: str, type_: type[T]) -> None:
        self.bus = bus
        self.raw = raw
        self.bucket = bucket
        self.type_ = type_
        self._decoder = msgspec.json.Decoder(type_)

    async def _decode(self, key: str, data: bytes | None, revision: int) -> T | None:
        value, rejected = guarded_decode(self.bus.limits, self._decoder.decode, data or b"")
        if rejected is None:
            return value
        kind, reason = rejected
        await self.bus.dead_letter(
            f"$KV.{self.bucket}.{key}",
            data or b"",
            reason,
            pattern=f"kv.{self.bucket}",
            msg_id=f"kv-{self.bucket}-{key}-{revision}",
            kind=kind,
        )
        return None

    def _encode(self, key: str, value: T) -> bytes:
        data = msgspec.json.encode(value)
        self.bus.check_payload(f"$KV.{self.bucket}.{key}", data, _KV_WRITE_HEADERS)
        return data

    async def get(self, key: str) -> Entry[T] | None:
        """The current value and its revision; None when absent, deleted or undecodable."""
        try:
            e = await self.raw.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        value = await self._decode(key, e.value, e.revision)
        return None if value is None else Entry(value, e.revision)

    async def put(self, key: str, value: T) -> int:
        """Unconditional write; returns the new revision."""
        return await self.raw.put(key, self._encode(key, value))

    async def create(self, key: str, value: T) -> int:
        """Write only if ``key`` has no value (a deleted key counts as absent)."""
        try:
            return await self.raw.create(key, self._encode(key, value))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KeyExists(f"{self.bucket}/{key} already exists") from exc

    async def update(self, key: str, value: T, revision: int) -> int:
        """Compare-and-set: write only if ``revision`` is still the latest for ``key``."""
        try:
            return await self.raw.update(key, self._encode(key, value), last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise CasConflict(
                f"{self.bucket}/{key}: revision {revision} is no longer the latest"
            ) from exc

    async def delete(self, key: str, revision: int | None = None) -> None:
        """Delete ``key`` (a tombstone that watchers see); with ``revision``, only if it is still
        the latest (``CasConflict`` otherwise)."""
        try:
            await self.raw.delete(key, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise CasConflict(
                f"{self.bucket}/{key}: revision {revision} is no longer the latest"
            ) from exc

    async def items(self) -> dict[str, Entry[T]]:
        """Every current (decodable) value. An empty bucket gives {}.

        Why not nats-py's "initial values done" marker: it is decided from consumer info taken
        while the first messages may already be in flight, and can come *before* them (seen on a
        cold start: a bucket holding one key read as empty). Instead the bucket's stream says
        whether anything is there, and the read ends at the message with nothing pending after
        it; delete markers are read too, and drop their key.
        """
        info = await self.bus.js.stream_info(f"KV_{self.bucket}")
        if info.state.messages == 0:
            return {}
        watcher = await self.raw.watchall()
        out: dict[str, Entry[T]] = {}
        try:
            while True:
                e = await watcher.updates(timeout=ITEMS_TIMEOUT_S)
                if e is None:  # the marker may race ahead of the entries: rely on delta
                    continue
                if e.operation in ("DEL", "PURGE"):
                    out.pop(e.key, None)
                else:
                    value = await self._decode(e.key, e.value, e.revision)
                    if value is not None:
                        out[e.key] = Entry(value, e.revision)
                if not e.delta:
                    break
        except nats.errors.TimeoutError:
            # the bucket was emptied or purged while we read: what we have is its state
            pass
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()
        return out

    async def purge_deletes(self, older_than_s: float = 1800.0) -> int:
        """Remove the delete markers older than ``older_than_s``; returns how many went.

        Why: with history 1 a deleted key still holds its marker (about 100 bytes). The ledger
        gets one per finished job, and a bucket at its ``max_bytes`` refuses writes, so its
        owner calls this now and then. Safe against a writer in between: each purge removes
        the key's messages only up to its marker's revision, so a value written after the
        marker stays. A watcher that saw the delete loses nothing; one that starts later
        simply never sees that key.
        """
        stream = f"KV_{self.bucket}"
        info = await self.bus.js.stream_info(stream)
        if info.state.messages == 0:
            return 0
        now = time.time()
        old: list[tuple[str, int]] = []
        watcher = await self.raw.watchall(headers_only=True)
        try:
            while True:
                e = await watcher.updates(timeout=ITEMS_TIMEOUT_S)
                if e is None:
                    continue
                if e.operation in _DELETE_OPS and _age_s(e.created, now) >= older_than_s:
                    old.append((e.key, e.revision))
                if not e.delta:
                    break
        except nats.errors.TimeoutError:
            pass
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()
        for key, revision in old:
            await self.bus.js.purge_stream(
                stream, seq=revision + 1, subject=f"$KV.{self.bucket}.{key}"
            )
        return len(old)

    async def watch(
        self,
        handler: Callable[[str, T | None], Awaitable[None]],
        *,
        key: str = ">",
        include_current: bool = True,
        wedged_after_s: float = WEDGED_AFTER_S,
    ) -> KvWatch:
        """Call ``handler(key, value)`` for every change (value None = deleted), in order.

        With ``include_current`` the current value of each key is delivered first, and this
        returns only once they have all been handled: a reader can build its state from the
        watch alone, with no gap between a snapshot and the updates. A value that does not
        decode is dead-lettered and skipped; a handler exception is logged and dead-lettered
        (the watch has no redelivery); either way the watch goes on. The watch is a health
        check of the bus (``kv-watch:<bucket>:<key>``): it fails if the task ends other than
        by ``stop()``, or one change is in the handler longer than ``wedged_after_s``.

        Caught up means: the entry with nothing pending after it was handled, or, when the
        bucket held nothing under ``key`` as the watch began, nats-py's initial-values marker.
        The marker alone is not trusted when something is there: it is decided from consumer
        info taken while the first messages may be in flight, and can come before them (seen
        under load: ``watch()`` returned before the current value was handled), as ``items``
        found before.
        """
        expect_current = await self._holds_any(key)
        watcher = await self.raw.watch(key)
        log = self.bus.log.bind(bucket=self.bucket)
        caught_up = asyncio.Event()
        name = f"kv-watch:{self.bucket}:{key}"
        monitor = self.bus._monitor(name, wedged_after_s=wedged_after_s, idle_ok=True)

        async def loop() -> None:
            initial = True
            try:
                async for e in watcher:
                    if e is None:  # the marker: trusted only over an empty bucket (docstring)
                        if initial and not expect_current:
                            initial = False
                            caught_up.set()
                        continue
                    if not initial or include_current:
                        monitor.begin()
                        try:
                            await self._deliver(e, handler, log)
                        except asyncio.CancelledError:
                            raise
                        except Exception as exc:  # a bug here must not end the watch
                            log.exception("kv_watch_entry_failed", key=e.key, error=repr(exc))
                        finally:
                            monitor.end()
                    if initial and not e.delta:  # the last current value: caught up
                        initial = False
                        caught_up.set()
                monitor.ended("the watcher stopped")
            finally:
                caught_up.set()  # never leave watch() waiting on a loop that is gone

        task = monitor.attach(asyncio.create_task(loop(), name=name))
        handle = KvWatch(watcher, task, monitor)
        self.bus._track_watcher(handle)
        try:
            await asyncio.wait_for(caught_up.wait(), CATCH_UP_TIMEOUT_S)
        except TimeoutError:
            log.warning("kv_watch_catch_up_slow", timeout_s=CATCH_UP_TIMEOUT_S)
        return handle

    async def _holds_any(self, key: str) -> bool:
        """Whether the bucket holds any message under ``key`` (a value or a delete marker):
        the whole stream's count for ``>``, a subject-filtered count otherwise."""
        stream = f"KV_{self.bucket}"
        if key == ">":
            return (await self.bus.js.stream_info(stream)).state.messages > 0
        info = await self.bus.js.stream_info(stream, subjects_filter=f"$KV.{self.bucket}.{key}")
        return bool(info.state.subjects)

    async def _deliver(
        self, e: Any, handler: Callable[[str, T | None], Awaitable[None]], log: Any
    ) -> None:
        """One change to ``handler``: decoded (or None for a deletion), or dead-lettered."""
        if e.operation in _DELETE_OPS:
            value: T | None = None
        else:
            value = await self._decode(e.key, e.value, e.revision)
            if value is None:
                return
        try:
            await handler(e.key, value)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("kv_watch_handler_failed", key=e.key, error=repr(exc))
            await self.bus.dead_letter(
                f"$KV.{self.bucket}.{e.key}",
                e.value or b"",
                f"handler failed: {exc!r}",
                pattern=f"kv.{self.bucket}",
                msg_id=f"kv-{self.bucket}-{e.key}-{e.revision}-handler",
                kind="handler",
            )


def _age_s(created: Any, now: float) -> float:
    """Seconds since a KV entry's ``created`` (a datetime in nats-py; 0 when unknown)."""
    if isinstance(created, datetime.datetime):
        return now - created.timestamp()
    return 0.0
