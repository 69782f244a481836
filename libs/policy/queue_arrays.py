"""A queue's columns (``QueueArrays``): the numbers ranking reads, one numpy column each.

Apart from ``queue`` because two owners build them: ``queue.PendingQueue`` keeps them
incrementally, and ``QueueArrays.from_jobs`` builds them from any list of jobs (a test, a
driver that ranks a plain list). ``row_of`` is the one definition of a job's row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from libs.policy.types import PendingJob
from proto.jobs import WORKLOAD_CLASSES

CLASS_INDEX = MappingProxyType({c: i for i, c in enumerate(WORKLOAD_CLASSES)})
# the queue's table, one float column each (``PendingQueue.table``); fast.score_table_rows
# reads it in this order
COLUMNS = ("prio", "es", "enq", "est", "prog", "deadline", "gpus", "cls", "tenant", "inference")


@dataclass(slots=True)
class QueueArrays:
    """Columns of a queue, row i = job i. ``deadline`` is NaN when absent; ``tenant`` indexes
    ``tenants``."""

    prio: np.ndarray
    es: np.ndarray
    enq: np.ndarray
    est: np.ndarray
    prog: np.ndarray
    deadline: np.ndarray
    gpus: np.ndarray
    cls: np.ndarray
    tenant: np.ndarray
    # 1.0 for an inference job (the day/night boost, libs.policy.daynight), 2.0 for a service's
    # replica (its rank boost too, libs.policy.stages.burst.service_boost)
    inference: np.ndarray
    tenants: list[str]

    @classmethod
    def from_jobs(cls, jobs: Sequence[PendingJob]) -> QueueArrays:
        if hasattr(jobs, "arrays"):  # a PendingQueue keeps its columns
            return jobs.arrays()
        tenants: dict[str, int] = {}
        rows = [row_of(j, tenants) for j in jobs]
        a = np.array(rows, dtype=float).reshape(len(rows), len(COLUMNS))
        return cls.of_table(a, list(tenants))

    @classmethod
    def of_table(cls, table: np.ndarray, tenants: list[str]) -> QueueArrays:
        """The columns of a table float[row, column] in ``COLUMNS`` order (views of it; the
        class and tenant columns as integers)."""
        return cls(
            *(table[:, k] for k in range(7)),
            table[:, 7].astype(np.int64),
            table[:, 8].astype(np.int64),
            table[:, 9],
            tenants,
        )


def take(q: QueueArrays, rows: np.ndarray) -> QueueArrays:
    """The rows ``rows`` of ``q`` (same tenant list, so tenant indices keep their meaning)."""
    return QueueArrays(
        *(getattr(q, c)[rows] for c in COLUMNS),
        q.tenants,
    )


def row_of(j: PendingJob, tenants: dict[str, int]) -> tuple:
    s = j.spec
    t = tenants.setdefault(s.tenant, len(tenants))
    return (
        s.priority,
        s.energy_sensitivity,
        j.enqueued_at,
        s.est_runtime_s,
        j.progress,
        np.nan if j.urgency_deadline is None else j.urgency_deadline,
        s.gpus,
        CLASS_INDEX.get(s.workload_class, CLASS_INDEX["other"]),
        t,
        2.0 if s.service else 1.0 if s.kind == "inference" else 0.0,  # 2: a replica
    )
