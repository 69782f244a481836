"""NATS permissions for node power and the stepped clock (issue 13): the gateway and a node's
telemetry read executor reports (the power state), only the placer sends power commands, only
the admin steps the clock, and each service acks steps under its own name only."""

from __future__ import annotations

import asyncio
import contextlib

from libs.bus.auth import permissions
from libs.bus.server import NatsServer
from libs.client.credentials import Credentials
from proto import subjects
from tests.security.test_nats_auth import Errors, _connect, secured  # noqa: F401 (fixture)


def test_the_table_grants_what_power_and_steps_need() -> None:
    assert subjects.EXECUTOR_REPORTS_ALL in permissions("gateway").subscribe
    assert subjects.executor_report("n1") in permissions("telemetry", nodes=["n1"]).subscribe
    assert subjects.executor_report("n2") not in permissions("telemetry", nodes=["n1"]).subscribe
    for user in ("gateway", "scorer", "placer", "executor", "telemetry"):
        p = permissions(user, nodes=["n1"])
        assert subjects.CLOCK_STEP in p.subscribe and subjects.CLOCK_STEP not in p.publish
        assert subjects.clock_ack(user) in p.publish
        others = {subjects.clock_ack(u) for u in ("placer", "executor") if u != user}
        assert not others & set(p.publish)
    assert f"{subjects.NODE_PREFIX}.>" in permissions("placer").publish
    power = subjects.node_command("n1", subjects.POWER_VERB)
    assert power not in permissions("executor", nodes=["n1"]).publish


async def test_the_gateway_reads_reports_and_an_executor_cannot_step_the_clock(
    secured: tuple[NatsServer, Credentials],  # noqa: F811
) -> None:
    _, creds = secured
    errors = Errors()
    gw = await _connect(creds, "gateway")
    ex = await _connect(creds, "executor", errors)
    try:
        got = asyncio.get_running_loop().create_future()

        async def on_msg(msg: object) -> None:
            if not got.done():
                got.set_result(msg)

        await gw.subscribe(subjects.EXECUTOR_REPORTS_ALL, cb=on_msg)
        await gw.flush()
        for _ in range(50):  # core NATS: a report sent before the subscription settled is gone
            await ex.publish(subjects.executor_report("n1"), b"{}")
            await ex.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(got), 0.2)
            if got.done():
                break
        assert got.done(), "the gateway never received an executor report"
        await ex.publish(subjects.CLOCK_STEP, b'{"seq": 1, "now": 0}')
        assert await errors.wait_for(f'publish to "{subjects.CLOCK_STEP}"'), errors.seen
    finally:
        for nc in (gw, ex):
            with contextlib.suppress(Exception):  # the executor's may be closed by a violation
                await nc.close()
