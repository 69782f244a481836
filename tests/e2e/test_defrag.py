"""The defragmenter on the real stack (issue 14): a 4-GPU job blocked by fragments starts after
checkpointable jobs are moved, they resume within the bound, and a job that is neither
checkpointable nor elastic is never preempted.

Two 4-GPU nodes. Cordons steer the fillers: two checkpointable 1-GPU jobs onto ``n0``, two
plain ones onto ``n1``. Four GPUs are free in all, two per node, so the 4-GPU job waits on
Resources; the only plan is to move both checkpointable jobs to ``n1``. The placer commits the
defragmenter's intents (checkpoint, requeue); the moved jobs start again on ``n1`` (or on
``n0`` once the short 4-GPU job there has ended) and the 4-GPU job on ``n0``. Every priority is
5, so the priority-protection rule stays out of it.
"""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec

from libs.client.credentials import admin_url
from libs.client.supervisor import start_stack
from libs.policy.config import PolicyConfig
from libs.policy_io.policy_file import write_policy_file
from proto.events import Completed, LifecycleEvent, Preempted, Started
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from tests.e2e.checker import check, read_stream
from tests.e2e.conftest import E2E_CLOCK_FACTOR, require_services, wait_for

BOUND_S = 1800.0  # PreemptConfig.resume_bound_s
LONG_S = 200_000.0  # Mosaic seconds: longer than the test


def _node(nid: str) -> NodeSpec:
    return NodeSpec(
        id=nid,
        gpu_model="v100-32gb",
        gpu_count=4,
        gpu_mem_gb=32.0,
        host_mem_gb=256.0,
        cpus=64,
        idle_power_w=40.0,
        max_power_w=300.0,
    )


def _job(jid: str, gpus: int, **kw: object) -> JobSpec:
    fields = {"gpu_mem_gb": 8.0, "priority": 5, "est_runtime_s": LONG_S, **kw}
    return JobSpec(id=jid, gpus=gpus, **fields)  # type: ignore[arg-type]


def _events(url: str) -> list[LifecycleEvent]:
    dec = msgspec.json.Decoder(LifecycleEvent)
    return [dec.decode(data) for _, data in asyncio.run(read_stream(url))]


def test_a_job_blocked_by_fragments_starts_after_checkpointable_jobs_move(tmp_path) -> None:  # type: ignore[no-untyped-def]
    require_services()
    nodes = [_node("n0"), _node("n1")]
    # the defragmenter alone: the scheduler's short-wait rule would also make room for the
    # short 4-GPU job (a mover then resumes on n0 after it), which is not what this checks
    cfg = PolicyConfig.default()
    cfg = dataclasses.replace(cfg, preempt=dataclasses.replace(cfg.preempt, short_enabled=False))
    policy = write_policy_file(tmp_path / "policy.json", cfg)
    env = {"MOSAIC_DEFRAG_INTERVAL_S": "0.5", "MOSAIC_POLICY_FILE": str(policy)}
    stack = start_stack(nodes, clock_factor=E2E_CLOCK_FACTOR, data_dir=tmp_path, extra_env=env)
    try:
        client = stack.client()

        def running(ids: set[str]) -> bool:
            return all(j.state == "running" for j in client.jobs() if j.id in ids)

        client.cordon("n1", "test: steer the checkpointable jobs to n0")
        movers = {"ck0", "ck1"}
        for jid in sorted(movers):
            client.submit(_job(jid, 1, checkpointable=True))
        wait_for(lambda: running(movers), timeout_s=30, what="ck jobs to run", stack=stack)
        client.uncordon("n1")
        client.cordon("n0", "test: steer the plain jobs to n1")
        plain = {"plain0", "plain1"}
        for jid in sorted(plain):
            client.submit(_job(jid, 1))
        wait_for(lambda: running(plain), timeout_s=30, what="plain jobs to run", stack=stack)
        client.uncordon("n0")
        assert {j.id: j.node for j in client.jobs()} == {
            "ck0": "n0",
            "ck1": "n0",
            "plain0": "n1",
            "plain1": "n1",
        }

        client.submit(_job("big", 4, est_runtime_s=600.0))
        wait_for(
            lambda: client.job("big").state in ("running", "completed"),
            timeout_s=45,
            what="the 4-GPU job to start after the moves",
            stack=stack,
        )
        views = {j.id: j for j in client.jobs()}
        assert views["big"].node == "n0"
        assert all(views[j].attempts == 1 for j in plain), "a plain job was moved"

        def resumed(ids: set[str]) -> bool:  # not just "running": the view may not yet show
            views = {j.id: j for j in client.jobs()}  # the move (a stale attempt 1 passed)
            return all(views[j].state == "running" and views[j].attempts >= 2 for j in ids)

        wait_for(
            lambda: resumed(movers), timeout_s=30, what="the moved jobs to resume", stack=stack
        )
        views = {j.id: j for j in client.jobs()}
        assert all(views[j].attempts == 2 for j in movers)

        url = admin_url(stack.nats.url, stack.credentials)
        events = _events(url)
        # each mover resumes in its room on n1, or on n0 once the 4-GPU job there has ended
        # (600 Mosaic s are one wall second: on a loaded machine a requeue can come later)
        done = next(
            (e.time for e in events if isinstance(e, Completed) and e.job_id == "big"), None
        )
        for jid in movers:
            if views[jid].node != "n1":
                start = next(e for e in events if isinstance(e, Started) and e.job_id == jid
                             and e.attempt == 2)  # fmt: skip
                assert done is not None and start.time >= done, (jid, views[jid].node)
        for jid in movers:  # resumed within the bound: requeue -> next start, Mosaic clock
            pre = next(e for e in events if isinstance(e, Preempted) and e.job_id == jid)
            again = next(
                e for e in events if isinstance(e, Started) and e.job_id == jid and e.attempt == 2
            )
            assert 0.0 <= again.time - pre.time <= BOUND_S
        assert not [e for e in events if isinstance(e, Preempted) and e.job_id in plain]
        report = check(asyncio.run(read_stream(url)), stack.nodes)
        assert report.violations == [], report.violations[:5]
    finally:
        stack.stop()
