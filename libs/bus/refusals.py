"""Records a service took from the bus and ignored because they are unsound: one counter, one
log line each.

Why a helper: every handler that re-validates what it receives (rule 6; ``proto.validation``
and ``proto.validation_records``) must do the same two things instead of raising, which would
cost a retry and a dead letter per message, or worse, fail every later round of the loop that
reads the record (a node of GPU count 0 in the placer's view, an allocation of GPU 99 in the
scorer's). The message itself is acknowledged: it decoded, it was read, and it was refused.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter

from proto.validation import FieldError, describe

REFUSED = Counter(
    "mosaic_bus_records_refused_total",
    "Records taken from the bus that decoded but were unsound, ignored with a log line.",
    ["service", "record"],
)


def refused(bus: Any, record: str, errors: list[FieldError], **where: object) -> bool:
    """True (after counting and logging it) when ``errors`` is not empty: the caller ignores
    the record. ``bus``: the service's ``Bus`` (its service name and logger)."""
    if not errors:
        return False
    REFUSED.labels(bus.service, record).inc()
    bus.log.warning("record_refused", record=record, errors=describe(errors)[:500], **where)
    return True
