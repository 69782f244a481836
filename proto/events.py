"""Job lifecycle events: a tagged union on the ``type`` field, one durable stream.

Every job ends in exactly one of Completed, Failed or Cancelled.
"""

from __future__ import annotations

import msgspec

from proto.jobs import JobSpec


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    job_id: str
    time: float
    node: str | None = None
    reason: str = ""


class Submitted(_Event, tag="submitted"):
    spec: JobSpec
    # the job's trace: W3C traceparent of the gateway's submit span ("" in older events), the
    # parent of every later decision span about the job (libs.obs.jobspans)
    trace: str = ""


class Queued(_Event, tag="queued"):
    """A pending job's news. Two publishers: the scorer once per attempt with the job's score
    at admission and no ``reason``; the placer with its reason to wait (and its current score)
    whenever that reason changes. ``rank`` is no longer set (the placer orders the queue)."""

    rank: int | None = None
    score: float | None = None
    attempt: int = 0  # the attempt announced (0: not named, as in older events and the placer's)


class Placed(_Event, tag="placed"):
    gpu_indices: tuple[int, ...] = ()
    gpu_share: float = 1.0
    attempt: int = 1


class Started(_Event, tag="started"):
    attempt: int = 1


class Checkpointed(_Event, tag="checkpointed"):
    progress: float = 0.0  # fraction of the work done at the checkpoint


class Preempted(_Event, tag="preempted"):
    # the attempt it ends (0: not named, an event from before this field): a fold that sees it
    # again (a restart from a snapshot replays a few events) can tell it from the next attempt's
    attempt: int = 0
    # an elastic resize (a shrink or a grow back): the job waits again on this many GPUs
    # (``libs.policy.stages.shrink.fold_resize``: every read model resizes it the same way,
    # once per ``attempt``, as sizes are not monotone); 0: it keeps its size
    resize_gpus: int = 0


class Completed(_Event, tag="completed"):
    runtime_s: float = 0.0
    energy_kwh: float = 0.0


class Failed(_Event, tag="failed"):
    pass


class Cancelled(_Event, tag="cancelled"):
    pass


LifecycleEvent = (
    Submitted
    | Queued
    | Placed
    | Started
    | Checkpointed
    | Preempted
    | Completed
    | Failed
    | Cancelled
)
TERMINAL_TYPES: tuple[type, ...] = (Completed, Failed, Cancelled)


def is_terminal(event: LifecycleEvent) -> bool:
    return isinstance(event, TERMINAL_TYPES)


def event_type(event: LifecycleEvent) -> str:
    return type(event).__struct_config__.tag  # type: ignore[attr-defined]
