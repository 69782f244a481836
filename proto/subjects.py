"""Every subject, stream and KV bucket name. Nothing else in the code base spells one out.

Beside each stream and bucket stands its retention default (issue 12: nothing bounded growth, at
about 3.7 KB of JetStream per job). Once a limit is reached the oldest messages are discarded;
``libs.bus.topology`` applies these, with the operator's overrides from the environment
(``MOSAIC_STREAM_<NAME>_MAX_AGE_S``, ``_MAX_BYTES``, ``_MAX_MSGS`` and
``MOSAIC_KV_<BUCKET>_MAX_BYTES``; see docs/runtime-contract.md). The server reserves the sum of
every ``max_bytes`` up front, so the defaults (about 3 GiB in all) fit a laptop's JetStream store.
"""

from __future__ import annotations

import msgspec


class StreamLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Retention of one stream; the oldest messages go once any limit is reached."""

    max_age_s: float  # seconds a message is kept; 0 = no age limit
    max_bytes: int  # bytes the stream may hold; -1 = no size limit
    max_msgs: int = -1  # messages the stream may hold; -1 = no count limit


DAY_S = 86_400.0
MIB = 1024 * 1024
GIB = 1024 * MIB

# --- durable streams (JetStream) ---------------------------------------------------------------
STREAM_JOBS = "JOBS"  # submissions and cancellations, deduplicated by Nats-Msg-Id
SUBJECT_SUBMIT = "jobs.submit"
SUBJECT_CANCEL = "jobs.cancel"
# the gateway's durable consumer of SUBJECT_SUBMIT: bus producers' jobs (services.gateway.producers)
CONSUMER_SUBMIT = "gateway-producers"
STREAM_JOBS_SUBJECTS = ("jobs.>",)
# a job may pend for weeks; 512 MiB is about 500k submissions
STREAM_JOBS_LIMITS = StreamLimits(max_age_s=30 * DAY_S, max_bytes=512 * MIB)

STREAM_LIFECYCLE = "LIFECYCLE"  # every lifecycle event of every job
LIFECYCLE_PREFIX = "lifecycle"
STREAM_LIFECYCLE_SUBJECTS = ("lifecycle.>",)
# read models replay it: large but bounded (about 500k jobs of events)
STREAM_LIFECYCLE_LIMITS = StreamLimits(max_age_s=30 * DAY_S, max_bytes=1 * GIB)

STREAM_NODECMD = "NODECMD"  # placer -> executor commands
NODE_PREFIX = "node"
STREAM_NODECMD_SUBJECTS = ("node.>",)
# a command matters until its executor acts on it
STREAM_NODECMD_LIMITS = StreamLimits(max_age_s=7 * DAY_S, max_bytes=256 * MIB)

STREAM_DECISIONS = "DECISIONS"  # audit records
DECISIONS_PREFIX = "decisions"
STREAM_DECISIONS_SUBJECTS = ("decisions.>",)
# the audit trail `mosaic explain` reads
STREAM_DECISIONS_LIMITS = StreamLimits(max_age_s=14 * DAY_S, max_bytes=512 * MIB)

STREAM_INTENTS = "INTENTS"  # defrag/thermal -> placer
INTENTS_PREFIX = "intents"
STREAM_INTENTS_SUBJECTS = ("intents.>",)
# an intent is checked against the ledger at once, or is stale
STREAM_INTENTS_LIMITS = StreamLimits(max_age_s=1 * DAY_S, max_bytes=64 * MIB)

STREAM_DLQ = "DLQ"
DLQ_PREFIX = "dlq"
STREAM_DLQ_SUBJECTS = ("dlq.>",)
# a flood of garbage must not fill the disk: a week, 256 MiB, a million letters
STREAM_DLQ_LIMITS = StreamLimits(max_age_s=7 * DAY_S, max_bytes=256 * MIB, max_msgs=1_000_000)

# --- plain NATS (latest sample wins) -----------------------------------------------------------
TELEMETRY_PREFIX = "telemetry"
TELEMETRY_ALL = "telemetry.*"
EXECUTOR_REPORT_PREFIX = "executor"  # executor.<node>: ExecutorReport, what the node runs
EXECUTOR_REPORTS_ALL = "executor.*"
LEDGER_UPDATED = "ledger.updated"  # poke: the ledger changed
# stepped clock (libs/clock.py, libs/bus/steps.py; tests only): the controller's Step, and each
# participant's StepAck on clock.ack.<participant>
CLOCK_STEP = "clock.step"
CLOCK_ACK_PREFIX = "clock.ack"
CLOCK_ACKS_ALL = "clock.ack.>"

# --- KV buckets --------------------------------------------------------------------------------
KV_NODES = "nodes"  # node id -> NodeSpec (owner: that node's telemetry service)
KV_LEDGER = "ledger"  # job id -> Allocation (owner: placer)
KV_LEASES = "leases"  # "placer" -> holder id (active/standby)
KV_PROFILES = "profiles"  # PROFILES_KEY -> proto.profiles.ProfilesRecord (owner: profiler)
PROFILES_KEY = "table"  # the one key: the whole learnt table, replaced at once
KV_TENANTS = "tenants"  # tenant name -> TenantRecord, a hash of its API token (owner: gateway)
KV_CORDONS = "cordons"  # node id -> proto.cordons.Cordon; uncordon deletes it (owner: gateway)

# --- object store buckets ----------------------------------------------------------------------
# "<service>.<model>" -> that read model's latest snapshot and the stream sequence it reflects
# (owner: that service; libs.bus.snapshot). One object per key, replaced whole on each save.
OBJ_SNAPSHOTS = "snapshots"

STREAMS: dict[str, tuple[str, ...]] = {
    STREAM_JOBS: STREAM_JOBS_SUBJECTS,
    STREAM_LIFECYCLE: STREAM_LIFECYCLE_SUBJECTS,
    STREAM_NODECMD: STREAM_NODECMD_SUBJECTS,
    STREAM_DECISIONS: STREAM_DECISIONS_SUBJECTS,
    STREAM_INTENTS: STREAM_INTENTS_SUBJECTS,
    STREAM_DLQ: STREAM_DLQ_SUBJECTS,
}
STREAM_DEFAULT_LIMITS = StreamLimits(max_age_s=7 * DAY_S, max_bytes=256 * MIB)  # any not listed
STREAM_LIMITS: dict[str, StreamLimits] = {
    STREAM_JOBS: STREAM_JOBS_LIMITS,
    STREAM_LIFECYCLE: STREAM_LIFECYCLE_LIMITS,
    STREAM_NODECMD: STREAM_NODECMD_LIMITS,
    STREAM_DECISIONS: STREAM_DECISIONS_LIMITS,
    STREAM_INTENTS: STREAM_INTENTS_LIMITS,
    STREAM_DLQ: STREAM_DLQ_LIMITS,
}
KV_BUCKETS: tuple[str, ...] = (KV_NODES, KV_LEDGER, KV_LEASES, KV_PROFILES, KV_TENANTS)
KV_BUCKETS += (KV_CORDONS,)  # issue 13 (a line of its own: concurrent additions merge)


def lifecycle(job_id: str) -> str:
    return f"{LIFECYCLE_PREFIX}.{job_id}"


POWER_VERB = "power"  # node.<node>.power: proto.power.PowerCommand (suspend | wake)


def node_command(node: str, verb: str) -> str:
    """verb: run | kill | checkpoint | power"""
    return f"{NODE_PREFIX}.{node}.{verb}"


def node_commands(node: str) -> str:
    return f"{NODE_PREFIX}.{node}.*"


def telemetry(node: str) -> str:
    return f"{TELEMETRY_PREFIX}.{node}"


def executor_report(node: str) -> str:
    return f"{EXECUTOR_REPORT_PREFIX}.{node}"


GANG_PREFIX = "gang"  # gang.<job>.<attempt>: proto.gangs.GangSignal between a gang's executors


def gang(job_id: str, attempt: int) -> str:
    return f"{GANG_PREFIX}.{job_id}.{attempt}"


def clock_ack(participant: str) -> str:
    return f"{CLOCK_ACK_PREFIX}.{participant}"


def intents(service: str) -> str:
    """intents.<service>: proto.intents.Intent from the defragmenter or the thermal guard."""
    return f"{INTENTS_PREFIX}.{service}"


CONSUMER_INTENTS = "placer-intents"  # the placer's durable consumer of STREAM_INTENTS


def decisions(service: str) -> str:
    return f"{DECISIONS_PREFIX}.{service}"


def dlq(service: str) -> str:
    return f"{DLQ_PREFIX}.{service}"


# --- KV retention (bytes a bucket may hold, history 1; no TTL: a ledger entry must not expire) --
# A full bucket refuses writes (KV streams discard new): it never drops a value to make room.
KV_DEFAULT_MAX_BYTES = 64 * MIB  # any bucket not listed below
KV_MAX_BYTES: dict[str, int] = {
    KV_NODES: 64 * MIB,  # one NodeSpec per node
    KV_LEDGER: 256 * MIB,  # one Allocation per running job
    KV_LEASES: 8 * MIB,  # a handful of lease records
    KV_PROFILES: 64 * MIB,  # one record: a row per (GPU model, workload class, framework)
    KV_CORDONS: 8 * MIB,  # one small record per cordoned node
}


def kv_max_bytes(bucket: str) -> int:
    """The default size limit of KV ``bucket``."""
    return KV_MAX_BYTES.get(bucket, KV_DEFAULT_MAX_BYTES)


# inference services (issue 16): their definitions and the load they report
KV_SERVICES = "services"  # service id -> proto.inference.InferenceService (owner: gateway)
LOAD_PREFIX = "load"  # load.<service>: proto.inference.LoadReport (core NATS, like telemetry)
LOAD_ALL = "load.*"
KV_BUCKETS += (KV_SERVICES,)  # created by ensure_topology like every bucket
KV_MAX_BYTES[KV_SERVICES] = 8 * MIB  # one definition per service


def load(service: str) -> str:
    return f"{LOAD_PREFIX}.{service}"
