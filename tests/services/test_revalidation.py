"""The bus is a trust boundary (rule 6): unsound specs published straight onto NATS, bypassing
the gateway, are refused by the services with the gateway's own rules, and scheduling goes on.

Real nats-server, the real scorer and placer in process, the stand-in executor of the placer
tests; plus the pure folds and the executor's refusal of an unsound run command.
"""

from __future__ import annotations

import asyncio
import math

import msgspec

from libs.bus import Bus
from libs.clock import Clock
from libs.obs.logging import get_logger
from libs.obs.tracing import setup_tracing
from proto import subjects
from proto.commands import RunCommand
from proto.decisions import DeadLetter
from proto.events import Checkpointed, Completed, Failed, LifecycleEvent, Placed, Submitted
from proto.jobs import JobSpec
from proto.ledger import Allocation
from proto.validation import revalidate_command, revalidate_spec
from services.executor.executor import NodeExecutor
from services.executor.journal import Journal
from services.executor.runners import SimRunner
from services.placer.service import Placer, PlacerSettings
from services.placer.tracker import JobTracker
from services.scorer.pending import PendingSet
from services.scorer.service import main as scorer_main
from tests.services._placer_executor import FakeExecutor
from tests.services._scorer_util import (
    by_job,
    connect,
    poll,
    put_nodes,
    start_in_process,
    submit,
)
from tests.services.test_placer import FAST, small_cluster

NOW = 1_700_000_000.0


def _bad_specs() -> dict[str, JobSpec]:
    """Specs the gateway refuses, each of them encodable as JSON (NaN is not: see below)."""
    return {
        "neg": JobSpec(id="neg", gpus=-1, submit_time=NOW),
        "tiny": JobSpec(id="tiny", gpus=1e-320, submit_time=NOW),
        "forever": JobSpec(id="forever", est_runtime_s=1e308, submit_time=NOW),
        "far": JobSpec(id="far", deadline=NOW + 400 * 86400, submit_time=NOW),
        "wide": JobSpec(id="wide", gpus=1e6, submit_time=NOW),
    }


async def _publish_raw_submitted(bus: Bus, job: str, spec: JobSpec) -> None:
    """A Submitted as a forger would send it: straight onto lifecycle.<job>, no gateway."""
    await bus.publish(subjects.lifecycle(job), Submitted(job_id=job, time=NOW, spec=spec))


async def _events(bus: Bus) -> list[LifecycleEvent]:
    """The LIFECYCLE stream in order, skipping what does not decode (the NaN message)."""
    info = await bus.js.stream_info(subjects.STREAM_LIFECYCLE)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        raw = await bus.js.get_msg(subjects.STREAM_LIFECYCLE, seq)
        try:
            out.append(msgspec.json.decode(raw.data, type=LifecycleEvent))
        except msgspec.DecodeError:
            continue
    return out


async def test_unsound_submissions_on_the_bus_fail_and_a_valid_job_still_runs(nats_url):
    bus = await connect(nats_url)
    await put_nodes(bus, small_cluster())
    executor = FakeExecutor(bus, run_s=0.2)
    await executor.start()
    scorer = start_in_process("scorer", scorer_main, nats_url, rescore_s=0.5, debounce_s=0.05)
    placer_bus = await Bus.connect(nats_url, "placer")
    placer = Placer(
        placer_bus,
        Clock.from_env(),
        get_logger(service="placer"),
        setup_tracing("placer"),
        PlacerSettings(holder="p1", **FAST),
    )
    await placer.start()
    stop = asyncio.Event()
    run = asyncio.create_task(placer.run(stop))
    bad = _bad_specs()
    try:
        for job, spec in bad.items():
            await _publish_raw_submitted(bus, job, spec)
        # NaN has no JSON form: a forger writes it as bytes, the bus decoder dead-letters it
        nan = b'{"type":"submitted","job_id":"nan","time":1,"spec":{"id":"nan","gpus":NaN}}'
        await bus.js.publish(subjects.lifecycle("nan"), nan)
        await submit(bus, JobSpec(id="good", gpus=1))
        everyone = set(bad) | {"good"}

        async def all_ended() -> dict:
            per = by_job(await _events(bus))
            ended = {
                j
                for j in everyone
                if any(isinstance(e, Completed | Failed) for e in per.get(j, []))
            }
            return per if ended == everyone else {}

        per = await poll(all_ended, timeout_s=30)
        # cycles keep running (a raising one would keep the lease but place nothing more)
        assert await placer.cycle() == 0
    finally:
        stop.set()
        await run
        await placer_bus.close()
        assert await scorer.close() == 0
        await executor.close()
    assert isinstance(per["good"][-1], Completed)
    for job in bad:
        ends = [e for e in per[job] if isinstance(e, Completed | Failed)]
        assert len(ends) == 1 and isinstance(ends[0], Failed), per[job]
        assert ends[0].reason.startswith("invalid job:"), ends[0]
        assert not any(isinstance(e, Placed) for e in per[job])
    fields = {j: per[j][-1].reason for j in bad}
    assert "gpus" in fields["neg"] and "gpus" in fields["tiny"] and "gpus" in fields["wide"]
    assert "est_runtime_s" in fields["forever"] and "deadline" in fields["far"]
    assert "nan" not in per  # not even an event: the stream's copy only reached dead letters
    assert {r.allocation.job_id for r in executor.runs} == {"good"}
    await bus.close()


def test_the_folds_keep_unsound_specs_out_and_hand_them_to_the_placer():
    pending, tracker = PendingSet(), JobTracker()
    bad = Submitted(job_id="neg", time=NOW, spec=JobSpec(id="neg", gpus=-1))
    good = Submitted(job_id="ok", time=NOW, spec=JobSpec(id="ok"))
    swapped = Submitted(job_id="x", time=NOW, spec=JobSpec(id="y"))  # spec of another job
    for ev in (bad, good, swapped, Submitted(job_id="neg", time=NOW, spec=JobSpec(id="neg"))):
        pending.apply(ev)
        tracker.apply(ev)
    assert set(pending.pending) == {"ok"} and pending.refused == 2
    refusals = {spec.id: errs for spec, errs in tracker.invalid_jobs()}
    assert set(refusals) == {"neg", "x"}  # the first Submitted of a job counts
    assert [e.field for e in refusals["neg"]] == ["gpus"] and refusals["x"][0].field == "id"
    assert set(tracker.specs) == {"ok"}
    tracker.apply(Failed(job_id="neg", time=NOW + 1, reason="invalid job"))
    assert {s.id for s, _ in tracker.invalid_jobs()} == {"x"}
    for ev in (Checkpointed(job_id="ok", time=NOW, progress=math.nan),):
        pending.apply(ev)
        tracker.apply(ev)
    assert "ok" not in tracker.progress  # an unsound progress is ignored


def _run_command(**changes: object) -> RunCommand:
    node = small_cluster()[0]
    alloc = Allocation(
        job_id="r-1",
        node=node.id,
        gpu_indices=(0,),
        gpu_share=1.0,
        gpu_mem_gb=8.0,
        host_mem_gb=16.0,
        cpus=4.0,
        time=NOW,
        spec=JobSpec(id="r-1"),
    )
    cmd = RunCommand(allocation=alloc, runtime_s=60.0)
    spec_changes = changes.pop("spec", None)
    if spec_changes is not None:
        assert isinstance(spec_changes, dict)
        alloc = msgspec.structs.replace(alloc, spec=JobSpec(id="r-1", **spec_changes))
    return msgspec.structs.replace(cmd, allocation=alloc, **changes)


async def test_the_executor_dead_letters_an_unsound_run_command(nats_url, tmp_path):
    assert revalidate_command(_run_command()) == []
    bus = await connect(nats_url)
    node = small_cluster()[0]
    ex_bus = await Bus.connect(nats_url, "executor")
    clock = Clock.from_env()
    journal = Journal(tmp_path / "journal")
    executor = NodeExecutor(ex_bus, node, SimRunner(clock), clock, journal=journal)
    await executor.start()
    try:
        for cmd in (_run_command(runtime_s=-5.0), _run_command(spec={"gpus": -1.0})):
            await bus.publish(subjects.node_command(node.id, "run"), cmd)
        await bus.publish(subjects.node_command(node.id, "run"), _run_command())

        async def letters() -> list[DeadLetter]:
            info = await bus.js.stream_info(subjects.STREAM_DLQ)
            out = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                raw = await bus.js.get_msg(subjects.STREAM_DLQ, seq)
                out.append(msgspec.json.decode(raw.data, type=DeadLetter))
            return out if len(out) >= 2 else []

        got = await poll(letters)
        await poll(lambda: asyncio.sleep(0, ("r-1", 1) in executor.accepted))
    finally:
        # bounded: it hung once (300 s, fresh clone, two workers compiling) with no stack of
        # where; a hang here now fails in 30 s and says it was the shutdown
        await asyncio.wait_for(executor.shutdown(), 30.0)
        await ex_bus.close()
    reasons = sorted(d.reason for d in got)
    assert "runtime_s" in reasons[1] and "allocation.spec.gpus" in reasons[0], reasons
    assert all(d.service == "executor" for d in got)
    assert revalidate_spec(JobSpec(id="r-1")) == []
    await bus.close()
