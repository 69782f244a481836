"""An executor killed with -9 in the middle of a checkpoint (issue 14): the restarted one
finishes it, so the job is neither lost nor run twice: one Checkpointed, one Preempted, no
Completed, the attempt reported as holding its GPUs until then, and a later attempt runs once.
A real nats-server, the executor as a real process, local jobs as real processes."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from proto.events import Checkpointed, Completed, Preempted, Started
from proto.jobs import JobSpec
from services.executor.journal import Checkpoint, Journal
from tests.runtime._jobs import checkpoint, progress_record, run
from tests.services.test_executor import T4
from tests.services.test_executor_checkpoint import PYTHON, ROOT
from tests.services.test_executor_recovery import (  # noqa: F401 (fixtures)
    Node,
    kinds,
    local_node,
    sim_node,
    until,
)

COST_S = 6000.0  # 6 wall seconds at factor 1000: time to kill and start an executor


def journaled_checkpoint(n: Node, job_id: str) -> Checkpoint | None:
    entries, _ = Journal(n.state_dir / T4.id).load()
    return next((e.checkpoint for e in entries if e.job_id == job_id), None)


async def test_a_simulated_checkpoint_cut_by_a_crash_is_finished_once(
    sim_node: Node,  # noqa: F811
) -> None:
    n = sim_node
    first = await n.start()
    await run(n.bus, JobSpec(id="m1"), runtime_s=600_000)
    await n.h.wait("m1", 1)
    await until(lambda: n.running(first) == {"m1"})
    await checkpoint(n.bus, "m1", "defrag", cost_s=COST_S)
    await until(lambda: journaled_checkpoint(n, "m1") is not None)
    ck = journaled_checkpoint(n, "m1")
    assert ck is not None and ck.done_at == ck.requested_at + COST_S
    n.crash()
    second = await n.start()
    await until(lambda: n.running(second) == {"m1"})  # still holds its GPUs, under the new boot
    assert kinds(n.h, "m1") == ["Started"]
    _, checkpointed, preempted = await n.h.wait("m1", 3, timeout_s=30)
    assert isinstance(checkpointed, Checkpointed) and isinstance(preempted, Preempted)
    # the cost counted from the request, not paid again from the restart
    assert ck.done_at <= checkpointed.time < ck.done_at + 2000
    assert checkpointed.progress == ck.estimate
    await until(lambda: n.running(second) == set())
    await run(n.bus, JobSpec(id="m1"), runtime_s=600_000)  # attempt 1 redelivered: ignored
    await run(n.bus, JobSpec(id="m1"), runtime_s=300, attempt=2, progress=ck.estimate)
    await n.h.wait("m1", 5, timeout_s=20)
    await asyncio.sleep(0.3)
    assert kinds(n.h, "m1") == ["Started", "Checkpointed", "Preempted", "Started", "Completed"]
    assert [e.attempt for e in n.h.of("m1") if isinstance(e, Started)] == [1, 2]


# a job on libs.runtime whose save takes a while (long enough for a crash to fall into it)
SLOW_SAVER = """python3 -c '
import sys, time; sys.path.insert(0, "{root}")
import libs.runtime as runtime
n = [0]
def save():
    time.sleep({save_s}); open("saved", "w").write(str(n[0]))
rt = runtime.start(save=save)
while True:
    time.sleep(0.02); n[0] += 1; rt.progress(n[0] / 1000); rt.step()
'"""


@pytest.mark.skipif(PYTHON is None, reason="no python3 in /usr/bin:/bin for jobs")
@pytest.mark.parametrize(
    "when",
    [
        "while it saves",
        # make test-all (test time): the other two crash points
        pytest.param("after it saved and exited", marks=pytest.mark.slow),
        pytest.param("before the signal went out", marks=pytest.mark.slow),
    ],
)
async def test_a_local_checkpoint_cut_by_a_crash_keeps_the_jobs_progress(
    local_node: Node,  # noqa: F811
    when: str,
) -> None:
    """Three crashes. While it saves: the executor dies after the signal, the job goes on
    saving, and the next executor waits for it. After it saved and exited: the job is done
    before the next executor starts, which reads its status and progress file without
    signalling anything. Before the signal went out: the journal has the checkpoint but the
    job never heard of it (the crash fell between the two), so the next executor signals."""
    n = local_node
    await n.start()
    spec = JobSpec(id="m2", command=SLOW_SAVER.format(root=ROOT, save_s=3), checkpoint_grace_s=60)
    await run(n.bus, spec, runtime_s=600_000)
    await n.h.wait("m2", 1)
    await until(lambda: (progress_record(n.work_root, "m2", 1) or {}).get("steps", 0) >= 3)
    rc = Journal(n.state_dir / T4.id).rc_path("m2", 1)
    if when != "before the signal went out":
        await checkpoint(n.bus, "m2", "thermal")
        await until(lambda: journaled_checkpoint(n, "m2") is not None)
        await asyncio.sleep(0.3)  # the signal is out; the save has begun
        n.crash()
        if when == "after it saved and exited":
            await until(rc.exists, timeout_s=20)  # its wrapper wrote its status and exited
    else:
        n.crash()
        journal = Journal(n.state_dir / T4.id)
        (entry,) = journal.load()[0]
        ck = Checkpoint(
            reason="thermal",
            requested_at=entry.started_at + 100,
            done_at=entry.started_at + 100,
            estimate=0.001,
            grace_until=time.time() + 60,
        )
        journal.put(msgspec.structs.replace(entry, checkpoint=ck))
    second = await n.start()
    _, checkpointed, preempted = await n.h.wait("m2", 3, timeout_s=40)
    saved = int((n.work_root / "m2-1" / "saved").read_text())
    assert isinstance(checkpointed, Checkpointed) and isinstance(preempted, Preempted)
    assert checkpointed.progress == pytest.approx(saved / 1000)  # the job's, saved once
    assert "progress reported by the job" in checkpointed.reason
    assert checkpointed.reason.startswith("thermal") and preempted.attempt == 1
    await until(lambda: n.running(second) == set())
    await asyncio.sleep(0.3)
    assert kinds(n.h, "m2") == ["Started", "Checkpointed", "Preempted"]
    assert not any(isinstance(e, Completed) for e in n.h.of("m2"))
