"""Read-model snapshots against a real nats-server: save/load through the Object Store, resuming a
consumer after the snapshot, and every way a snapshot can be unusable (absent, corrupt, of another
stream, older than the stream's first message) ending in a warning, never a failed start."""

from __future__ import annotations

import msgspec
import pytest
from structlog.testing import capture_logs

from libs.bus import Bus
from libs.bus.replay import wait_caught_up
from libs.bus.server import start_nats_server
from libs.bus.snapshot import (
    Restored,
    SnapshotEnvelope,
    SnapshotFollower,
    SnapshotSettings,
    SnapshotStore,
    Snapshotter,
    ack_floor,
    ensure_snapshot_bucket,
)
from proto import subjects
from proto.events import LifecycleEvent, Queued
from tests.bus.conftest import wait_for

STREAM = subjects.STREAM_LIFECYCLE
KEY = "test.model"


async def publish(bus: Bus, n: int, start: int = 0) -> None:
    """``n`` Queued events for jobs j<start>.. : stream sequences follow publication order."""
    for i in range(start, start + n):
        await bus.publish(subjects.lifecycle(f"j{i}"), Queued(job_id=f"j{i}", time=float(i)))


async def follow(bus: Bus, start_seq: int | None, into: list[str]):
    """A consumer of all of LIFECYCLE from ``start_seq`` that records the job ids it handles."""

    async def handle(event: LifecycleEvent) -> None:
        into.append(event.job_id)

    return await bus.consume(STREAM, "lifecycle.>", LifecycleEvent, handle, opt_start_seq=start_seq)


@pytest.fixture
async def store(bus: Bus) -> SnapshotStore:
    await ensure_snapshot_bucket(bus)
    await ensure_snapshot_bucket(bus)  # idempotent: a second service starting is no error
    return SnapshotStore(bus, KEY, STREAM)


async def test_a_snapshot_round_trips_and_the_consumer_resumes_after_it(bus, store):
    assert await store.restore(bytes.decode) == Restored(None, None)  # none yet: full replay
    await publish(bus, 5)
    await store.save(3, b"state at 3")
    env = await store.load()
    assert env is not None and (env.seq, env.body, env.key) == (3, b"state at 3", KEY)

    restored = await store.restore(bytes.decode)
    assert restored == Restored("state at 3", 4, 0)
    got: list[str] = []
    consumer = await follow(bus, restored.start_seq, got)
    assert await wait_caught_up(bus, consumer, STREAM, timeout_s=5.0)  # works mid-stream too
    assert got == ["j3", "j4"]  # sequences 4 and 5 only
    assert await ack_floor(consumer) == 5

    # a snapshot bigger than a NATS message replaces the old one whole
    big = bytes(range(256)) * 12_000  # ~3 MB, several Object Store chunks
    await store.save(5, big)
    env = await store.load()
    assert env is not None and env.seq == 5 and env.body == big
    status = await (await bus.js.object_store(subjects.OBJ_SNAPSHOTS)).status()
    assert status.stream_info.state.bytes < 2 * len(big)  # the old chunks are gone


async def test_a_consumer_resumed_at_the_end_is_caught_up_at_once(bus, store):
    await publish(bus, 3)
    await store.save(3, b"all of it")
    restored = await store.restore(bytes.decode)
    got: list[str] = []
    consumer = await follow(bus, restored.start_seq, got)
    assert await wait_caught_up(bus, consumer, STREAM, timeout_s=2.0)
    await publish(bus, 1, start=3)
    await wait_for(lambda: got == ["j3"], what="the next event after the snapshot")


@pytest.mark.parametrize(
    "stored",
    [b"\x00\xffnot msgpack", msgspec.msgpack.encode({"format": 1, "key": KEY}), b""],
    ids=["garbage", "missing-fields", "empty"],
)
async def test_a_corrupt_snapshot_is_ignored_with_a_warning(bus, store, stored):
    await publish(bus, 2)
    obs = await bus.js.object_store(subjects.OBJ_SNAPSHOTS)
    await obs.put(KEY, stored)
    with capture_logs() as logs:
        assert await store.restore(bytes.decode) == Restored(None, None)
    assert any(e["log_level"] == "warning" for e in logs), logs


async def test_a_body_its_model_cannot_read_means_a_full_replay(bus, store):
    await publish(bus, 2)
    await store.save(2, b"version 99")

    def refuse(body: bytes) -> str:
        raise ValueError(f"unknown model version in {body!r}")

    with capture_logs() as logs:
        assert await store.restore(refuse) == Restored(None, None)
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "snapshot_body_undecodable"
    ]


async def test_another_format_or_key_is_ignored(bus, store):
    await publish(bus, 2)
    obs = await bus.js.object_store(subjects.OBJ_SNAPSHOTS)
    env = SnapshotEnvelope(
        format=99, key=KEY, stream=STREAM, stream_created="", seq=1, saved_at=0.0, body=b"x"
    )
    await obs.put(KEY, msgspec.msgpack.encode(env))
    assert await store.restore(bytes.decode) == Restored(None, None)


async def test_a_snapshot_of_a_recreated_stream_is_ignored(bus, store):
    await publish(bus, 4)
    await store.save(4, b"old stream")
    await bus.js.delete_stream(STREAM)
    await bus.ensure_topology()
    await publish(bus, 6)  # sequences 1..6 again, but other events
    with capture_logs() as logs:
        assert await store.restore(bytes.decode) == Restored(None, None)
    assert "snapshot_of_another_stream" in [e["event"] for e in logs]


async def test_a_snapshot_older_than_the_stream_warns_with_the_gap_and_goes_on(bus, store):
    await publish(bus, 10)
    await store.save(3, b"state at 3")
    await bus.js.purge_stream(STREAM, keep=2)  # sequences 1..8 aged out: 4..8 never folded in
    with capture_logs() as logs:
        restored = await store.restore(bytes.decode)
    assert restored == Restored("state at 3", 4, 5)
    gap = [e for e in logs if e["event"] == "snapshot_gap"]
    assert gap and gap[0]["lost_messages"] == 5 and gap[0]["log_level"] == "warning"
    got: list[str] = []
    consumer = await follow(bus, restored.start_seq, got)
    assert await wait_caught_up(bus, consumer, STREAM, timeout_s=5.0)
    assert got == ["j8", "j9"]


async def test_the_snapshotter_saves_every_n_events_and_on_stop(bus, store):
    folded: set[str] = set()
    snapshotter: Snapshotter | None = None

    async def handle(event: LifecycleEvent) -> None:
        folded.add(event.job_id)  # idempotent, as a snapshotted model must be
        assert snapshotter is not None
        snapshotter.note()

    consumer = await bus.consume(STREAM, "lifecycle.>", LifecycleEvent, handle)
    snapshotter = Snapshotter(
        store, consumer, lambda: ",".join(sorted(folded)).encode(), every_events=3, every_s=60.0
    ).start()
    await publish(bus, 2)
    await wait_for(lambda: len(folded) == 2, what="two events")
    assert snapshotter.saves == 0 and not snapshotter.due()  # below both triggers
    for saves, (start, n) in enumerate([(2, 1), (3, 3)], start=1):
        await publish(bus, n, start=start)  # 3, then 6 events in all: a save each time
        await wait_for(lambda s=saves: snapshotter.saves == s, timeout_s=10.0, what="a save")
        env = await store.load()
        assert env is not None and env.seq >= start + n
        # the body covers at least every event up to the sequence it claims
        assert {f"j{i}" for i in range(env.seq)} <= set(env.body.decode().split(","))
    await publish(bus, 1, start=6)  # 7 in all, below the trigger: saved by stop

    assert await wait_caught_up(bus, consumer, STREAM, timeout_s=5.0)
    await snapshotter.stop(final=True)
    env = await store.load()
    assert env is not None and env.seq == 7 and env.body.decode().count(",") == 6
    assert not await snapshotter.save_now()  # nothing new: nothing written


async def test_the_snapshotter_saves_after_every_s_when_events_trickle(bus, store):
    got: list[str] = []
    consumer = await follow(bus, None, got)
    snapshotter = Snapshotter(
        store, consumer, lambda: str(len(got)).encode(), every_events=1000, every_s=0.2
    ).start()
    await publish(bus, 1)
    await wait_for(lambda: got == ["j0"], what="the event")
    snapshotter.note()
    await wait_for(lambda: snapshotter.saves == 1, timeout_s=5.0, what="a save by time")
    await snapshotter.stop(final=False)
    env = await store.load()
    assert env is not None and (env.seq, env.body) == (1, b"1")


async def test_a_snapshot_survives_a_nats_restart(tmp_path):
    """The stream's identity (its creation time) is the server's stored one, so a restarted
    server's stream still matches the snapshot: it is used, not replaced by a full replay."""
    restored = []
    for _ in range(2):
        server = start_nats_server(tmp_path / "nats")
        try:
            bus = await Bus.connect(server.url, "test")
            await bus.ensure_topology()
            await ensure_snapshot_bucket(bus)
            store = SnapshotStore(bus, KEY, STREAM)
            restored.append(await store.restore(bytes.decode))
            if not restored[-1].model:
                await publish(bus, 3)
                await store.save(3, b"before the restart")
            await bus.close()
        finally:
            server.stop()
    assert restored == [Restored(None, None), Restored("before the restart", 4, 0)]


class _Ids:
    """A model for the follower: the job ids handled, encoded as one line each."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    async def handle(self, event: LifecycleEvent) -> None:
        self.ids.append(event.job_id)

    def load(self, data: bytes) -> _Ids:
        self.ids = data.decode().split()
        return self

    def encode(self) -> bytes:
        return " ".join(self.ids).encode()


async def _follow(bus: Bus, model: _Ids, settings: SnapshotSettings) -> SnapshotFollower:
    f = SnapshotFollower(bus, KEY, STREAM, settings)
    consumer = await f.follow("lifecycle.>", LifecycleEvent, model.handle, model.load, model.encode)
    assert await wait_caught_up(bus, consumer, STREAM, timeout_s=10)
    return f


async def test_the_follower_restores_resumes_counts_and_saves_on_stop(bus):
    """What the scorer and the placer use: a second start restores the model and handles only
    the messages published after the first one stopped."""
    quiet = SnapshotSettings(every_events=1_000, every_s=3600.0)
    await publish(bus, 3)
    first = _Ids()
    f = await _follow(bus, first, quiet)
    assert (f.handled, f.restored) == (3, Restored(None, None))
    await f.stop()
    await publish(bus, 2, start=3)
    second = _Ids()
    g = await _follow(bus, second, quiet)
    assert g.handled == 2 and g.restored is not None and g.restored.start_seq == 4
    assert second.ids == ["j0", "j1", "j2", "j3", "j4"]
    await g.stop()
    await g.stop()  # a second stop is a no-op


async def test_a_follower_with_snapshots_off_replays_everything(bus, monkeypatch):
    monkeypatch.setenv("MOSAIC_SNAPSHOTS", "0")
    monkeypatch.setenv("MOSAIC_SNAPSHOT_EVERY_EVENTS", "7")
    off = SnapshotSettings.from_env()
    assert (off.enabled, off.every_events) == (False, 7)
    await publish(bus, 3)
    for _ in range(2):
        model = _Ids()
        f = await _follow(bus, model, off)
        assert f.handled == 3 and f.restored is None and f.snapshotter is None
        await f.stop()
    monkeypatch.setenv("MOSAIC_SNAPSHOT_EVERY_S", "soon")
    with pytest.raises(SystemExit, match="MOSAIC_SNAPSHOT_EVERY_S"):
        SnapshotSettings.from_env()
