"""Retention on every stream and KV bucket (issue 12, item 8), as the server reports it."""

from __future__ import annotations

import pytest
from nats.js import api

from libs.bus import Bus, BusError
from libs.bus.topology import bucket_max_bytes, stream_limits
from proto import subjects
from proto.events import Started


async def test_every_stream_and_bucket_is_bounded_on_the_server(bus: Bus) -> None:
    for name in subjects.STREAMS:
        cfg = (await bus.js.stream_info(name)).config
        want = subjects.STREAM_LIMITS[name]
        assert cfg.max_age == want.max_age_s > 0, name
        assert cfg.max_bytes == want.max_bytes > 0, name
        assert cfg.max_msgs == want.max_msgs, name
        assert cfg.discard == api.DiscardPolicy.OLD
    dlq = (await bus.js.stream_info(subjects.STREAM_DLQ)).config
    assert (dlq.max_age, dlq.max_bytes) == (7 * 86_400, 256 * 1024**2)
    for bucket in subjects.KV_BUCKETS:
        cfg = (await bus.js.stream_info(f"KV_{bucket}")).config
        assert cfg.max_bytes == subjects.kv_max_bytes(bucket) > 0, bucket


async def test_operator_overrides_from_the_environment(nats_url: str) -> None:
    env = {
        "MOSAIC_STREAM_DLQ_MAX_BYTES": "1MiB",
        "MOSAIC_STREAM_DLQ_MAX_MSGS": "3",
        "MOSAIC_STREAM_JOBS_MAX_AGE_S": "3600",
        "MOSAIC_KV_LEDGER_MAX_BYTES": "2MiB",
    }
    bus = await Bus.connect(nats_url, "ops")
    try:
        await bus.ensure_topology(env)
        dlq = (await bus.js.stream_info(subjects.STREAM_DLQ)).config
        assert (dlq.max_bytes, dlq.max_msgs) == (1024**2, 3)
        assert (await bus.js.stream_info(subjects.STREAM_JOBS)).config.max_age == 3600
        ledger = (await bus.js.stream_info(f"KV_{subjects.KV_LEDGER}")).config
        assert ledger.max_bytes == 2 * 1024**2
        # the DLQ really is bounded: five letters, the three newest kept
        for i in range(5):
            await bus.dead_letter("x.y", f"junk {i}".encode(), "test")
        state = (await bus.js.stream_info(subjects.STREAM_DLQ)).state
        assert (state.messages, state.first_seq) == (3, 3)
    finally:
        await bus.close()


async def test_old_unbounded_stream_and_bucket_are_updated_in_place(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, "old")
    try:
        # what an older version created: no limits at all
        await bus.js.add_stream(
            name=subjects.STREAM_LIFECYCLE, subjects=list(subjects.STREAM_LIFECYCLE_SUBJECTS)
        )
        await bus.js.create_key_value(bucket=subjects.KV_LEDGER, history=1)
        await bus.publish("lifecycle.j", Started(job_id="j", time=1.0))
        ledger = await bus.js.key_value(subjects.KV_LEDGER)
        await ledger.put("j", b"{}")
        assert (await bus.js.stream_info(subjects.STREAM_LIFECYCLE)).config.max_bytes == -1
        await bus.ensure_topology()
        info = await bus.js.stream_info(subjects.STREAM_LIFECYCLE)
        assert info.config.max_bytes == subjects.STREAM_LIFECYCLE_LIMITS.max_bytes
        assert info.state.messages == 1  # nothing lost
        kv = await bus.js.stream_info(f"KV_{subjects.KV_LEDGER}")
        assert kv.config.max_bytes == subjects.kv_max_bytes(subjects.KV_LEDGER)
        assert (await ledger.get("j")).value == b"{}"
    finally:
        await bus.close()


async def test_limits_the_server_has_no_room_for_fail_loudly(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, "greedy")
    try:
        with pytest.raises(BusError, match="MOSAIC_STREAM_DLQ_MAX_BYTES"):
            await bus.ensure_topology({"MOSAIC_STREAM_DLQ_MAX_BYTES": str(2**62)})
    finally:
        await bus.close()


def test_limit_parsing() -> None:
    assert stream_limits("DLQ", {}) == subjects.STREAM_DLQ_LIMITS
    assert stream_limits("NEW", {}) == subjects.STREAM_DEFAULT_LIMITS  # not listed: bounded too
    assert stream_limits("DLQ", {"MOSAIC_STREAM_DLQ_MAX_BYTES": "-1"}).max_bytes == -1
    assert bucket_max_bytes("tenants", {}) == subjects.KV_DEFAULT_MAX_BYTES
    assert bucket_max_bytes("my-bucket", {"MOSAIC_KV_MY_BUCKET_MAX_BYTES": "1KiB"}) == 1024
    with pytest.raises(ValueError):
        stream_limits("DLQ", {"MOSAIC_STREAM_DLQ_MAX_AGE_S": "-5"})
    with pytest.raises(ValueError):
        bucket_max_bytes("nodes", {"MOSAIC_KV_NODES_MAX_BYTES": "0"})
