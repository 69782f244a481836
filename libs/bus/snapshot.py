"""Read-model snapshots in the JetStream Object Store: restart from the newest one, replay the rest.

Why: a read model (the gateway's jobs, later the scorer's pending set) used to rebuild itself by
replaying its stream from the first message on every start. That costs time proportional to the
cluster's whole history, and once streams have retention limits it is no longer even correct:
events that aged out are gone. So a service saves its model as bytes together with the stream
sequence the bytes reflect, and on start loads that and replays only from the next sequence.

Why the Object Store and not KV: a snapshot is tens of MB at 100k jobs, beyond the NATS payload
limit; the Object Store chunks it, and its ``put`` publishes the metadata message (with a
rollup) only after every chunk is stored, so a reader sees either the old snapshot or the new
one, never half of one. One object per key (``<service>.<model>``); a put purges the old chunks.

Which sequence a snapshot reflects: the consumer's *ack floor*, read from the server just before
the model is encoded. Every message at or below it has been handled (acked after its handler
returned), so the encoded model covers all of them; it may also cover a few messages after it,
which a restart replays again. That is why a model saved here must fold idempotently (a repeat of
an event it has seen changes nothing): the same property a replayed read model needs anyway for
redeliveries. A message that is being retried keeps the floor below it, so a restart retries it.

Never fatal: a snapshot that is missing, does not decode, belongs to another incarnation of the
stream or is ahead of it is ignored with a log line, and the service replays from the start.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
import nats.js.errors
from nats.js import api

from libs.bus.connection import Bus, Consumer
from libs.bus.tasks import cancel_and_wait
from libs.bus.topology import stream_replicas
from libs.obs.logging import get_logger
from proto import subjects

M = TypeVar("M")

ENVELOPE_FORMAT = 1  # bump when SnapshotEnvelope changes shape; older ones are then ignored
BUCKET_MAX_BYTES = 4 << 30  # the bucket's cap: a put past it is refused, the old snapshot stays
DEFAULT_EVERY_EVENTS = 10_000  # save after this many applied events ...
DEFAULT_EVERY_S = 60.0  # ... or this long after the first unsaved event, whichever comes first
_CHECK_S = 1.0  # how often the writer looks at the two triggers
_STREAM_NAME_IN_USE = 10058


class SnapshotEnvelope(msgspec.Struct, kw_only=True, frozen=True):
    """What is stored: the model's bytes (its own versioned encoding) and where they stand.

    ``stream_created`` tells a snapshot of this stream from one of a stream that was deleted and
    created again (whose sequences mean something else)."""

    format: int
    key: str
    stream: str
    stream_created: str
    seq: int  # every message of ``stream`` up to this sequence is folded into ``body``
    saved_at: float  # unix seconds, for logs and operators
    body: bytes


@dataclass(frozen=True)
class Restored(Generic[M]):
    """The outcome of ``SnapshotStore.restore``: the model (None: start empty) and where the
    consumer starts (None: from the stream's beginning)."""

    model: M | None
    start_seq: int | None
    gap: int = 0  # messages that aged out between the snapshot and the stream's first message


async def ensure_snapshot_bucket(bus: Bus) -> None:
    """Create the ``snapshots`` object store if missing (idempotent; several services may race).

    Kept here rather than in ``Bus.ensure_topology`` so the topology code needs no object-store
    case; a service that snapshots calls it at start.
    """
    config = api.ObjectStoreConfig(
        bucket=subjects.OBJ_SNAPSHOTS,
        description="read-model snapshots, one object per service model (libs.bus.snapshot)",
        storage=api.StorageType.FILE,
        max_bytes=BUCKET_MAX_BYTES,
        replicas=stream_replicas(),
    )
    try:
        await bus.js.create_object_store(subjects.OBJ_SNAPSHOTS, config=config)
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != _STREAM_NAME_IN_USE:
            raise
        bus.log.warning("snapshot_bucket_config_differs", error=str(exc))


async def _stream_identity(bus: Bus, stream: str) -> tuple[str, int, int]:
    """(creation time, first sequence, last sequence) of ``stream`` as the server has it."""
    info = await bus.js.stream_info(stream)
    created = getattr(info, "created", None)
    return str(created or ""), info.state.first_seq, info.state.last_seq


class SnapshotStore:
    """Load and save one read model's snapshot (object ``key`` in the ``snapshots`` bucket)."""

    def __init__(self, bus: Bus, key: str, stream: str) -> None:
        self.bus = bus
        self.key = key
        self.stream = stream
        self.log = get_logger(service=bus.service, component="snapshot", key=key)

    async def save(self, seq: int, body: bytes) -> int:
        """Store ``body`` as reflecting ``stream`` up to ``seq``; returns the bytes written."""
        created, _, _ = await _stream_identity(self.bus, self.stream)
        env = SnapshotEnvelope(
            format=ENVELOPE_FORMAT,
            key=self.key,
            stream=self.stream,
            stream_created=created,
            seq=seq,
            saved_at=time.time(),
            body=body,
        )
        data = msgspec.msgpack.encode(env)
        meta = api.ObjectMeta(name=self.key, headers={"Mosaic-Stream-Seq": str(seq)})
        obs = await self.bus.js.object_store(subjects.OBJ_SNAPSHOTS)
        await obs.put(self.key, data, meta=meta)
        return len(data)

    async def load(self) -> SnapshotEnvelope | None:
        """The stored envelope, or None (missing, unreadable, another format: logged)."""
        try:
            obs = await self.bus.js.object_store(subjects.OBJ_SNAPSHOTS)
            result = await obs.get(self.key)
        except nats.js.errors.ObjectNotFoundError:
            self.log.info("snapshot_absent")
            return None
        except Exception as exc:  # no bucket, a chunk missing, digest mismatch, NATS trouble
            self.log.warning("snapshot_unreadable", error=repr(exc))
            return None
        try:
            env = msgspec.msgpack.decode(result.data or b"", type=SnapshotEnvelope)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.log.warning("snapshot_undecodable", error=str(exc))
            return None
        if env.format != ENVELOPE_FORMAT or env.key != self.key or env.stream != self.stream:
            self.log.warning("snapshot_foreign", format=env.format, key=env.key, stream=env.stream)
            return None
        return env

    async def restore(self, decode: Callable[[bytes], M]) -> Restored[M]:
        """The model to start from and the sequence to consume from; never raises for a bad
        snapshot (``decode`` may raise anything: that snapshot is then ignored)."""
        env = await self.load()
        if env is None:
            return Restored(None, None)
        created, first, last = await _stream_identity(self.bus, self.stream)
        if env.stream_created != created or env.seq > last:
            self.log.warning(
                "snapshot_of_another_stream",
                seq=env.seq,
                last_seq=last,
                snapshot_stream_created=env.stream_created,
                stream_created=created,
            )
            return Restored(None, None)
        try:
            model = decode(env.body)
        except Exception as exc:
            self.log.warning("snapshot_body_undecodable", seq=env.seq, error=repr(exc))
            return Restored(None, None)
        gap = max(0, first - (env.seq + 1))
        if gap:
            self.log.warning("snapshot_gap", seq=env.seq, first_seq=first, lost_messages=gap)
        self.log.info("snapshot_restored", seq=env.seq, bytes=len(env.body), last_seq=last)
        return Restored(model, env.seq + 1, gap)


async def ack_floor(consumer: Consumer) -> int:
    """The highest stream sequence below which ``consumer`` has acked everything. A consumer
    created at ``opt_start_seq`` S starts with S - 1, so this also holds mid-stream."""
    info = await consumer.sub.consumer_info()
    return int(info.ack_floor.stream_seq or 0) if info.ack_floor is not None else 0


class Snapshotter:
    """Saves a model every ``every_events`` applied events or ``every_s`` seconds after the
    first unsaved one (whichever comes first), and once more on ``stop``.

    The service calls ``note()`` for each event its handler applied. ``encode`` is called on
    the event loop between handlers, so it sees a consistent model; it must be synchronous.
    """

    def __init__(
        self,
        store: SnapshotStore,
        consumer: Consumer,
        encode: Callable[[], bytes],
        *,
        every_events: int = DEFAULT_EVERY_EVENTS,
        every_s: float = DEFAULT_EVERY_S,
        floor: Callable[[Consumer], Awaitable[int]] = ack_floor,
        saved_seq: int = 0,
    ) -> None:
        if every_events < 1 or every_s <= 0:
            raise ValueError(f"every_events >= 1 and every_s > 0, got {every_events}, {every_s}")
        self.store = store
        self.consumer = consumer
        self.encode = encode
        self.every_events = every_events
        self.every_s = every_s
        self._floor = floor
        self.saved_seq = saved_seq  # the sequence of the newest snapshot stored
        self.saves = 0
        self.last_bytes = 0
        self._unsaved = 0
        self._dirty_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def note(self, n: int = 1) -> None:
        """``n`` more events folded in since the last save."""
        self._unsaved += n
        if self._dirty_since is None:
            self._dirty_since = time.monotonic()

    def due(self) -> bool:
        if self._unsaved >= self.every_events:
            return True
        started = self._dirty_since
        return started is not None and time.monotonic() - started >= self.every_s

    def start(self) -> Snapshotter:
        self._task = asyncio.create_task(self._run(), name=f"snapshot:{self.store.key}")
        return self

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(min(_CHECK_S, self.every_s))
            if self.due():
                await self.save_now()

    async def save_now(self) -> bool:
        """Save if anything was acked since the last snapshot; False when nothing was written
        (nothing new, or the store failed: logged, and tried again ``every_s`` later)."""
        async with self._lock:
            try:
                seq = await self._floor(self.consumer)
                if seq <= self.saved_seq:
                    return False
                unsaved = self._unsaved
                body = self.encode()  # synchronous: the model as of (at least) ``seq``
                self.last_bytes = await self.store.save(seq, body)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.store.log.warning("snapshot_save_failed", error=repr(exc))
                self._dirty_since = time.monotonic()  # no retry storm: wait a full period
                self._unsaved = min(self._unsaved, self.every_events - 1)
                return False
            self._unsaved -= min(unsaved, self._unsaved)
            self._dirty_since = time.monotonic() if self._unsaved else None
            self.saved_seq = seq
            self.saves += 1
            self.store.log.info("snapshot_saved", seq=seq, bytes=self.last_bytes)
            return True

    async def stop(self, *, final: bool = True) -> None:
        """End the periodic writer; with ``final``, save what is new (a clean shutdown)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if final:
            await self.save_now()


@dataclass(frozen=True)
class SnapshotSettings:
    """Whether and how often a service saves a stream-fed model. The environment is the one the
    gateway reads too (MOSAIC_SNAPSHOTS=0 turns snapshots off, MOSAIC_SNAPSHOT_EVERY_EVENTS,
    MOSAIC_SNAPSHOT_EVERY_S), so one setting covers every service of a stack."""

    enabled: bool = True
    every_events: int = DEFAULT_EVERY_EVENTS
    every_s: float = DEFAULT_EVERY_S

    @classmethod
    def from_env(cls) -> SnapshotSettings:
        def number(name: str, default: float) -> float:
            raw = os.environ.get(name) or str(default)
            try:
                return float(raw)
            except ValueError:
                raise SystemExit(f"{name} must be a number, got {raw!r}") from None

        return cls(
            enabled=os.environ.get("MOSAIC_SNAPSHOTS", "1") not in ("0", "false", "no"),
            every_events=int(number("MOSAIC_SNAPSHOT_EVERY_EVENTS", DEFAULT_EVERY_EVENTS)),
            every_s=number("MOSAIC_SNAPSHOT_EVERY_S", DEFAULT_EVERY_S),
        )


class SnapshotFollower:
    """One model fed by one stream: restored from its snapshot, consumed from the message after
    it, saved by a ``Snapshotter``. The wiring the scorer and the placer share (the gateway, with
    two models, has its own), so each says only which model and which object key.

    Why never fatal: a service that cannot use the bucket (no permission, the store full) runs
    from a full replay, as it did before snapshots, and says so in its log."""

    def __init__(
        self, bus: Bus, key: str, stream: str, settings: SnapshotSettings | None = None
    ) -> None:
        self.bus = bus
        self.key = key
        self.stream = stream
        self.settings = settings or SnapshotSettings()
        self.store: SnapshotStore | None = None  # made in ``follow`` (a bus is needed then only)
        self.snapshotter: Snapshotter | None = None
        self.restored: Restored[Any] | None = None  # None: no snapshot was tried
        self.handled = 0  # messages handled since start (what a restart cost)

    async def follow(
        self,
        subject: str,
        type_: Any,
        handler: Callable[[Any], Awaitable[None]],
        load: Callable[[bytes], Any],
        encode: Callable[[], bytes],
    ) -> Consumer:
        """Restore the model with ``load`` (it replaces the model's content, or raises), then
        consume ``subject`` of the stream from where the snapshot left off (or its start)."""
        store = self.store = SnapshotStore(self.bus, self.key, self.stream)
        enabled = self.settings.enabled
        if enabled:
            try:
                await ensure_snapshot_bucket(self.bus)
            except Exception as exc:
                store.log.warning("snapshots_unavailable", error=repr(exc))
                enabled = False
        start_seq = None
        if enabled:
            self.restored = await store.restore(load)
            start_seq = self.restored.start_seq

        async def counted(value: Any) -> None:
            self.handled += 1
            await handler(value)
            if self.snapshotter is not None:
                self.snapshotter.note()

        consumer = await self.bus.consume(
            self.stream, subject, type_, counted, durable=None, opt_start_seq=start_seq
        )
        if enabled:
            self.snapshotter = Snapshotter(
                store,
                consumer,
                encode,
                every_events=self.settings.every_events,
                every_s=self.settings.every_s,
                saved_seq=(start_seq or 1) - 1,
            ).start()
        return consumer

    async def stop(self) -> None:
        """A clean stop: save what is new, so the next start replays nothing."""
        if self.snapshotter is not None:
            await self.snapshotter.stop(final=True)
            self.snapshotter = None
