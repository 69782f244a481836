"""Every subject, stream and KV bucket name. Nothing else in the code base spells one out."""

from __future__ import annotations

# --- durable streams (JetStream) ---------------------------------------------------------------
STREAM_JOBS = "JOBS"  # submissions and cancellations, deduplicated by Nats-Msg-Id
SUBJECT_SUBMIT = "jobs.submit"
SUBJECT_CANCEL = "jobs.cancel"
STREAM_JOBS_SUBJECTS = ("jobs.>",)

STREAM_LIFECYCLE = "LIFECYCLE"  # every lifecycle event of every job
LIFECYCLE_PREFIX = "lifecycle"
STREAM_LIFECYCLE_SUBJECTS = ("lifecycle.>",)

STREAM_NODECMD = "NODECMD"  # placer -> executor commands
NODE_PREFIX = "node"
STREAM_NODECMD_SUBJECTS = ("node.>",)

STREAM_DECISIONS = "DECISIONS"  # audit records
DECISIONS_PREFIX = "decisions"
STREAM_DECISIONS_SUBJECTS = ("decisions.>",)

STREAM_INTENTS = "INTENTS"  # defrag/thermal -> placer
INTENTS_PREFIX = "intents"
STREAM_INTENTS_SUBJECTS = ("intents.>",)

STREAM_DLQ = "DLQ"
DLQ_PREFIX = "dlq"
STREAM_DLQ_SUBJECTS = ("dlq.>",)

# --- plain NATS (latest sample wins) -----------------------------------------------------------
TELEMETRY_PREFIX = "telemetry"
TELEMETRY_ALL = "telemetry.*"
EXECUTOR_REPORT_PREFIX = "executor"  # executor.<node>: ExecutorReport, what the node runs
EXECUTOR_REPORTS_ALL = "executor.*"
QUEUE_UPDATED = "queue.updated"  # poke: the ranked queue in KV changed
LEDGER_UPDATED = "ledger.updated"  # poke: the ledger changed

# --- KV buckets --------------------------------------------------------------------------------
KV_NODES = "nodes"  # node id -> NodeSpec (owner: that node's telemetry service)
KV_LEDGER = "ledger"  # job id -> Allocation (owner: placer)
KV_QUEUE = "queue"  # "ranked" -> RankedQueue (owner: scorer)
KV_QUEUE_KEY = "ranked"
KV_LEASES = "leases"  # "placer" -> holder id (active/standby)
KV_PROFILES = "profiles"  # "<model>.<class>" -> learnt profile entry (owner: profiler)
KV_TENANTS = "tenants"  # tenant name -> TenantRecord, a hash of its API token (owner: gateway)

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
KV_BUCKETS: tuple[str, ...] = (KV_NODES, KV_LEDGER, KV_QUEUE, KV_LEASES, KV_PROFILES, KV_TENANTS)


def lifecycle(job_id: str) -> str:
    return f"{LIFECYCLE_PREFIX}.{job_id}"


def node_command(node: str, verb: str) -> str:
    """verb: run | kill | checkpoint"""
    return f"{NODE_PREFIX}.{node}.{verb}"


def node_commands(node: str) -> str:
    return f"{NODE_PREFIX}.{node}.*"


def telemetry(node: str) -> str:
    return f"{TELEMETRY_PREFIX}.{node}"


def executor_report(node: str) -> str:
    return f"{EXECUTOR_REPORT_PREFIX}.{node}"


def decisions(service: str) -> str:
    return f"{DECISIONS_PREFIX}.{service}"


def dlq(service: str) -> str:
    return f"{DLQ_PREFIX}.{service}"
