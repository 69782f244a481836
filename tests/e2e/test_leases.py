"""A swap lease on the real stack (``libs.policy.stages.lease``): the live placer ends the lease
of a short job that overran its estimate, so the long job it swapped off resumes within its
bound, as the simulator's driver does (``tests/sim/test_leases.py``).

One 2-GPU node whose simulated executor runs every job at a tenth of the speed the table says
(``mosaic/sim-speed``): a long checkpointable job holds it; a short checkpointable job
estimated at 1 min (truly 10 min) waits past its bound (2 min), and the short-wait rule swaps
it in (no room elsewhere: the long job resumes there after it). The short job is still running
when its lease ends (the resume bound less a save and a look), so the placer checkpoints it;
the long job starts again on the node within the bound.

Time: the policy file shortens the resume bound to 10 min (and the rule's waits to 1 min) so
the whole story takes about 1,500 Mosaic seconds, and the clock runs at 120x, not the suite's
600x. At 600x a tenth of a wall second of bus latency is 60 Mosaic seconds, as much as the
lease keeps to spare, and the bound failed by 4 s in 1 of 9 runs: a test of wall latency,
not of the rule. The placer cycles every 0.05 s wall (6 Mosaic s; 2 s by default on a real
clock). The profiler is left out: learning the node's true speed from the short job's steps
is not what this checks.
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
from tests.e2e.conftest import require_services, wait_for

CLOCK_FACTOR = 120.0  # Mosaic seconds per wall second (module docstring)

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
    pc = dataclasses.replace(
        cfg.preempt, enabled=False, resume_bound_s=600.0, min_wait_s=60.0, min_run_s=60.0
    )
    cfg = dataclasses.replace(cfg, preempt=pc)
    policy = write_policy_file(tmp_path / "policy.json", cfg)
    services = tuple(s for s in SERVICES if s != "profiler")
    stack = start_stack(
        [NODE], clock_factor=CLOCK_FACTOR, data_dir=tmp_path, services=services,
        extra_env={"MOSAIC_POLICY_FILE": str(policy), "MOSAIC_PLACER_TICK_S": "0.05"},
    )  # fmt: skip
    try:
        client = stack.client()
        client.submit(_job("long", 36_000.0))
        wait_for(
            lambda: client.job("long").state == "running", timeout_s=30, what="long", stack=stack
        )
        client.submit(_job("short", 60.0))
        # ~120 s wait bound + a save + a 510 s lease, Mosaic time: about 10 wall seconds
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
