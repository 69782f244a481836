"""Typed KV with revisions, watch, dead-lettering of bad values, and the lease."""

from __future__ import annotations

import asyncio

import pytest

from libs.bus import Bus, CasConflict, KeyExists, Lease, LeaseRecord
from proto import subjects
from proto.decisions import DeadLetter
from proto.ledger import Allocation
from proto.nodes import NodeSpec
from tests.bus.conftest import wait_for


def _node(node_id: str, gpus: int = 4) -> NodeSpec:
    return NodeSpec(
        id=node_id,
        gpu_model="t4",
        gpu_count=gpus,
        gpu_mem_gb=16,
        host_mem_gb=128,
        cpus=32,
        idle_power_w=10,
        max_power_w=70,
    )


async def test_get_put_create_update_delete(bus: Bus) -> None:
    kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    assert await kv.get("n1") is None
    assert await kv.items() == {}
    rev1 = await kv.create("n1", _node("n1"))
    with pytest.raises(KeyExists):
        await kv.create("n1", _node("n1", 8))
    entry = await kv.get("n1")
    assert entry is not None and entry.value == _node("n1") and entry.revision == rev1
    rev2 = await kv.update("n1", _node("n1", 8), rev1)
    assert rev2 > rev1
    with pytest.raises(CasConflict):
        await kv.update("n1", _node("n1", 2), rev1)  # stale revision
    assert (await kv.get("n1")).value.gpu_count == 8  # type: ignore[union-attr]
    await kv.put("n2", _node("n2"))
    items = await kv.items()
    assert set(items) == {"n1", "n2"} and items["n1"].revision == rev2
    await kv.delete("n1")
    assert await kv.get("n1") is None
    assert set(await kv.items()) == {"n2"}
    await kv.create("n1", _node("n1"))  # a deleted key may be created again


async def test_undecodable_value_is_dead_lettered_and_skipped(bus: Bus) -> None:
    letters: list[DeadLetter] = []

    async def on_letter(d: DeadLetter) -> None:
        letters.append(d)

    await bus.consume(subjects.STREAM_DLQ, subjects.dlq(bus.service), DeadLetter, on_letter)
    kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    await kv.put("good", _node("good"))
    await kv.raw.put("bad", b'{"id": 1}')
    assert set(await kv.items()) == {"good"}
    assert await kv.get("bad") is None
    await wait_for(lambda: len(letters) >= 1, what="dead letter for the bad value")
    await asyncio.sleep(0.1)
    assert len(letters) == 1  # same revision read twice: deduplicated
    assert letters[0].subject == "$KV.nodes.bad" and letters[0].data == b'{"id": 1}'


async def test_watch_sees_current_values_updates_and_deletes(bus: Bus) -> None:
    kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    await kv.put("a", _node("a"))
    seen: list[tuple[str, int | None]] = []

    async def on_change(key: str, value: NodeSpec | None) -> None:
        seen.append((key, value.gpu_count if value else None))

    watch = await kv.watch(on_change)
    assert seen == [("a", 4)]  # current values are handled before watch() returns
    await kv.put("b", _node("b", 2))
    await kv.delete("a")
    await wait_for(lambda: len(seen) == 3, what="three changes")
    assert seen == [("a", 4), ("b", 2), ("a", None)]
    await watch.stop()
    late: list[str] = []

    async def on_late(key: str, value: NodeSpec | None) -> None:
        late.append(key)

    only_new = await kv.watch(on_late, include_current=False)
    await kv.put("c", _node("c"))
    await wait_for(lambda: late == ["c"], what="only the new key")
    await only_new.stop()


class _MarkerFirst:
    """A real watcher whose initial-values marker comes before the entries (the race nats-py's
    consumer-info check allows), made certain instead of rare."""

    def __init__(self, real) -> None:  # type: ignore[no-untyped-def]
        self.real = real

    async def stop(self) -> None:
        await self.real.stop()

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        yield None
        async for e in self.real:
            if e is not None:
                yield e


async def test_watch_waits_for_the_current_values_when_the_marker_races_ahead(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    for k in range(3):
        await kv.put(f"n{k}", _node(f"n{k}"))
    raw_watch = kv.raw.watch

    async def marker_first(key: str, **kw):  # type: ignore[no-untyped-def]
        real = await raw_watch(key, **kw)
        await asyncio.sleep(0.2)  # the entries are late
        return _MarkerFirst(real)

    monkeypatch.setattr(kv.raw, "watch", marker_first)
    seen: list[str] = []

    async def on_change(key: str, value: NodeSpec | None) -> None:
        seen.append(key)

    watch = await kv.watch(on_change)
    assert seen == ["n0", "n1", "n2"]
    await watch.stop()
    fresh: list[str] = []

    async def on_fresh(key: str, value: NodeSpec | None) -> None:
        fresh.append(key)

    only_new = await kv.watch(on_fresh, include_current=False)
    await kv.put("n1", _node("n1", 2))
    await wait_for(lambda: fresh == ["n1"], what="the update alone, no current value")
    await only_new.stop()


async def test_watch_of_one_key_returns_at_once_when_absent_and_after_it_when_present(
    bus: Bus,
) -> None:
    kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    await kv.put("other", _node("other"))
    seen: list[str] = []

    async def on_change(key: str, value: NodeSpec | None) -> None:
        seen.append(key)

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    absent = await kv.watch(on_change, key="missing")
    assert seen == [] and loop.time() - t0 < 5.0  # the marker is trusted: nothing was there
    await kv.put("missing", _node("missing"))
    await wait_for(lambda: seen == ["missing"], what="the key's first value")
    await absent.stop()
    present = await kv.watch(on_change, key="other")
    assert seen == ["missing", "other"]
    await present.stop()


async def test_lease_second_holder_waits_until_release(bus: Bus) -> None:
    kv = await bus.kv(subjects.KV_LEASES, LeaseRecord)
    first = Lease(kv, "placer", "p1", ttl_s=2.0, poll_s=0.05)
    second = Lease(kv, "placer", "p2", ttl_s=2.0, poll_s=0.05)
    await first.acquire()
    assert first.is_held
    waiter = asyncio.create_task(second.acquire())
    await asyncio.sleep(0.3)
    assert not waiter.done() and not second.is_held
    await first.release()
    await asyncio.wait_for(waiter, 5.0)
    assert second.is_held and not first.is_held
    await second.release()


async def test_lease_is_taken_over_after_expiry_and_old_holder_learns(bus: Bus) -> None:
    kv = await bus.kv(subjects.KV_LEASES, LeaseRecord)
    first = Lease(kv, "placer", "p1", ttl_s=0.6, poll_s=0.05)
    assert await first.try_acquire()  # held, but nobody renews it (a crashed holder)
    second = Lease(kv, "placer", "p2", ttl_s=0.6, poll_s=0.05)
    assert not await second.try_acquire()
    await asyncio.wait_for(second.acquire(), 5.0)
    assert second.is_held
    assert not first.is_held  # its own expiry passed
    assert not await first.renew()  # CAS on its stale revision fails
    assert first.lost.is_set()
    await second.release()


async def test_renewal_keeps_the_lease(bus: Bus) -> None:
    kv = await bus.kv(subjects.KV_LEASES, LeaseRecord)
    holder = Lease(kv, "placer", "p1", ttl_s=0.6, poll_s=0.05)
    await asyncio.wait_for(holder.acquire(), 10.0)  # a lost connection fails, not hangs
    assert holder.last_error is None
    other = Lease(kv, "placer", "p2", ttl_s=0.6, poll_s=0.05)
    for _ in range(8):  # well past the ttl
        await asyncio.sleep(0.15)
        assert not await other.try_acquire()
    assert holder.is_held
    await holder.release()


class _RenewalSwallowsCancel:
    """The real KV, except that a renewal cancelled mid-write finishes the write and returns, as
    nats-py's ``wait_for`` does on Python 3.11 when the reply lands in the same loop turn."""

    def __init__(self, kv: object) -> None:
        self._kv = kv
        self.swallowed = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._kv, name)

    async def update(self, key: str, value: LeaseRecord, revision: int) -> int:
        try:
            await asyncio.sleep(0.3)  # slow enough that release() cancels it here
        except asyncio.CancelledError:
            self.swallowed += 1  # and carry on as if the reply had won the race
        return await self._kv.update(key, value, revision)  # type: ignore[attr-defined]


async def test_release_ends_a_renewer_whose_cancellation_was_swallowed(bus: Bus) -> None:
    kv = await bus.kv(subjects.KV_LEASES, LeaseRecord)
    swallowing = _RenewalSwallowsCancel(kv)
    holder = Lease(swallowing, "placer", "p1", ttl_s=0.6, poll_s=0.05)  # type: ignore[arg-type]
    await asyncio.wait_for(holder.acquire(), 10.0)
    await asyncio.sleep(0.3)  # the renewer is inside update now
    await asyncio.wait_for(holder.release(), 5.0)  # waited for good before cancel_and_wait
    assert swallowing.swallowed >= 1
    assert not holder.is_held
    assert await kv.get("placer") is None  # deleted with the revision the last renewal wrote


def _alloc(job_id: str, node: str) -> Allocation:
    return Allocation(
        job_id=job_id,
        node=node,
        gpu_indices=(0,),
        gpu_share=1.0,
        gpu_mem_gb=8.0,
        host_mem_gb=16.0,
        cpus=4.0,
        time=1.0,
    )


async def test_purge_deletes_drops_old_markers_and_keeps_newer_values(bus: Bus) -> None:
    kv = await bus.kv(subjects.KV_LEDGER, Allocation)
    for i in range(5):
        await kv.put(f"j{i}", _alloc(f"j{i}", "n1"))
    for i in range(4):
        await kv.delete(f"j{i}")
    await kv.put("j0", _alloc("j0", "n2"))  # written again after its delete
    stream = f"KV_{subjects.KV_LEDGER}"
    assert (await bus.js.stream_info(stream)).state.messages == 5  # j0, 3 markers, j4
    assert await kv.purge_deletes(older_than_s=3600) == 0  # none old enough
    assert await kv.purge_deletes(older_than_s=0) == 3  # j1..j3; j0 has a value again
    assert (await bus.js.stream_info(stream)).state.messages == 2
    assert set(await kv.items()) == {"j0", "j4"}
    assert (await kv.get("j0")).value.node == "n2"  # type: ignore[union-attr]
