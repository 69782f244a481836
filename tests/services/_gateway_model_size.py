"""Bytes per job of the gateway's jobs read model, in memory and in its snapshot.

Why a module of its own: the figure is quoted in ``docs/design-notes.md`` and checked by
``test_gateway_snapshot.py``; both use this one measurement. Each synthetic job goes Submitted,
Queued, Placed, Started, ``extra`` Checkpointed, Completed, decoded from JSON one event at a time
as the consumer does; memory is what tracemalloc sees held after a collection.

    .venv/bin/python -m tests.services._gateway_model_size [JOBS] [EXTRA_EVENTS]
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from typing import Any

import msgspec

from proto.events import (
    Checkpointed,
    Completed,
    LifecycleEvent,
    Placed,
    Queued,
    Started,
    Submitted,
)
from proto.jobs import JobSpec
from services.gateway.jobs_view import JobsModel


def history(i: int, extra: int) -> list[bytes]:
    """One job's lifecycle as the JSON messages LIFECYCLE holds."""
    jid = f"job-{i:06d}-abcdef"
    t = 1_700_000_000.0 + i
    spec = JobSpec(
        id=jid,
        tenant="vision",
        gpus=2,
        submit_time=t,
        constraints=("a100",),
        command="python train.py --epochs 10",
    )
    events: list[Any] = [
        Submitted(job_id=jid, time=t, spec=spec),
        Queued(job_id=jid, time=t + 1, reason="Resources", score=0.5, rank=3),
        Placed(job_id=jid, time=t + 3, node="a100-0", gpu_indices=(0, 1)),
        Started(job_id=jid, time=t + 4, node="a100-0"),
    ]
    events += [
        Checkpointed(job_id=jid, time=t + 5 + k, node="a100-0", progress=k / 1000)
        for k in range(extra)
    ]
    events.append(Completed(job_id=jid, time=t + 10_000, node="a100-0", runtime_s=9996.0))
    return [msgspec.json.encode(e) for e in events]


def measure(jobs: int, extra: int, model: Any = None) -> tuple[float, float]:
    """(bytes per job in memory, bytes per job in the snapshot) for ``model`` (a JobsModel)."""
    raw = [history(i, extra) for i in range(jobs)]
    decoder = msgspec.json.Decoder(LifecycleEvent)
    gc.collect()
    tracemalloc.start()
    try:
        m = model if model is not None else JobsModel()
        for messages in raw:
            for data in messages:
                m.apply(decoder.decode(data))
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return held / jobs, len(m.encode()) / jobs


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    extra = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    memory, snapshot = measure(n, extra)
    print(f"{n} jobs, {extra + 5} events each: {memory:.0f} B/job in memory, ", end="")
    print(f"{snapshot:.0f} B/job in the snapshot")
