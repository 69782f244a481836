"""Commands the placer sends to a node's executor on ``node.<node>.<verb>``."""

from __future__ import annotations

import msgspec

from proto.ledger import Allocation


class RunCommand(msgspec.Struct, frozen=True, kw_only=True):
    allocation: Allocation
    runtime_s: float  # expected runtime on this node's GPU model, Mosaic-clock seconds
    progress: float = 0.0  # resume point, fraction of the work already done


class KillCommand(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    reason: str


class CheckpointCommand(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    reason: str
