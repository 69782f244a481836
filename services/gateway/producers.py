"""Job producers on the bus: a ``JobSpec`` published on ``jobs.submit`` becomes a job, as an HTTP
submission does (issue 13).

Why in the gateway: it alone creates jobs (it owns ``Submitted``) and holds what admission needs
(the cluster, for the never-fits check, and the tenants, for the command rule), so a bus job is
judged by exactly the rules of ``POST /v1/jobs`` and appears in the same read model.

Why a durable consumer (``DURABLE``): a submission published while every gateway is down must
become a job when one comes back, and several gateway replicas must share the work, each message
handled by one of them. It is created with "deliver new": on a cluster that already ran, the
JOBS stream holds every HTTP submission of the last 30 days, and a replay from the start would
bring back jobs the read model has long forgotten.

What a message becomes (see docs/runtime-contract.md, "Producers on the bus"):

- a job the read model knows, or that this gateway is submitting over HTTP right now: nothing
  (a repeat; the gateway's own HTTP submissions also pass through here);
- a sound one: ``Submitted`` (message id ``submitted-<id>``, the HTTP path's, so the two paths
  can never make two);
- one that decodes as a JobSpec but breaks a rule: ``Submitted`` (its ``command`` dropped) then
  ``Failed`` with the reasons, ``"Refused: <field>: <reason>; ..."`` (message id ``failed-<id>``,
  the placer's refusal id: an unsound job ends once whoever refuses it). The API shows it
  ``failed``;
- one that is not JSON, not a JobSpec (a wrong type, an unknown field) or has no sound id:
  ``dlq.gateway``, with the reason. There is no job id to answer on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from prometheus_client import Counter

from libs.bus.errors import PayloadTooLarge
from libs.bus.receive import Consumer
from proto import subjects
from proto.events import Failed, Submitted
from proto.jobs import JobSpec
from proto.tenants import TenantRecord
from proto.validation import FieldError, JobRejected, decode_fields, decode_job, describe, sound_id
from services.gateway.admission import admit

if TYPE_CHECKING:
    from services.gateway.service import Gateway

DURABLE = subjects.CONSUMER_SUBMIT  # the durable consumer on JOBS, filtered to jobs.submit
MAX_DELIVER = 10  # a publish that keeps failing (the bus is down) is retried this often
RETRY_DELAY_S = 1.0  # ... after 1 s, 2 s, ... (the receive loop's growing delay)
REASON_MAX_CHARS = 2000  # a Failed reason; every field's error fits many times over
REFUSED_PREFIX = "Refused: "

BUS_SUBMISSIONS = Counter(
    "mosaic_gateway_bus_submissions_total",
    "JobSpecs taken from jobs.submit by outcome: accepted, refused (Failed), repeat (known id),"
    " dead (dead-lettered: not a JobSpec or no sound id).",
    ["outcome"],
)


def parse_bus(data: bytes, *, now: float) -> JobSpec:
    """Decode a producer's message strictly, as ``admission.parse`` decodes an HTTP body (an
    unknown field or a wrong type is refused), and stamp ``submit_time`` = ``now``: the time a
    job waits counts in its priority, so a producer may not set it. Unlike HTTP no id is made up:
    without the producer's id a retry could not be recognised. Raises ``JobRejected``."""
    fields = decode_fields(data)
    fields["submit_time"] = msgspec.Raw(msgspec.json.encode(now))
    return decode_job(msgspec.json.encode(fields))


def bus_rules(spec: JobSpec, tenants: dict[str, TenantRecord]) -> list[FieldError]:
    """What a bus producer may not do that admission does not already check.

    The ``producer`` NATS user is an operator credential (like the HTTP admin token, it submits
    for any tenant: ``tenant`` is taken as named, default ``"default"``), but a ``command`` runs
    a process on a node, so it needs what HTTP asks of a tenant: the job's tenant must exist and
    hold ``may_run_commands``. The credential alone never grants it."""
    if spec.command is None:
        return []
    record = tenants.get(spec.tenant)
    if record is None or not record.may_run_commands:
        reason = (
            f"tenant {spec.tenant!r} may not run commands (an admin grants may_run_commands"
            " with `mosaic tenant add --may-run-commands`)"
        )
        return [FieldError("command", reason)]
    return []


def refusal_reason(errors: list[FieldError]) -> str:
    """The ``Failed`` reason of a refused bus submission: every field with its reason."""
    text = REFUSED_PREFIX + describe(errors)
    return text if len(text) <= REASON_MAX_CHARS else text[: REASON_MAX_CHARS - 1] + "…"


class Producers:
    """The consumer of ``jobs.submit`` in the gateway (see the module)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.consumer: Consumer | None = None

    async def start(self) -> Consumer:
        """Start consuming. Call it once the read model has caught up with LIFECYCLE: a
        redelivered message of a job the model does not show yet would otherwise be judged
        again."""
        self.consumer = await self.gw.bus.consume(
            subjects.STREAM_JOBS,
            subjects.SUBJECT_SUBMIT,
            msgspec.Raw,  # not JSON: dead-lettered by the receive loop; the rest is ours
            self.on_message,
            durable=DURABLE,
            deliver_all=False,
            max_deliver=MAX_DELIVER,
            retry_delay_s=RETRY_DELAY_S,
        )
        return self.consumer

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
            self.consumer = None

    async def on_message(self, raw: msgspec.Raw) -> None:
        """One message of ``jobs.submit``. Raises only when a publish failed (the receive loop
        retries it): a decision already published is deduplicated by its message id."""
        gw = self.gw
        data = bytes(raw)
        now = gw.clock.now()
        try:
            spec = parse_bus(data, now=now)
        except JobRejected as exc:
            return await self._dead(data, f"not a JobSpec: {describe(exc.errors)}")
        if not sound_id(spec.id):
            return await self._dead(data, "no usable job id: id must be 1-64 of [A-Za-z0-9_-]")
        if spec.id in gw.jobs or spec.id in gw.submitting:
            BUS_SUBMISSIONS.labels("repeat").inc()
            return None
        errors = admit(spec, now=now, nodes=gw.nodes.cluster()) or bus_rules(spec, gw.auth.tenants)
        if errors and spec.command is not None:
            # a refused job runs nothing, even in the moment before its Failed is out
            spec = msgspec.structs.replace(spec, command=None)
        submitted = Submitted(job_id=spec.id, time=now, spec=spec)
        try:
            new = await gw.bus.publish(
                subjects.lifecycle(spec.id), submitted, msg_id=f"submitted-{spec.id}"
            )
        except PayloadTooLarge as exc:  # only a server configured far below the job bounds
            return await self._dead(data, f"the job does not fit this bus: {exc}")
        if not new:  # another gateway (or its HTTP path) created this job first: it is theirs
            BUS_SUBMISSIONS.labels("repeat").inc()
            return None
        gw.jobs.apply(submitted)  # answer reads at once; the stream's copy is then a no-op
        if errors:
            await self._refuse(spec, errors, now)
            return None
        BUS_SUBMISSIONS.labels("accepted").inc()
        gw.log.info("job_submitted", job_id=spec.id, tenant=spec.tenant, source="bus")
        return None

    async def _refuse(self, spec: JobSpec, errors: list[FieldError], now: float) -> None:
        failed = Failed(job_id=spec.id, time=now, reason=refusal_reason(errors))
        await self.gw.bus.publish(subjects.lifecycle(spec.id), failed, msg_id=f"failed-{spec.id}")
        self.gw.jobs.apply(failed)
        BUS_SUBMISSIONS.labels("refused").inc()
        self.gw.log.info("job_refused", job_id=spec.id, source="bus", errors=describe(errors))

    async def _dead(self, data: bytes, reason: str) -> None:
        BUS_SUBMISSIONS.labels("dead").inc()
        await self.gw.bus.dead_letter(
            subjects.SUBJECT_SUBMIT, data, reason, pattern=subjects.SUBJECT_SUBMIT, kind="decode"
        )
