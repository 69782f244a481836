"""The placer answers intents (issue 14), on a real nats-server: a move of a checkpointable job
is committed (a checkpoint command for that attempt and a ``preempt`` audit record naming the
intent), a move of a job that is neither checkpointable nor elastic and a stale or malformed
intent are refused with a reason, an undecodable one is dead-lettered, and a hold keeps new
work off a node until it is released."""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec

from libs.bus import Bus
from libs.clock import Clock
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from libs.policy.config import PolicyConfig, PreemptConfig
from proto import subjects
from proto.commands import CheckpointCommand
from proto.decisions import Decision
from proto.intents import HoldIntent, MoveIntent
from proto.jobs import Elastic, JobSpec
from proto.ledger import Allocation
from services.placer.service import Placer, PlacerSettings
from tests.services._placer_executor import FakeExecutor
from tests.services._scorer_util import connect, poll, put_nodes, submit
from tests.services.test_placer import FAST, _decisions, small_cluster

V100, T4 = (n.id for n in small_cluster())


async def _placer_now(url: str):  # type: ignore[no-untyped-def]
    """A placer whose policy lets a job move at once (the real clock: no 5-minute first run)."""
    bus = await Bus.connect(url, "placer")
    policy = dataclasses.replace(PolicyConfig.default(), preempt=PreemptConfig(min_run_s=0.0))
    settings = PlacerSettings(holder="intents-test", **FAST)
    log = get_logger(service="placer")
    p = Placer(bus, Clock.from_env(), log, setup_tracing("placer"), settings, policy=policy)
    await p.start()
    stop = asyncio.Event()
    return p, asyncio.create_task(p.run(stop)), stop, bus


async def _ledger(bus) -> dict[str, Allocation]:  # type: ignore[no-untyped-def]
    kv = await bus.kv(subjects.KV_LEDGER, Allocation)
    return {k: e.value for k, e in (await kv.items()).items()}


async def _checkpoints(bus) -> list[CheckpointCommand]:  # type: ignore[no-untyped-def]
    info = await bus.js.stream_info(subjects.STREAM_NODECMD)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        m = await bus.js.get_msg(subjects.STREAM_NODECMD, seq)
        if m.subject.endswith(".checkpoint"):
            out.append(msgspec.json.decode(m.data, type=CheckpointCommand))
    return out


async def _answer(bus, intent_id: str) -> Decision | None:  # type: ignore[no-untyped-def]
    hits = [d for d in await _decisions(bus) if d.intent == intent_id]
    return hits[0] if hits else None


def _move(iid: str, alloc: Allocation, **kw: object) -> MoveIntent:
    fields = {"reason": "test", "kind": "preempt", "attempt": alloc.attempt, **kw}
    return MoveIntent(
        id=iid, source="defrag", time=0.0, job_id=alloc.job_id, node=alloc.node, **fields
    )  # type: ignore[arg-type]


async def test_the_placer_commits_or_refuses_each_intent_with_a_reason(nats_url):  # type: ignore[no-untyped-def]
    bus = await connect(nats_url)
    await put_nodes(bus, small_cluster())
    executor = FakeExecutor(bus, hold={"ck", "plain", "el"})  # all run until stopped
    await executor.start()
    placer, task, stop, pbus = await _placer_now(nats_url)
    try:
        await submit(bus, JobSpec(id="ck", gpus=1, checkpointable=True))
        await submit(bus, JobSpec(id="plain", gpus=1))
        await submit(bus, JobSpec(id="el", gpus=2, elastic=Elastic(min_gpus=1, max_gpus=2)))
        ledger = await poll(lambda: _both(bus), timeout_s=30)
        ck, plain, el = ledger["ck"], ledger["plain"], ledger["el"]

        await bus.publish(subjects.intents("defrag"), _move("i-plain", plain), msg_id="i-plain")
        refused = await poll(lambda: _answer(bus, "i-plain"), timeout_s=20)
        assert refused.action == "refuse" and "neither checkpointable nor elastic" in refused.reason

        stale = _move("i-stale", ck, attempt=ck.attempt + 1)
        await bus.publish(subjects.intents("defrag"), stale, msg_id="i-stale")
        refused = await poll(lambda: _answer(bus, "i-stale"), timeout_s=20)
        assert refused.action == "refuse" and "stale" in refused.reason

        bad = _move("i-bad", ck, kind="teleport")
        await bus.publish(subjects.intents("defrag"), bad, msg_id="i-bad")
        refused = await poll(lambda: _answer(bus, "i-bad"), timeout_s=20)
        assert refused.action == "refuse" and refused.reason.endswith(
            "kind: 'teleport' is not one of preempt, migrate"
        )

        await bus.js.publish(subjects.intents("defrag"), b"{not json")
        dead = await poll(lambda: _dlq(bus), timeout_s=20)
        assert dead

        await bus.publish(subjects.intents("defrag"), _move("i-ck", ck), msg_id="i-ck")
        done = await poll(lambda: _answer(bus, "i-ck"), timeout_s=20)
        assert done.action == "preempt" and done.node == ck.node
        cmds = await poll(lambda: _checkpoints(bus), timeout_s=20)
        assert [(c.job_id, c.attempt) for c in cmds] == [("ck", ck.attempt)]

        # an elastic job shrinks to a size it may take, and only to one
        wide = _move("i-el-2", el, shrink_to=2)
        await bus.publish(subjects.intents("defrag"), wide, msg_id="i-el-2")
        refused = await poll(lambda: _answer(bus, "i-el-2"), timeout_s=20)
        assert refused.action == "refuse" and "shrink_to: 2 is not in [1, 1]" in refused.reason
        await bus.publish(subjects.intents("defrag"), _move("i-el", el, shrink_to=1), msg_id="i-el")
        done = await poll(lambda: _answer(bus, "i-el"), timeout_s=20)
        assert done.action == "preempt" and done.node == el.node
        cmds = await poll(lambda: _two(bus), timeout_s=20)
        assert [(c.job_id, c.shrink_to) for c in cmds] == [("ck", 0), ("el", 1)]

        other = V100 if plain.node != V100 else T4
        hold = HoldIntent(
            id="h-1",
            source="thermal",
            time=Clock.from_env().now(),
            reason="hot",
            node=other,
            ttl_s=3600.0,
        )
        await bus.publish(subjects.intents("thermal"), hold, msg_id="h-1")
        await poll(lambda: _held(placer, other), timeout_s=20)
        off = msgspec.structs.replace(hold, id="h-2", on=False)
        await bus.publish(subjects.intents("thermal"), off, msg_id="h-2")
        await poll(lambda: _released(placer, other), timeout_s=20)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await pbus.close()
        await executor.close()
        await bus.close()


async def _both(bus):  # type: ignore[no-untyped-def]
    led = await _ledger(bus)
    return led if {"ck", "plain", "el"} <= led.keys() else None


async def _two(bus):  # type: ignore[no-untyped-def]
    cmds = await _checkpoints(bus)
    return cmds if len(cmds) >= 2 else None


async def _dlq(bus) -> bool:  # type: ignore[no-untyped-def]
    try:
        info = await bus.js.stream_info(subjects.STREAM_DLQ)
    except Exception:
        return False
    return info.state.messages > 0


async def _held(placer, node: str) -> bool:  # type: ignore[no-untyped-def]
    sched = placer.feed.sched
    return sched is not None and node in sched.cordoned("hot")


async def _released(placer, node: str) -> bool:  # type: ignore[no-untyped-def]
    sched = placer.feed.sched
    return sched is not None and node not in sched.cordoned("hot")


def test_an_intent_from_an_unknown_sender_or_for_an_unsound_node_is_refused_naming_the_field() -> (
    None
):
    """``intent_error``: the sender must be one the placer takes intents from (its refusal
    counter is labelled by sender, so a forged one must not add a label of its own), and the
    node a sound identifier (a hold for any string would cordon nothing and grow the holds)."""
    from services.placer.moves import intent_error

    move = MoveIntent(
        id="m-1", source="defrag", time=0.0, reason="r", job_id="j", attempt=1, node="n"
    )
    hold = HoldIntent(id="h-1", source="thermal", time=0.0, reason="hot", node="n")
    assert intent_error(move) == "" and intent_error(hold) == ""
    forged = msgspec.structs.replace(move, source="x" * 10_000)
    assert intent_error(forged).startswith("source: must be one of defrag, thermal")
    for bad in ("", "a b", "lifecycle.>", "x" * 300):
        assert intent_error(msgspec.structs.replace(hold, node=bad)).startswith("node:"), bad
        assert intent_error(msgspec.structs.replace(move, node=bad)).startswith("node:"), bad
