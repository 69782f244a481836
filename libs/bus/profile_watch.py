"""Follow the profiler's table (KV ``profiles``): the placer and the scorer use the newest.

Why one helper: both must treat the record as untrusted (revalidated whole; an unsound one is
refused and the table they had is kept), turn it into the table the scheduler reads (the
shipped table with the learnt rows in place, ``libs.policy.profile_wire``) and ignore a
version older than one already applied (a watch redelivers the current value on reconnect).
A deleted record means "nothing learnt": back to the shipped table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from libs.bus.kv import KvWatch
from libs.bus.refusals import refused
from libs.policy.profile_wire import table_from_rows
from libs.policy.profiles import ProfileTable
from proto import subjects
from proto.profiles import ProfilesRecord, revalidate_profiles

OnTable = Callable[[ProfileTable, int], Awaitable[None]]


class ProfileFollower:
    """Calls ``on_table(table, version)`` with each newer table from KV ``profiles``."""

    def __init__(self, bus: Any, base: ProfileTable, on_table: OnTable) -> None:
        self.bus, self.base, self._on_table = bus, base, on_table
        self.version = 0
        self.watch: KvWatch | None = None

    async def start(self) -> ProfileFollower:
        kv = await self.bus.kv(subjects.KV_PROFILES, ProfilesRecord)
        self.watch = await kv.watch(self._on_record, key=subjects.PROFILES_KEY)
        return self

    async def _on_record(self, key: str, rec: ProfilesRecord | None) -> None:
        if rec is None:
            self.version = 0
            await self._on_table(self.base, 0)
            return
        if refused(self.bus, "profiles", revalidate_profiles(rec), key=key):
            return
        if rec.version <= self.version:
            return
        self.version = rec.version
        await self._on_table(table_from_rows(self.base, rec.rows), rec.version)
