"""The placer's knobs, from flags (``python -m services.placer --help``) or in tests directly."""

from __future__ import annotations

import argparse
import os
import socket
import uuid
from dataclasses import dataclass, field

from libs.bus.snapshot import SnapshotSettings
from services.placer.reconcile import ReconcileSettings

__all__ = ["PlacerSettings", "ReconcileSettings", "settings_from_args"]


@dataclass(frozen=True)
class PlacerSettings:
    lease_ttl_s: float = 5.0  # a crashed active is replaced after at most this (wall s)
    tick_s: float = 2.0  # a cycle at least this often (wall s), even without a trigger
    debounce_s: float = 0.05  # triggers within this window make one cycle
    settle_s: float = 2.0  # the node set must be unchanged this long before a never-fits refusal
    holder: str = ""
    # audit records: placements per cycle explained with their rivals (the rest carry the
    # chosen node's terms), and changed wait reasons published per cycle (the rest next cycle)
    explain_per_cycle: int = 16
    # suspend idle nodes and wake them for blocked jobs (the policy's power stage, as in the
    # simulator); off: every node stays awake (e.g. executors without a power hook)
    power_saving: bool = True
    reasons_per_cycle: int = 500
    explain_waits_per_cycle: int = 50  # of those, published with numbers (rank, lacks...)
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
    wedged_after_s: float = 120.0  # /healthz 503 when the cycle loop made no turn this long
    # the ledger's delete markers (one per ended job) are purged this often, once older than
    # purge_after_s: the bucket is bounded and would otherwise fill and refuse writes
    purge_every_s: float = 600.0
    purge_after_s: float = 1800.0
    # the tracker's snapshots (services.placer.snapshot); MOSAIC_SNAPSHOT* in the environment
    snapshots: SnapshotSettings = field(default_factory=SnapshotSettings)

    def holder_id(self) -> str:
        return self.holder or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def settings_from_args(args: argparse.Namespace) -> PlacerSettings:
    """Settings from parsed flags; a flag that is absent (a test's bare namespace) keeps its
    default."""
    d = PlacerSettings()
    r = d.reconcile
    return PlacerSettings(
        lease_ttl_s=getattr(args, "lease_ttl_s", d.lease_ttl_s),
        tick_s=getattr(args, "tick_s", d.tick_s),
        debounce_s=getattr(args, "debounce_s", d.debounce_s),
        settle_s=getattr(args, "settle_s", d.settle_s),
        holder=getattr(args, "holder", "") or "",
        power_saving=not getattr(args, "no_power_saving", False),
        reconcile=ReconcileSettings(
            misses=getattr(args, "lost_after_reports", r.misses),
            down_intervals=getattr(args, "down_after_intervals", r.down_intervals),
        ),
        snapshots=getattr(args, "snapshots", None) or SnapshotSettings.from_env(),
    )
