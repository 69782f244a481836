"""services/profiler on a real nats-server: completed jobs and telemetry in, the learnt table in
KV ``profiles`` out; a restart takes the table back without counting a job twice; an
undecodable event is dead-lettered and the profiler keeps learning; ``main`` serves it."""

from __future__ import annotations

import asyncio
import time

import msgspec

from libs.bus import Bus
from libs.clock import Clock
from proto import subjects
from proto.decisions import DeadLetter
from proto.events import Checkpointed, Completed, Placed, Started, Submitted
from proto.jobs import JobSpec
from proto.nodes import GpuSample, NodeSpec, TelemetrySample
from proto.profiles import ProfilesRecord
from services.profiler.service import ProfilerService, main
from tests.services._scorer_util import connect, poll, put_nodes, start_in_process

NODE = NodeSpec(
    id="t4-0",
    gpu_model="t4",
    gpu_count=4,
    gpu_mem_gb=16,
    host_mem_gb=256,
    cpus=32,
    idle_power_w=10,
    max_power_w=70,
)
TRUE_SPEED = 0.3  # what the jobs really run at on this T4 (the table says otherwise)
BUSY_W = 55.0  # what telemetry reads on a busy GPU


async def run_job(bus: Bus, svc: ProfilerService, job: str, t: float, resumed_from=0.0) -> None:
    """A job's life on GPU 1 of NODE at TRUE_SPEED, with a telemetry sample while it runs."""
    spec = JobSpec(id=job, workload_class="cnn", framework="pytorch", est_runtime_s=600.0)
    await bus.publish(subjects.lifecycle(job), Submitted(job_id=job, time=t, spec=spec))
    if resumed_from:
        ev = Checkpointed(job_id=job, time=t, node=NODE.id, progress=resumed_from)
        await bus.publish(subjects.lifecycle(job), ev)
    placed = Placed(job_id=job, time=t, node=NODE.id, gpu_indices=(1,))
    await bus.publish(subjects.lifecycle(job), placed)
    await bus.publish(subjects.lifecycle(job), Started(job_id=job, time=t, node=NODE.id))
    await poll(lambda: _true(job in svc.jobs.attempts and svc.jobs.attempts[job].started))
    gpus = tuple(
        GpuSample(index=i, util=0.9, mem_used_gb=4, temp_c=60, power_w=BUSY_W if i == 1 else 12)
        for i in range(4)
    )
    sample = TelemetrySample(node=NODE.id, time=t + 1, backend="sim", gpus=gpus)
    await bus.nc.publish(subjects.telemetry(NODE.id), msgspec.json.encode(sample))
    await poll(lambda: _true(svc.jobs.attempts[job].samples > 0))
    run_s = 600.0 * (1 - resumed_from) / TRUE_SPEED
    done = Completed(job_id=job, time=t + run_s, node=NODE.id, runtime_s=run_s, energy_kwh=1.0)
    await bus.publish(subjects.lifecycle(job), done)


async def _true(x: bool) -> bool:
    return x


async def record(bus: Bus) -> ProfilesRecord | None:
    kv = await bus.kv(subjects.KV_PROFILES, ProfilesRecord)
    e = await kv.get(subjects.PROFILES_KEY)
    return e.value if e is not None else None


def pooled(rec: ProfilesRecord):
    key = ("t4", "cnn", "*")
    return next(r for r in rec.rows if (r.model, r.workload_class, r.framework) == key)


async def started(nats_url: str) -> tuple[Bus, ProfilerService]:
    bus = await Bus.connect(nats_url, "profiler")  # dead letters go to dlq.profiler
    svc = ProfilerService(bus, Clock(epoch=time.time()), bus.log)
    await svc.start()
    return bus, svc


async def samples_of(bus: Bus, n: int) -> ProfilesRecord:
    async def check() -> ProfilesRecord | None:
        r = await record(bus)
        return r if r is not None and pooled(r).samples >= n else None

    return await poll(check)


async def test_learns_from_completed_jobs_restarts_without_double_counting(nats_url) -> None:
    test = await connect(nats_url)
    letters: list[DeadLetter] = []

    async def on_letter(d: DeadLetter) -> None:
        letters.append(d)

    await test.subscribe(subjects.dlq("profiler"), DeadLetter, on_letter)
    await put_nodes(test, [NODE])
    bus, svc = await started(nats_url)
    try:
        await run_job(test, svc, "a", 1000.0)
        await test.nc.publish(subjects.lifecycle("junk"), b"{not json")  # to dlq.profiler
        await run_job(test, svc, "b", 2000.0, resumed_from=0.5)  # half left in its last attempt
        await run_job(test, svc, "c", 3000.0)
        rec = await samples_of(test, 3)
        row = pooled(rec)
        assert abs(row.speed - TRUE_SPEED) < 1e-9 and not row.seed  # counts: the median
        assert abs(row.power_w - BUSY_W) < 1e-9  # its own GPU's telemetry, not the energy
        assert {r.framework for r in rec.rows} == {"*", "pytorch"}
        await poll(lambda: _true(bool(letters)))
        assert letters[0].subject == subjects.lifecycle("junk")
    finally:
        await bus.close()
    # a restart replays the whole stream: the three jobs are not counted again
    bus, svc = await started(nats_url)
    try:
        assert svc.version == 3 and pooled(await record(test)).samples == 3
        await run_job(test, svc, "d", 4000.0)
        await samples_of(test, 4)
        await asyncio.sleep(0.2)  # nothing more is coming: the count stays at four
        rec = await record(test)
        assert pooled(rec).samples == 4 and rec.version == 4  # one put per job counted
    finally:
        await bus.close()
        await test.close()


async def test_main_serves_until_stopped(nats_url) -> None:
    svc = start_in_process("profiler", main, nats_url, alpha=0.3, min_samples=3)
    await asyncio.sleep(0.5)
    assert not svc.task.done()
    assert await svc.close() == 0
