"""A swap lease on the real stack (``libs.policy.stages.lease``): the live placer ends the lease
of a short job that overran its estimate, so the long job it swapped off resumes within its
bound, as the simulator's driver does (``tests/sim/test_leases.py``).

One 2-GPU node whose simulated executor runs every job at a tenth of the speed the table says
(``mosaic/sim-speed``): a long checkpointable job holds it; a short checkpointable job
estimated at 5 min (truly 50 min) waits past its bound (10 min), and the short-wait rule swaps
it in (no room elsewhere: the long job resumes there after it). The short job is still running
when its lease ends (the resume bound less a save), so the placer checkpoints it; the long job
starts again on the node within the bound. The placer cycles every 0.05 s wall (30 Mosaic s at
the tests' clock factor; 2 s by default on a real clock): at 600x its default 2 s tick is 1,200
Mosaic seconds, more than the bound leaves to spare. The profiler is left out: learning the
node's true speed from the short job's steps is not what this checks.
"""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec

from libs.client.credentials import admin_url
from libs.client.supervisor import SERVICES, start_stack
from libs.policy.config import PolicyConfig
from libs.policy.stages.lease import LEASE_RULE
from libs.policy_io.policy_file import write_policy_file
from proto.events import LifecycleEvent, Preempted, Started
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from services.executor.runners import SIM_SPEED_LABEL
from tests.e2e.checker import check, read_stream
from tests.e2e.conftest import E2E_CLOCK_FACTOR, require_services, wait_for

NODE = NodeSpec(
    id="n0", gpu_model="v100-32gb", gpu_count=2, gpu_mem_gb=32.0, host_mem_gb=256.0, cpus=64,
    idle_power_w=40.0, max_power_w=300.0, labels={SIM_SPEED_LABEL: "0.1"},
)  # fmt: skip


def _job(jid: str, est_s: float) -> JobSpec:
    return JobSpec(
        id=jid, gpus=2, gpu_mem_gb=8.0, priority=1, est_runtime_s=est_s, checkpointable=True
    )


def _events(url: str) -> list[LifecycleEvent]:
    dec = msgspec.json.Decoder(LifecycleEvent)
    return [dec.decode(data) for _, data in asyncio.run(read_stream(url))]


def test_the_placer_ends_an_overrun_lease_and_the_long_job_resumes_in_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    require_services()
    cfg = PolicyConfig.default()  # the short-wait rule alone moves jobs here
    cfg = dataclasses.replace(cfg, preempt=dataclasses.replace(cfg.preempt, enabled=False))
    policy = write_policy_file(tmp_path / "policy.json", cfg)
    services = tuple(s for s in SERVICES if s != "profiler")
    stack = start_stack(
        [NODE], clock_factor=E2E_CLOCK_FACTOR, data_dir=tmp_path, services=services,
        extra_env={"MOSAIC_POLICY_FILE": str(policy), "MOSAIC_PLACER_TICK_S": "0.05"},
    )  # fmt: skip
    try:
        client = stack.client()
        client.submit(_job("long", 36_000.0))
        wait_for(
            lambda: client.job("long").state == "running", timeout_s=30, what="long", stack=stack
        )
        client.submit(_job("short", 300.0))
        # ~600 s bound + a save + a 1,770 s lease, Mosaic time: a few wall seconds
        wait_for(
            lambda: client.job("long").attempts >= 2 and client.job("long").state == "running",
            timeout_s=60,
            what="the long job to resume after the short job's lease",
            stack=stack,
        )
        url = admin_url(stack.nats.url, stack.credentials)
        events = _events(url)
        pre = [e for e in events if isinstance(e, Preempted)]
        assert [e.job_id for e in pre][:2] == ["long", "short"], [(e.job_id, e.reason) for e in pre]
        long_pre, short_pre = pre[0], pre[1]
        assert f"preempt: {LEASE_RULE}:" in short_pre.reason, short_pre.reason
        assert "short-wait" in long_pre.reason and "on a lease" in long_pre.reason, long_pre.reason
        again = next(e for e in events if isinstance(e, Started) and e.job_id == "long"
                     and e.attempt == 2)  # fmt: skip
        assert again.node == "n0"
        assert 0.0 <= again.time - long_pre.time <= cfg.preempt.resume_bound_s
        assert again.time >= short_pre.time  # it resumed once the short job had left
        report = check(asyncio.run(read_stream(url)), stack.nodes)
        assert report.violations == [], report.violations[:5]
    finally:
        forced = stack.stop()
        assert not forced, f"services needed SIGKILL to stop: {forced} (logs in {stack.logs_dir})"
