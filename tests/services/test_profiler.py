"""services/profiler on a real nats-server: completed jobs in, the learnt table in KV
``profiles`` out; a restart takes the table back without counting a job twice; an undecodable
event is dead-lettered and the profiler keeps learning."""

from __future__ import annotations

import asyncio

from proto import subjects
from proto.decisions import DeadLetter
from proto.events import Checkpointed, Completed, Submitted
from proto.jobs import JobSpec
from proto.nodes import NodeSpec
from proto.profiles import ProfilesRecord
from services.profiler.service import main
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


async def finish(bus, job: str, t: float, *, resumed_from: float = 0.0) -> None:
    """A job's Submitted, perhaps a checkpoint, and its Completed on NODE at TRUE_SPEED."""
    spec = JobSpec(id=job, workload_class="cnn", framework="pytorch", est_runtime_s=600.0)
    await bus.publish(subjects.lifecycle(job), Submitted(job_id=job, time=t, spec=spec))
    if resumed_from:
        ev = Checkpointed(job_id=job, time=t, node=NODE.id, progress=resumed_from)
        await bus.publish(subjects.lifecycle(job), ev)
    run_s = 600.0 * (1 - resumed_from) / TRUE_SPEED
    energy = 50.0 * run_s / 3.6e6  # 50 W on its one GPU
    done = Completed(job_id=job, time=t + run_s, node=NODE.id, runtime_s=run_s, energy_kwh=energy)
    await bus.publish(subjects.lifecycle(job), done)


async def record(bus) -> ProfilesRecord | None:
    kv = await bus.kv(subjects.KV_PROFILES, ProfilesRecord)
    e = await kv.get(subjects.PROFILES_KEY)
    return e.value if e is not None else None


def pooled(rec: ProfilesRecord):
    key = ("t4", "cnn", "*")
    return next(r for r in rec.rows if (r.model, r.workload_class, r.framework) == key)


async def test_learns_from_completed_jobs_restarts_without_double_counting(nats_url) -> None:
    bus = await connect(nats_url)
    letters: list[DeadLetter] = []

    async def on_letter(d: DeadLetter) -> None:
        letters.append(d)

    await bus.subscribe(subjects.dlq("profiler"), DeadLetter, on_letter)
    await put_nodes(bus, [NODE])
    svc = start_in_process("profiler", main, nats_url, alpha=0.3, min_samples=3)
    try:
        await finish(bus, "a", 1000.0)
        await bus.nc.publish(subjects.lifecycle("junk"), b"{not json")  # to dlq.profiler
        await finish(bus, "b", 2000.0, resumed_from=0.5)  # half the work in its last attempt
        await finish(bus, "c", 3000.0)

        async def three() -> ProfilesRecord | None:
            r = await record(bus)
            return r if r is not None and pooled(r).samples == 3 else None

        rec = await poll(three)
        row = pooled(rec)
        assert abs(row.speed - TRUE_SPEED) < 1e-9
        assert abs(row.power_w - 50.0) < 1e-6
        assert {r.framework for r in rec.rows} == {"*", "pytorch"}
        assert letters and letters[0].subject == subjects.lifecycle("junk")
    finally:
        assert await svc.close() == 0
    # a restart replays the whole stream: the three jobs are not counted again
    svc = start_in_process("profiler", main, nats_url, alpha=0.3, min_samples=3)
    try:
        await finish(bus, "d", 4000.0)

        async def four() -> ProfilesRecord | None:
            r = await record(bus)
            return r if r is not None and pooled(r).samples >= 4 else None

        rec = await poll(four)
        await asyncio.sleep(0.3)  # nothing more is coming: the count stays at four
        rec = await record(bus)
        assert pooled(rec).samples == 4 and rec.version == 4  # one put per job counted
    finally:
        assert await svc.close() == 0
        await bus.close()
