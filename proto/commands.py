"""Commands the placer sends to a node's executor on ``node.<node>.<verb>``."""

from __future__ import annotations

import msgspec

from proto.ledger import Allocation


class RunCommand(msgspec.Struct, frozen=True, kw_only=True):
    allocation: Allocation
    runtime_s: float  # expected runtime on this node's GPU model, Mosaic-clock seconds
    progress: float = 0.0  # resume point, fraction of the work already done
    # traceparent of the placement that sent it (else the job's): the executor's spans of this
    # attempt (start, run, complete) hang under it, across executor restarts (it is journaled)
    trace: str = ""
    # a gang (a job over several nodes, ``proto.ledger.Part``): every part's node, the leader
    # (who reports the job's lifecycle) first; each gets its own part as ``allocation``. The
    # parts start together or, after ``gang_start_timeout_s`` wall seconds, not at all
    # (``services.executor.gang``). Empty: a job on one node.
    gang: tuple[str, ...] = ()
    gang_start_timeout_s: float = 60.0


class KillCommand(msgspec.Struct, frozen=True, kw_only=True):
    """Stop a job. With ``attempt`` only that attempt is stopped (another running there is left
    alone); ``silent`` stops it without any lifecycle event: the placer sends it for an attempt
    it already requeued (a node that came back running a job placed again elsewhere), whose end
    was published then, so the job still ends in exactly one terminal state."""

    job_id: str
    reason: str
    attempt: int | None = None
    silent: bool = False


class CheckpointCommand(msgspec.Struct, frozen=True, kw_only=True):
    """Checkpoint a running job and give its GPUs back: the executor answers ``Checkpointed``
    (the progress kept) then ``Preempted`` (the attempt), once the checkpoint is done.

    ``attempt``: only that attempt (a late command for an earlier one is ignored); ``cost_s``:
    simulated mode only, the Mosaic seconds this checkpoint takes (default: the executor's
    ``--checkpoint-cost-s``), during which the job still holds its GPUs."""

    job_id: str
    reason: str
    attempt: int | None = None
    cost_s: float | None = None
    # an elastic resize: the job resumes on this many GPUs, fewer (a shrink,
    # libs.policy.stages.shrink) or more (a grow back, stages.grow; the name is kept for the
    # wire's sake); the executor names it in its Preempted (``resize_gpus``); 0: same size
    shrink_to: int = 0
