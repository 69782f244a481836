"""The scheduler's inference services: their replicas, their load, and the scale orders.

``stages.scale`` says how many replicas a service should have; this is the state that rule
reads (the services defined, their latest load reports, the hysteresis memory, which replicas
are waiting and which serve) and the orders it gives, as records both drivers apply alike:

* ``add``: new replica jobs (``proto.inference.replica_spec``). The driver makes each a job as
  a submission would (the simulator: an arrival now; the placer: a ``Submitted`` event) and
  queues it; the same tick's pass may place it. Replicas rank as their template's priority
  says (a service is usually high priority) and are protected from preemption like every
  inference job (``stages.preempt.protection``).
* ``stop``: replicas to end (waiting ones first, then the newest serving ones): the driver
  cancels a waiting one and stops a serving one, and reports the end as for any job.

The replicas known here come from the scheduler's own events (queued, started, ended), so a
driver that rebuilds the scheduler from its ledger and queue rebuilds this too; only the
hysteresis memory is lost with a restart, which can only delay a scale-down.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from libs.policy.stages.scale import ScaleMemory, next_verdict_s, scale_verdict
from proto.inference import InferenceService, LoadReport, replica_id, replica_spec
from proto.jobs import JobSpec


@dataclass(frozen=True, slots=True)
class ScaleOrder:
    """Change one service's replicas: start ``add``, end ``stop``. ``report_time`` is the
    load report the order answers (request-to-capacity counts from it)."""

    service: str
    add: tuple[JobSpec, ...]
    stop: tuple[str, ...]
    reason: str
    report_time: float | None = None


class Autoscaler:
    """The services of one scheduler (see the module docstring)."""

    def __init__(self) -> None:
        self.services: dict[str, InferenceService] = {}
        self.reports: dict[str, LoadReport] = {}
        self.memory: dict[str, ScaleMemory] = {}
        # service -> replica id -> serving (True) or waiting (False), in the order added
        self.replicas: dict[str, dict[str, bool]] = {}
        self._service_of: dict[str, str] = {}  # replica id -> its service
        self._stopping: set[str] = set()  # replicas ordered to stop, not yet gone
        self._due: set[str] = set()  # services to look at in the next step

    # ----- events ----------------------------------------------------------------------------
    def define(self, svc: InferenceService) -> None:
        """A service is defined or redefined (a new template or range applies from now)."""
        self.services[svc.id] = svc
        self.replicas.setdefault(svc.id, {})
        self._due.add(svc.id)

    def remove(self, service_id: str) -> None:
        """A service is removed: the next step stops every replica it has."""
        self.services.pop(service_id, None)
        self.reports.pop(service_id, None)
        self.memory.pop(service_id, None)
        self._due.add(service_id)

    def report(self, report: LoadReport) -> None:
        """A load report: kept if it is the newest of its service."""
        cur = self.reports.get(report.service)
        if cur is None or report.time >= cur.time:
            self.reports[report.service] = report
            self._due.add(report.service)

    def queued(self, spec: JobSpec) -> None:
        """A job waits: a replica of a service (``spec.service``) counts as asked."""
        if spec.service:
            self._service_of[spec.id] = spec.service
            self.replicas.setdefault(spec.service, {}).setdefault(spec.id, False)

    def started(self, spec: JobSpec) -> None:
        """A job runs: a replica counts as serving."""
        if spec.service:
            self._service_of[spec.id] = spec.service
            self.replicas.setdefault(spec.service, {})[spec.id] = True

    def gone(self, job_id: str) -> None:
        """A job ended or left the queue: a replica no longer counts (below the minimum, the
        next step replaces it; a retried one counts again when it is queued again)."""
        sid = self._service_of.pop(job_id, None)
        if sid is not None:
            self.replicas.get(sid, {}).pop(job_id, None)
            self._stopping.discard(job_id)
            self._due.add(sid)

    def waiting(self) -> list[str]:
        """Replicas asked for and not serving yet, not ordered to stop (the burst rule's
        candidates, ``stages.burst``), per service in the order added."""
        stopping = self._stopping
        return [
            rid
            for reps in self.replicas.values()
            for rid, on in reps.items()
            if not on and rid not in stopping
        ]

    # ----- decisions -------------------------------------------------------------------------
    def step(self, now: float) -> list[ScaleOrder]:
        """The orders at ``now`` for every service with something new (a report, a replica
        gone, a quiet window ended), in service-id order."""
        for sid, svc in self.services.items():
            at = next_verdict_s(svc, self.memory.get(sid, ScaleMemory()))
            if at is not None and at <= now:
                self._due.add(sid)
        due, self._due = sorted(self._due), set()
        orders: list[ScaleOrder] = []
        for sid in due:
            order = self._order(sid, now)
            if order is not None:
                orders.append(order)
        return orders

    def _order(self, sid: str, now: float) -> ScaleOrder | None:
        known = self.replicas.setdefault(sid, {})
        reps = {rid: on for rid, on in known.items() if rid not in self._stopping}
        svc = self.services.get(sid)
        if svc is None:  # removed: stop them all
            return self._stop(sid, reps, len(reps), "service removed", None)
        serving = sum(reps.values())
        report = self.reports.get(sid)
        verdict = scale_verdict(
            svc,
            report,
            serving=serving,
            asked=len(reps),
            memory=self.memory.get(sid, ScaleMemory()),
            now=now,
        )
        self.memory[sid] = verdict.memory
        delta = verdict.replicas - len(reps)
        when = report.time if report is not None else None
        if delta > 0:
            adds = tuple(replica_spec(svc, replica_id(sid, now, k), now) for k in range(delta))
            for spec in adds:  # asked from now on, so no later step asks for them again
                known[spec.id] = False
                self._service_of[spec.id] = sid
            return ScaleOrder(sid, adds, (), verdict.reason, when)
        if delta < 0:
            return self._stop(sid, reps, -delta, verdict.reason, when)
        return None

    def _stop(
        self, sid: str, reps: dict[str, bool], n: int, reason: str, when: float | None
    ) -> ScaleOrder | None:
        stop = _stop_order(reps, n)
        if not stop:
            return None
        self._stopping.update(stop)
        return ScaleOrder(sid, (), stop, reason, when)

    def next_s(self) -> float | None:
        """The earliest instant a quiet window ends (the driver's next tick for it)."""
        ats = [
            next_verdict_s(svc, self.memory.get(sid, ScaleMemory()))
            for sid, svc in self.services.items()
        ]
        known = [a for a in ats if a is not None]
        return min(known) if known else None


def _stop_order(replicas: dict[str, bool], n: int) -> tuple[str, ...]:
    """The ``n`` replicas to end first: waiting ones, then serving ones, newest first."""
    newest: Iterable[str] = reversed(list(replicas))
    ranked = sorted(newest, key=lambda rid: replicas[rid])  # stable: False (waiting) first
    return tuple(ranked[:n])
