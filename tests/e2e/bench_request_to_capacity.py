"""Request-to-capacity on the live stack (issue 16): from a service's load report to its new
replica's ``Started``, against a plain job's submission (``POST /v1/jobs``) to its ``Started``.

    .venv/bin/python -m tests.e2e.bench_request_to_capacity --bursts 10

One 8-GPU node, every service a child process on a real NATS server with authentication, the
clock at 600x. Each burst: a report of 150 req/s for a service of 100 req/s per replica
(minimum 1, so one replica serves already) asks for a second replica, placed on a free GPU;
then quiet reports until the quiet window (600 Mosaic s, one wall second) has stopped it. Each
plain job: one 1-GPU job submitted over HTTP. Two clocks: the events' own times (Mosaic clock,
divided by the factor: what the services decided, free of this script's polling) and the wall
time this script observed (its NATS subscription; includes the delivery to it). Not a test:
``tests/e2e/test_inference_burst.py`` holds the 5 s bound, with the room taken from training.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import nats

from libs.client.credentials import load_user
from libs.client.load import report_load
from libs.client.supervisor import start_stack
from proto import subjects
from proto.events import Cancelled, LifecycleEvent, Started
from proto.inference import InferenceService
from proto.jobs import JobSpec
from proto.nodes import NodeSpec

FACTOR = 600.0
NODE = NodeSpec(
    id="b0", gpu_model="a100-80gb", gpu_count=8, gpu_mem_gb=80, host_mem_gb=1024, cpus=128,
    idle_power_w=50, max_power_w=400,
)  # fmt: skip
REPLICA = JobSpec(
    id="template", priority=8, gpus=1, gpu_mem_gb=20, kind="inference",
    workload_class="inference", latency_p99_ms=100.0, est_runtime_s=10_000_000.0,
)  # fmt: skip
SVC = InferenceService(
    id="bench", replica=REPLICA, rps_per_replica=100.0, max_replicas=2, scale_down_after_s=600.0
)


def _new(job_id: str, seen: set[str]) -> bool:
    return job_id.startswith("bench-") and job_id not in seen


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile, nearest rank (with 10 samples the p99 is the largest)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


async def wait(pred: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (v := pred()):
        if time.monotonic() > deadline:
            raise TimeoutError("the stack did not answer in time")
        await asyncio.sleep(0.005)
    return v


async def bench(bursts: int, jobs: int, data_dir: Path) -> dict[str, list[float]]:
    stack = start_stack([NODE], clock_factor=FACTOR, data_dir=data_dir)
    out: dict[str, list[float]] = {k: [] for k in ("burst", "burst_wall", "job", "job_wall")}
    try:
        events: list[tuple[float, LifecycleEvent]] = []
        dec = msgspec.json.Decoder(LifecycleEvent)
        nc = await nats.connect(stack.nats_url)

        async def on_event(msg: Any) -> None:
            events.append((time.monotonic(), dec.decode(msg.data)))

        await nc.subscribe(f"{subjects.LIFECYCLE_PREFIX}.>", cb=on_event)
        assert stack.credentials is not None
        producer = await nats.connect(**load_user(stack.credentials.directory, "producer"))

        def started(pred: Any) -> list[tuple[float, Started]]:
            return [(w, e) for w, e in events if isinstance(e, Started) and pred(e.job_id)]

        client = stack.client()
        client.apply_service(SVC)
        first = (await wait(lambda: started(lambda j: j.startswith("bench-"))))[0][1].job_id
        for _ in range(bursts):
            seen = {e.job_id for _, e in started(lambda j: True)}
            report = await report_load(producer, "bench", rps=150.0, clock=stack.clock)
            wall0 = time.monotonic()
            w, ev = (await wait(lambda seen=seen: started(lambda j: _new(j, seen))))[0]
            out["burst"].append((ev.time - report.time) / FACTOR)
            out["burst_wall"].append(w - wall0)
            while not any(isinstance(e, Cancelled) and e.job_id == ev.job_id for _, e in events):
                await report_load(producer, "bench", rps=0.0, clock=stack.clock)
                await asyncio.sleep(0.05)
        for k in range(jobs):
            spec = JobSpec(id=f"plain-{k}", gpus=1, gpu_mem_gb=20, est_runtime_s=60.0)
            wall0 = time.monotonic()
            view = await asyncio.to_thread(client.submit, spec)
            w, ev = (await wait(lambda k=k: started(lambda j: j == f"plain-{k}")))[0]
            out["job"].append((ev.time - (view.job.submit_time or 0.0)) / FACTOR)
            out["job_wall"].append(w - wall0)
            await asyncio.sleep(0.2)  # it ends (60 Mosaic s) before the next one
        assert first
        await producer.close()
        await nc.close()
    finally:
        stack.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(bench(args.bursts, args.jobs, Path(tmp)))
    for name, xs in out.items():
        print(
            f"{name:10} n={len(xs):3}  p50 {statistics.median(xs):.3f} s  "
            f"p99 {pct(xs, 99):.3f} s  max {max(xs):.3f} s"
        )


if __name__ == "__main__":
    main()
