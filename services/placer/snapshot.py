"""The placer's tracker restarts from a snapshot: the wiring that does not fit ``service``.

Why: the tracker is folded from LIFECYCLE, and replaying the stream from its first message on
every start costs time in proportion to the cluster's history and, with the stream bounded
(30 days / 1 GiB), forgets jobs whose ``Submitted`` aged out: a job running for longer than that
would be unknown after a restart, its allocation never freed. So every placer replica (the
standby too: both write the same object, either is a valid snapshot of the same stream) saves
its tracker (``JobTracker.encode``) to the ``snapshots`` bucket as ``placer.tracker``, and a
start loads it and replays only the events after it (``libs.bus.snapshot``).

What a snapshot does not carry, and how the placer gets it back:

* the ledger: it lives in KV and is read on taking over, as before;
* its own commits whose ``Placed`` was not out yet (``JobTracker.noted``, never saved): takeover
  sees a ledger entry without its ``Placed`` and resends it, with the same message id;
* the reconciler's list of started attempts, which it builds from ``Started`` events: those
  folded into the snapshot are not replayed, so ``seed_reconciler`` rebuilds the list from the
  ledger on taking over (an attempt that started and still holds an allocation).
"""

from __future__ import annotations

import time

from libs.bus.connection import Bus
from libs.bus.snapshot import SnapshotFollower, SnapshotSettings
from proto import subjects
from proto.events import Started
from proto.ledger import Allocation
from services.placer.reconcile import Reconciler
from services.placer.tracker import JobTracker

SNAPSHOT_KEY = "placer.tracker"  # the tracker's object in the snapshots bucket


def tracker_snapshots(bus: Bus, settings: SnapshotSettings) -> SnapshotFollower:
    """The follower that restores, feeds and saves the tracker from LIFECYCLE."""
    return SnapshotFollower(bus, SNAPSHOT_KEY, subjects.STREAM_LIFECYCLE, settings)


def seed_reconciler(
    reconciler: Reconciler, ledger: dict[str, Allocation], tracker: JobTracker
) -> int:
    """Tell ``reconciler`` of each allocation whose attempt started (by the tracker) and still
    holds resources, as its ``Started`` would have; returns how many. An attempt it knows
    already (its ``Started`` was replayed) is left as it is (``Reconciler.on_event``)."""
    now, told = time.monotonic(), 0
    for job, alloc in ledger.items():
        if tracker.started_seen(job, alloc.attempt) and not tracker.holds_nothing(
            job, alloc.attempt
        ):
            ev = Started(job_id=job, time=alloc.time, node=alloc.node, attempt=alloc.attempt)
            reconciler.on_event(ev, now)
            told += 1
    return told
