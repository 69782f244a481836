"""The ledger against what the nodes report: which allocations hold GPUs for nothing. Pure.

Why: the ledger says what the placer *allocated*; only a node's executor knows what *runs*
(``proto.nodes.ExecutorReport`` on ``executor.<node>``, every few wall seconds and on each job
start and end). An executor that crashed, or a node that died, leaves allocations whose jobs
will never end by themselves; the placer requeues them (``Preempted``, reason ``lost: …``) so
their GPUs are freed and the job runs again elsewhere.

The rules (``ReconcileSettings``):

- an attempt the lifecycle says ``Started`` on node N is *lost* once at least ``misses`` reports
  of N received after that ``Started`` omit it, the first of them at least ``grace_intervals``
  report intervals ago;
- a node is *down* when no report from it has arrived for ``down_intervals`` of its report
  interval; every allocation on a down node is lost, started or not; it is up again with its
  next report;
- until some node has reported at all, nothing is down: a cluster whose executors do not report
  (an older executor) keeps the old behaviour instead of losing every job. A node that never
  reported counts as silent since this placer started once any other node reports.

Why wall time measured on receipt, not the reports' ``time``: reports carry the Mosaic clock,
which runs scaled (60x in the demo) and comes from another host; a grace of "three intervals" is
about how often the executor speaks, which is wall time, and ``time.monotonic`` at receipt needs
neither synced clocks nor the factor. Why "after that Started" and several reports: a report in
flight while the job started, or one report listing a stale snapshot, must not requeue a job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from proto.events import LifecycleEvent, Preempted, Started, is_terminal
from proto.ledger import Allocation
from proto.nodes import ExecutorReport


@dataclass(frozen=True)
class ReconcileSettings:
    misses: int = 3  # reports omitting a started attempt before it is lost
    grace_intervals: float = 2.0  # ... the first of them at least this many intervals ago
    down_intervals: float = 3.0  # a node silent this many report intervals is down
    default_interval_s: float = 5.0  # assumed for a node that has not reported yet (wall s)
    min_interval_s: float = 0.05  # bounds on a reported interval (a bad report cannot make
    max_interval_s: float = 60.0  # a node never time out, nor time out at once)


@dataclass
class _Expect:
    """A started attempt we expect its node to report."""

    node: str
    attempt: int
    seen_at: float  # when the Started event reached us
    misses: int = 0
    first_miss: float | None = None


@dataclass
class _NodeSeen:
    last: float  # receipt of the last report
    interval_s: float
    boot_id: str


@dataclass(frozen=True)
class Lost:
    job_id: str
    attempt: int
    node: str
    reason: str
    kind: str  # "node_down" or "not_running"


@dataclass(frozen=True)
class ReportNews:
    """What one report changed, for the shell to log."""

    came_up: bool = False  # the node was down and reports again
    rebooted: bool = False  # a new boot id: the executor restarted
    stale: tuple[tuple[str, int], ...] = ()  # attempts it runs that we do not expect there


class Reconciler:
    """Folds lifecycle events and executor reports; answers which nodes are down and which
    allocations are lost. ``now`` is always ``time.monotonic()`` in the service."""

    def __init__(self, settings: ReconcileSettings | None = None, *, now: float) -> None:
        self.settings = settings or ReconcileSettings()
        self.since = now
        self.reports = 0
        self.nodes: dict[str, _NodeSeen] = {}
        self.down: dict[str, float] = {}  # node -> seconds silent when last checked
        self._expect: dict[str, _Expect] = {}  # job -> its latest started attempt
        self._by_node: dict[str, set[str]] = {}

    # --- input -----------------------------------------------------------------------------
    def on_event(self, ev: LifecycleEvent, now: float) -> None:
        if isinstance(ev, Started) and ev.node:
            old = self._expect.get(ev.job_id)
            if old is not None and old.attempt >= ev.attempt:
                return  # a replayed or duplicated Started
            self._drop(ev.job_id)
            self._expect[ev.job_id] = _Expect(ev.node, ev.attempt, seen_at=now)
            self._by_node.setdefault(ev.node, set()).add(ev.job_id)
        elif isinstance(ev, Preempted) or is_terminal(ev):
            self._drop(ev.job_id)

    def _drop(self, job: str) -> None:
        e = self._expect.pop(job, None)
        if e is not None:
            self._by_node.get(e.node, set()).discard(job)

    def on_report(self, report: ExecutorReport, now: float) -> ReportNews:
        s = self.settings
        node = report.node
        interval = min(max(report.interval_s, s.min_interval_s), s.max_interval_s)
        prev = self.nodes.get(node)
        self.nodes[node] = _NodeSeen(last=now, interval_s=interval, boot_id=report.boot_id)
        self.reports += 1
        came_up = self.down.pop(node, None) is not None
        listed = {r.job_id: r.attempt for r in report.running}
        for job in self._by_node.get(node, ()):
            e = self._expect[job]
            if listed.get(job) == e.attempt:
                e.misses, e.first_miss = 0, None
            elif e.seen_at < now:
                e.misses += 1
                if e.first_miss is None:
                    e.first_miss = now
        stale = tuple(
            (job, attempt)
            for job, attempt in listed.items()
            if (e := self._expect.get(job)) is None or (e.node, e.attempt) != (node, attempt)
        )
        return ReportNews(
            came_up=came_up,
            rebooted=prev is not None and prev.boot_id != report.boot_id,
            stale=stale,
        )

    # --- answers ---------------------------------------------------------------------------
    def interval(self, node: str) -> float:
        seen = self.nodes.get(node)
        return seen.interval_s if seen is not None else self.settings.default_interval_s

    def refresh_down(self, nodes: Iterable[str], now: float) -> tuple[set[str], set[str]]:
        """Recompute ``down`` over ``nodes`` (the known node ids); returns (went down, back up).
        A node no longer known is dropped from ``down`` without being "back up"."""
        s = self.settings
        was = set(self.down)
        down: dict[str, float] = {}
        for node in nodes:
            seen = self.nodes.get(node)
            if seen is not None:
                silent = now - seen.last
            elif self.reports:
                silent = now - self.since
            else:
                continue  # nobody reports: reconciliation is dormant
            if silent >= s.down_intervals * self.interval(node):
                down[node] = silent
        self.down = down
        return set(down) - was, was - set(down) - (was - set(nodes))

    def lost(self, ledger: Mapping[str, Allocation], now: float) -> list[Lost]:
        """Allocations of ``ledger`` to requeue: on a down node, or a started attempt its node
        has stopped listing (see the module docstring)."""
        s = self.settings
        out = []
        for job, alloc in ledger.items():
            if alloc.node in self.down:
                why = f"lost: node {alloc.node} down (no report for {self.down[alloc.node]:.0f} s)"
                out.append(Lost(job, alloc.attempt, alloc.node, why, "node_down"))
                continue
            e = self._expect.get(job)
            if e is None or (e.node, e.attempt) != (alloc.node, alloc.attempt):
                continue
            grace = s.grace_intervals * self.interval(alloc.node)
            if e.misses >= s.misses and e.first_miss is not None and now - e.first_miss >= grace:
                why = f"lost: not running on {e.node}"
                out.append(Lost(job, alloc.attempt, alloc.node, why, "not_running"))
        return out
