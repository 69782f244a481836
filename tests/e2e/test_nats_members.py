"""``Stack.supervise`` on a three-server JetStream cluster: a dead member comes back alone, as
the same member, and catches up; one that cannot start stops the stack naming its log.

Why: ``mosaic up --nats-cluster 3`` (and the chaos test) must survive losing a server twice, not
once; that needs the lost server back in the cluster, on the ports the services know and with
its store, while the other two keep serving. Real nats-servers, no services.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.js import api

from libs.bus import Bus
from libs.bus.server import NatsCluster, free_port, start_nats_cluster
from libs.client.restarts import Restarter, RestartPolicy
from libs.client.supervisor import Stack, StackError
from libs.clock import Clock
from proto import subjects
from tests.e2e._up_process import UpProcess, stack_state
from tests.e2e.conftest import require_services

QUICK = RestartPolicy(first_backoff_s=0.05, max_backoff_s=0.2, max_restarts=3)


def _stack(cluster: NatsCluster, data_dir: Path) -> Stack:
    return Stack(
        nodes=[],
        clock=Clock(epoch=time.time()),
        data_dir=data_dir,
        nats=cluster,
        gateway_port=0,
        restarter=Restarter(QUICK),
    )


def _supervise_until(stack: Stack, want: str, timeout_s: float = 30.0) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not any(want in line for line in lines):
        assert time.monotonic() < deadline, f"no {want!r} in {lines}"
        lines += stack.supervise()
        time.sleep(0.05)
    return lines


async def _publish(url: str, n: int, *, create: bool = False) -> None:
    nc = await nats.connect(url.split(","))
    try:
        js = nc.jetstream()
        if create:
            await js.add_stream(api.StreamConfig(name="T", subjects=["t.>"], num_replicas=3))
        deadline = time.monotonic() + 30
        for i in range(n):
            once = {"Nats-Msg-Id": f"{time.monotonic_ns()}-{i}"}  # a retry is not a second one
            while True:  # no responders while the stream elects a (new) leader
                try:
                    await js.publish(f"t.{i}", b"x", timeout=2, headers=once)
                    break
                except nats.errors.Error:
                    assert time.monotonic() < deadline, "the stream never took a write"
                    await asyncio.sleep(0.1)
    finally:
        await nc.close()


def _local_messages(monitor_port: int) -> int | None:
    """Messages of stream T in this server's own store (``/jsz``), None while it has none."""
    url = f"http://127.0.0.1:{monitor_port}/jsz?streams=true"
    with urllib.request.urlopen(url, timeout=2) as resp:
        data = json.load(resp)
    for account in data.get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            if stream["name"] == "T":
                return int(stream["state"]["messages"])
    return None


# make test-all (test time): a member lost and back is also covered by two_of_three below
@pytest.mark.slow
def test_a_dead_member_comes_back_alone_and_catches_up(tmp_path: Path) -> None:
    cluster = start_nats_cluster(tmp_path / "nats", n=3)
    stack = _stack(cluster, tmp_path)
    try:
        asyncio.run(_publish(cluster.url, 50, create=True))
        before = [(s.port, s.monitor_port, s.process.pid) for s in cluster.servers]
        cluster.kill(1)
        asyncio.run(_publish(cluster.url, 50))  # two of three: a quorum, writes go on
        lines = _supervise_until(stack, "restarted nats mosaic-1")
        assert lines == [f"restarted nats mosaic-1 (exit code -9, port {before[1][0]})"]
        after = [(s.port, s.monitor_port, s.process.pid) for s in cluster.servers]
        assert after[0] == before[0] and after[2] == before[2], "a living member was restarted"
        assert after[1][:2] == before[1][:2] and after[1][2] != before[1][2]
        assert cluster.servers[1].store_dir == tmp_path / "nats" / "n1"
        deadline = time.monotonic() + 30
        while _local_messages(cluster.servers[1].monitor_port or 0) != 100:
            assert time.monotonic() < deadline, "the restarted member never caught up"
            time.sleep(0.2)
        assert stack.supervise() == []
        assert set(stack.pids()) == {"nats", "nats mosaic-0", "nats mosaic-1", "nats mosaic-2"}
    finally:
        stack.stop()


def test_a_member_that_cannot_start_stops_the_stack_naming_its_log(tmp_path: Path) -> None:
    cluster = start_nats_cluster(tmp_path / "nats", n=3)
    stack = _stack(cluster, tmp_path)
    squatter = socket.socket()
    try:
        port = cluster.servers[2].port
        cluster.kill(2)
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))  # its port taken: every start of it fails
        squatter.listen()
        with pytest.raises(StackError) as info:
            _supervise_until(stack, "never", timeout_s=60)
        text = str(info.value)
        assert "nats mosaic-2" in text and str(tmp_path / "nats" / "n2" / "nats-server.log") in text
        assert [s.process.poll() is None for s in cluster.servers] == [True, True, False]
    finally:
        squatter.close()
        stack.stop()


def test_streams_and_buckets_of_a_single_server_get_three_replicas_on_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Moving a deployment from one server to the cluster (its store becomes the first
    member's): every stream and KV bucket made with one replica gets three when the services
    start with ``MOSAIC_STREAM_REPLICAS=3``; one left at R1 would be lost with its server."""
    cluster = start_nats_cluster(tmp_path / "nats", n=3)

    async def topology() -> dict[str, int]:
        bus = await Bus.connect(cluster.url, "ops")
        try:
            await bus.ensure_topology()
            names = [*subjects.STREAMS, *(f"KV_{b}" for b in subjects.KV_BUCKETS)]
            return {n: (await bus.js.stream_info(n)).config.num_replicas or 1 for n in names}
        finally:
            await bus.close()

    try:
        monkeypatch.setenv("MOSAIC_STREAM_REPLICAS", "1")
        assert set(asyncio.run(topology()).values()) == {1}
        monkeypatch.setenv("MOSAIC_STREAM_REPLICAS", "3")
        replicas = asyncio.run(topology())
        assert {n: r for n, r in replicas.items() if r != 3} == {}
    finally:
        cluster.stop()


def test_two_of_three_lost_stops_writes_and_loses_nothing_stored(tmp_path: Path) -> None:
    """What docs/operations.md says of losing two servers: no quorum, so JetStream takes no
    write (a publish times out; ``mosaic`` services retry), and nothing stored is lost: once one
    of the two is back, writes go on and every message is there."""
    cluster = start_nats_cluster(tmp_path / "nats", n=3)

    async def publish_within(js: Any, subject: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        once = {"Nats-Msg-Id": subject}  # a retry after a lost ack is not a second message
        while time.monotonic() < deadline:
            try:
                await js.publish(subject, b"x", timeout=1, headers=once)
                return True
            except nats.errors.Error:
                await asyncio.sleep(0.1)
        return False

    async def run() -> int:
        nc = await nats.connect(cluster.url.split(","), reconnect_time_wait=0.1)
        try:
            js = nc.jetstream()
            await js.add_stream(api.StreamConfig(name="T", subjects=["t.>"], num_replicas=3))
            for i in range(50):  # retried: a new R3 stream may still be electing its leader
                assert await publish_within(js, f"t.{i}", 30), f"t.{i} not stored"
            leader = cluster.index_of((await js.stream_info("T")).cluster.leader)
            other = (leader + 1) % 3
            cluster.kill(leader)
            cluster.kill(other)
            assert not await publish_within(js, "t.lost", 5), "a write without a quorum"
            cluster.restart(other)
            assert await publish_within(js, "t.back", 60), "no writes after a member came back"
            return (await js.stream_info("T")).state.messages
        finally:
            await nc.close()

    try:
        assert asyncio.run(run()) == 51
    finally:
        cluster.stop()


# make test-all (test time): `mosaic up --nats-cluster 3` with a member killed and restarted
@pytest.mark.slow
def test_mosaic_up_with_three_nats_servers_brings_a_killed_one_back(tmp_path: Path) -> None:
    """``mosaic up --nats-cluster 3``: a SIGKILLed server is restarted alone and said so, the
    stack keeps running, and a Ctrl-C stops all three servers with the services."""
    require_services()
    port = free_port()
    up = UpProcess("--nodes", "3", "--nats-cluster", "3", "--duration", "120",
                   "--port", str(port), "--data-dir", str(tmp_path))  # fmt: skip
    try:
        up.wait_for("metrics    placer", 120)  # started and ready
        pids = stack_state(tmp_path)["pids"]
        os.kill(pids["nats mosaic-1"], signal.SIGKILL)
        up.wait_for("restarted nats mosaic-1 (exit code -9", 120)
        after = stack_state(tmp_path)["pids"]
        assert after["nats mosaic-1"] != pids["nats mosaic-1"]
        assert [after[f"nats mosaic-{i}"] for i in (0, 2)] == [
            pids[f"nats mosaic-{i}"] for i in (0, 2)
        ]
        code = up.interrupt()
    finally:
        up.kill_if_running()
    assert code == 0, up.text()
    assert not any("left behind" in line for line in up.output), up.text()
