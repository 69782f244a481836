"""The ledger's garbage: the delete marker each ended job leaves behind.

Why the placer purges them: the ledger bucket is bounded (``proto.subjects``), and with history 1
a deleted key still holds its marker (about 100 bytes), one per job that ever ran; at its
``max_bytes`` the bucket refuses writes, and the placer could place nothing. Markers older than
``after_s`` are purged (``TypedKV.purge_deletes`` keeps a value written after the marker).
"""

from __future__ import annotations

from typing import Any

from libs.bus.kv import TypedKV


async def purge_ledger_markers(kv: TypedKV[Any], log: Any, after_s: float) -> int:
    """Purge old delete markers; returns how many. A failure is logged and left for the next
    round: housekeeping never fails a placement cycle."""
    try:
        n = await kv.purge_deletes(after_s)
    except Exception as exc:
        log.warning("ledger_purge_failed", error=repr(exc))
        return 0
    if n:
        log.info("ledger_markers_purged", markers=n)
    return n
