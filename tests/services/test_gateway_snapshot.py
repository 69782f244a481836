"""The gateway's read models restart from snapshots, against a real nats-server.

A restarted gateway with a snapshot shows the same jobs and handles only the LIFECYCLE messages
published after it; a snapshot it cannot read means a full replay, one older than the stream's
first message a warning and the snapshot plus what is left. The bounded model (events kept per
job, expiry of finished jobs) is checked without NATS at the end.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import msgspec
from opentelemetry import trace
from structlog.testing import capture_logs

from libs.bus import Bus
from libs.bus.server import free_port
from libs.bus.snapshot import SnapshotStore
from libs.clock import Clock
from libs.obs.logging import get_logger
from proto import subjects
from proto.decisions import Decision
from proto.events import Checkpointed, Completed, Placed, Started, Submitted
from proto.jobs import JobSpec
from services.gateway.auth import Authenticator
from services.gateway.decisions_view import DecisionsModel
from services.gateway.jobs_view import JobsModel
from services.gateway.service import (
    SNAPSHOT_DECISIONS,
    SNAPSHOT_JOBS,
    Gateway,
    ReadModelConfig,
)
from tests.services._gateway_auth import ADMIN
from tests.services._gateway_model_size import measure
from tests.services.test_gateway import gateway, until

# long periods: in these tests only a clean stop writes a snapshot, so the counts are exact
QUIET = ReadModelConfig(every_events=1_000_000, every_s=3600.0)


@asynccontextmanager
async def running(nats_url: str, config: ReadModelConfig = QUIET) -> AsyncIterator[Gateway]:
    """A gateway's bus side on its own connection, caught up; stopped cleanly after."""
    bus = await Bus.connect(nats_url, "gateway")
    clock, tracer = Clock(epoch=time.time()), trace.get_tracer("test")
    gw = Gateway(bus, clock, get_logger(), tracer, Authenticator(admin_token=None), config)
    try:
        await gw.start()
        assert await gw.wait_caught_up(10.0)
        yield gw
        await gw.stop()
    finally:
        await bus.close()


async def history(bus: Bus, jobs: int, start: int = 0) -> int:
    """Submit ``jobs`` jobs and run the first to completion; the number of events published."""
    n = 0
    for i in range(start, start + jobs):
        jid = f"s-{i}"
        spec = JobSpec(id=jid, tenant="t", gpus=1, submit_time=float(i))
        await bus.publish(subjects.lifecycle(jid), Submitted(job_id=jid, time=float(i), spec=spec))
        n += 1
    first = f"s-{start}"
    for ev in (
        Placed(job_id=first, time=100.0, node="a100-0"),
        Started(job_id=first, time=101.0, node="a100-0"),
        Completed(job_id=first, time=200.0, node="a100-0"),
    ):
        await bus.publish(subjects.lifecycle(first), ev)
        n += 1
    await bus.publish(
        subjects.decisions("placer"),
        Decision(job_id=first, time=100.0, action="place", service="placer", node="a100-0"),
    )
    return n


async def test_a_restart_loads_the_snapshot_and_handles_only_what_came_after(nats_url, bus):
    published = await history(bus, 3)
    async with running(nats_url) as gw:
        assert gw.events_handled == published
        before = gw.jobs.list()
    snap = await SnapshotStore(bus, SNAPSHOT_JOBS, subjects.STREAM_LIFECYCLE).load()
    assert snap is not None and snap.seq == published  # the clean stop saved it all

    later = await history(bus, 2, start=3)
    async with running(nats_url) as gw:
        assert gw.events_handled == later  # not one of the first history's events again
        assert gw.decisions_handled == 1
        assert gw.jobs.list()[:3] == before and len(gw.jobs) == 5
        assert [d.action for d in gw.decisions.for_job("s-0")] == ["place"]
        assert [type(e).__name__ for e in gw.jobs.events("s-3")] == [
            "Submitted",
            "Placed",
            "Started",
            "Completed",
        ]
        assert gw.jobs.get("s-3").state == "completed"

    async with running(nats_url) as gw:  # nothing new: nothing replayed, same view
        assert (gw.events_handled, len(gw.jobs)) == (0, 5)


async def test_a_corrupt_snapshot_means_a_full_replay(nats_url, bus):
    published = await history(bus, 3)
    async with running(nats_url) as gw:
        before = gw.jobs.list()
    obs = await bus.js.object_store(subjects.OBJ_SNAPSHOTS)
    await obs.put(SNAPSHOT_JOBS, b"\x93\x01garbage")
    with capture_logs() as logs:
        async with running(nats_url) as gw:
            assert gw.events_handled == published
            assert gw.jobs.list() == before
    assert "snapshot_undecodable" in [e["event"] for e in logs if e["log_level"] == "warning"]


async def test_a_snapshot_of_another_model_version_means_a_full_replay(nats_url, bus):
    published = await history(bus, 2)
    store = SnapshotStore(bus, SNAPSHOT_JOBS, subjects.STREAM_LIFECYCLE)
    async with running(nats_url):
        pass
    await store.save(published, msgspec.msgpack.encode({"version": 99, "jobs": "?"}))
    async with running(nats_url) as gw:
        assert gw.events_handled == published and len(gw.jobs) == 2


async def test_a_snapshot_older_than_the_stream_warns_and_goes_on(nats_url, bus):
    await history(bus, 2)  # 5 events: s-0 completes, s-1 pending
    async with running(nats_url):
        pass
    await history(bus, 3, start=2)  # 6 more: 11 in all
    await bus.js.purge_stream(subjects.STREAM_LIFECYCLE, keep=2)  # 6..9 aged out unseen
    with capture_logs() as logs:
        async with running(nats_url) as gw:
            assert gw.events_handled == 2  # the two left: s-2's Started and Completed
            assert sorted(j.id for j in gw.jobs.list()) == ["s-0", "s-1"]
            assert gw.jobs.orphans == 2  # s-2's Submitted aged out: its later news is orphaned
    gap = [e for e in logs if e["event"] == "snapshot_gap"]
    assert gap and gap[0]["lost_messages"] == 4


async def test_over_http_a_restart_from_the_snapshot_shows_the_same_jobs(nats_url, bus):
    """Through ``main`` as ``python -m services.gateway`` runs it; SIGTERM-like stop saves."""
    await history(bus, 4)
    config = ReadModelConfig(every_events=2, every_s=0.5)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    seen: list[list[dict]] = []
    for _ in range(2):
        async with (
            gateway(nats_url, port=port, read_models=config),
            aiohttp.ClientSession(headers=ADMIN) as http,
        ):

            async def listed(http: aiohttp.ClientSession = http) -> list[dict] | None:
                try:
                    async with http.get(f"{base}/v1/jobs") as r:
                        jobs = (await r.json())["jobs"] if r.status == 200 else []
                except aiohttp.ClientError:
                    return None
                return jobs if len(jobs) == 4 else None

            seen.append(await until(listed, "four jobs listed"))
    assert seen[0] == seen[1]
    snap = await SnapshotStore(bus, SNAPSHOT_JOBS, subjects.STREAM_LIFECYCLE).load()
    assert snap is not None and snap.seq == 7
    snap = await SnapshotStore(bus, SNAPSHOT_DECISIONS, subjects.STREAM_DECISIONS).load()
    assert snap is not None and snap.seq == 1


# --- the bounded model, without NATS ------------------------------------------------------------


def _submitted(jid: str, t: float = 1.0) -> Submitted:
    return Submitted(job_id=jid, time=t, spec=JobSpec(id=jid, submit_time=t))


def _run(m: JobsModel, jid: str, t: float) -> None:
    m.apply(_submitted(jid, t))
    m.apply(Started(job_id=jid, time=t + 1, node="n"))
    m.apply(Completed(job_id=jid, time=t + 2, node="n"))


def test_a_job_keeps_its_submitted_and_its_newest_events():
    m = JobsModel(keep_events=4)
    m.apply(_submitted("k"))
    m.apply(Started(job_id="k", time=2.0, node="n"))
    for i in range(10):
        m.apply(Checkpointed(job_id="k", time=3.0 + i, node="n", progress=i / 10))
    m.apply(Completed(job_id="k", time=20.0, node="n"))
    kept = m.events("k")
    assert [type(e).__name__ for e in kept] == [
        "Submitted",
        "Checkpointed",
        "Checkpointed",
        "Completed",
    ]
    assert (kept[1].time, kept[2].time) == (11.0, 12.0)
    view = m.get("k")
    assert (view.state, view.start_time, view.end_time) == ("completed", 2.0, 20.0)
    repeat = Checkpointed(job_id="k", time=12.0, node="n", progress=0.9)
    assert not m.apply(repeat)


def test_finished_jobs_expire_after_the_retention_window_and_beyond_the_cap():
    m = JobsModel(retention_s=100.0, max_finished=2)
    forgotten: list[str] = []
    m.on_expire = forgotten.append
    m.expire(1000.0)
    _run(m, "a", 1.0)  # seen ending at 1000, whatever its own times say
    m.apply(_submitted("live"))
    m.expire(1050.0)
    assert "a" in m
    m.expire(1101.0)
    assert "a" not in m and m.get("a") is None and forgotten == ["a"]
    for jid in ("b", "c", "d"):
        _run(m, jid, 5.0)
    assert forgotten == ["a", "b"] and len(m) == 3  # live, c, d
    assert not m.apply(Started(job_id="b", time=9.0))  # late news of a forgotten job
    m.expire(10_000.0)
    assert [j.id for j in m.list()] == ["live"] and m.expired == 4


def test_the_model_round_trips_through_its_snapshot_and_refuses_another_version():
    m = JobsModel(retention_s=100.0)
    m.expire(500.0)
    _run(m, "done", 1.0)
    m.apply(_submitted("wait", 2.0))
    m.apply(Placed(job_id="ghost", time=3.0))
    back = JobsModel(retention_s=100.0).load(m.encode())
    assert back.list() == m.list() and back.orphans == 1
    assert back.events("done") == m.events("done")
    assert back.get("done").spec is back.events("done")[0].spec  # one copy per job
    assert back.get("done").node is m.get("done").node  # one string per node name
    back.expire(601.0)  # the end was seen at 500, before the snapshot
    assert [j.id for j in back.list()] == ["wait"]
    other = msgspec.msgpack.encode({"version": 2, "jobs": []})
    for bad in (other, b"", b"\xc1"):
        try:
            JobsModel().load(bad)
        except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
            continue
        raise AssertionError(f"{bad!r} loaded")


def test_decisions_are_deduplicated_bounded_and_forgotten():
    d = DecisionsModel(keep_per_job=2, max_jobs=2)
    first = Decision(job_id="x", time=1.0, action="wait", service="placer")
    assert d.apply(first) and not d.apply(first)  # a replayed message
    d.apply(Decision(job_id="y", time=2.0, action="wait", service="placer"))
    d.apply(Decision(job_id="z", time=3.0, action="wait", service="placer"))
    assert d.for_job("x") == [] and len(d) == 2
    d.forget("y")
    assert d.for_job("y") == [] and len(DecisionsModel().load(d.encode())) == 1


def test_a_jobs_memory_is_bounded_whatever_its_number_of_events():
    """Before this model a job held every event and a key per event (~3.3 KB/job at 7 events,
    ~17 KB at 45); now the newest 16 events: at 45 events a job costs well under twice what it
    costs at 7, and its snapshot less than the JSON it was folded from."""
    short, _ = measure(2_000, 2)
    long, snapshot = measure(2_000, 40)
    assert short < 2_600 and long < 1.8 * short
    assert snapshot < 2_500
