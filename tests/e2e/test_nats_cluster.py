"""A three-server JetStream cluster with R3 streams: killing one server mid-run loses nothing.

Why: with one server, NATS is the single point whose loss stops scheduling (issue 12). Here the
stack runs as ``mosaic up --nats-cluster 3`` does, with authentication on; one server is
SIGKILLed while jobs run, more jobs are submitted after, and every job must end exactly once
with ``completed`` (the lifecycle checker reads the stream from a surviving server).
"""

from __future__ import annotations

import asyncio
import random
import time

import msgspec
import nats
import pytest

from libs.bus.server import NatsCluster
from libs.client.api import ClientError
from libs.client.credentials import admin_url
from libs.client.demo import make_job
from libs.client.supervisor import start_stack
from libs.policy.inventory import demo_cluster
from proto import subjects
from tests.e2e.checker import check, read_stream
from tests.e2e.conftest import all_terminal, require_services, wait_for


async def _ephemeral_consumer_host(url: str) -> int:
    """The index of the server leading the most ephemeral LIFECYCLE consumers (the gateway's
    read model is one): the worst server to lose, and the one a replicated consumer survives."""
    nc = await nats.connect(url.split(","))
    try:
        infos = await nc.jetstream().consumers_info(subjects.STREAM_LIFECYCLE)
    finally:
        await nc.close()
    leaders = [i.cluster.leader for i in infos if not i.config.durable_name and i.cluster]
    assert leaders, "no ephemeral consumer on LIFECYCLE"
    name = max(set(leaders), key=leaders.count)
    return int(name.removeprefix("mosaic-"))


def _report_unfinished(stack, client, ids: set[str]) -> None:  # type: ignore[no-untyped-def]
    """On a timeout, print what each unfinished job was doing and the services' last words:
    a failure on CI must say where the run stopped, not only that it did."""
    for j in client.jobs():
        if j.id in ids and j.state not in ("completed", "failed", "cancelled"):
            print(f"unfinished {j.id}: state={j.state} node={j.node} reason={j.reason!r}")
    for name, svc in stack.services.items():
        print(f"--- {name} ({svc.log_path}) ---\n{svc.tail(40)}")


@pytest.mark.slow  # a soak of three servers and a loss (`make test-all`); see the docstring
def test_a_job_run_survives_losing_one_of_three_nats_servers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    require_services()
    stack = start_stack(demo_cluster(), clock_factor=600.0, data_dir=tmp_path, nats_cluster=3)
    try:
        cluster = stack.nats
        assert isinstance(cluster, NatsCluster) and len(cluster.servers) == 3
        assert stack.services["placer"].env["MOSAIC_STREAM_REPLICAS"] == "3"
        client = stack.client()
        rng = random.Random(3)

        def submit(prefix: str, n: int) -> set[str]:
            ids = set()
            for i in range(n):
                spec = make_job(rng, f"{prefix}-{i:02d}", stack.clock.now())
                spec = msgspec.structs.replace(spec, est_runtime_s=rng.uniform(120, 600))
                deadline = time.monotonic() + 30
                while True:  # a 503 while the stream elects a new leader: retry with the id
                    try:
                        client.submit(spec)
                        break
                    except ClientError as exc:
                        if exc.status != 503 or time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
                ids.add(spec.id)
            return ids

        ids = submit("before", 20)

        def some_ended() -> bool:  # every service is up and working: now is mid-run
            return sum(j.id in ids and j.state == "completed" for j in client.jobs()) >= 3

        wait_for(some_ended, timeout_s=60, what="the first jobs to end", stack=stack)
        victim = asyncio.run(_ephemeral_consumer_host(admin_url(cluster.url, stack.credentials)))
        cluster.kill(victim)  # mid-run, and the server an ephemeral consumer (a read model) is on
        alive = next(s for i, s in enumerate(cluster.servers) if i != victim)
        ids |= submit("after", 20)
        try:
            wait_for(all_terminal(client, ids), timeout_s=150, what="40 jobs to end", stack=stack)
        except BaseException:
            _report_unfinished(stack, client, ids)
            raise
        states = {j.id: j.state for j in client.jobs() if j.id in ids}
        assert set(states.values()) == {"completed"}, states

        url = admin_url(alive.url, stack.credentials)
        report = check(asyncio.run(read_stream(url)), stack.nodes)
        assert report.violations == [], report.violations[:10]
        for jid in ids:
            assert report.submitted[jid] == 1 and len(report.terminal[jid]) == 1, jid
    finally:
        stack.stop()
