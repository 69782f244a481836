"""An active/standby lease in a KV bucket (the placer runs one active replica).

How: the holder writes ``LeaseRecord(holder, expires_at)`` under ``name`` and renews it with
compare-and-set every ``ttl_s / 3``. A contender waits; it may take the lease over (again by CAS
on the revision it read) only once ``expires_at`` has passed, so two contenders cannot both win.
A holder that cannot renew stops calling itself the holder at its own ``expires_at``, before
anyone else may take over. Times are wall-clock unix seconds: replicas must have roughly synced
clocks (NTP), and skew must stay well below ``ttl_s``.

Why no call here raises on a NATS error: the lease outlives NATS outages. While the server is
down ``try_acquire`` answers False and ``acquire`` keeps trying with a backoff (capped), and the
renewer keeps trying until its own expiry; a holder that lost the lease that way waits in
``acquire`` again. A task that died on a timeout would leave the replica a silent standby for
good (``mosaic_placer_active`` 0 while the process looked healthy).

The record lives here, not in ``proto``, because only this module reads or writes it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec

from libs.bus.errors import CasConflict, KeyExists
from libs.bus.kv import TypedKV
from libs.bus.tasks import cancel_and_wait
from libs.obs.logging import get_logger


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    holder: str
    expires_at: float  # wall unix seconds
    acquired_at: float


class Lease:
    """``await acquire()`` blocks until this holder has the lease, then renews it in a task."""

    def __init__(
        self,
        kv: TypedKV[LeaseRecord],
        name: str,
        holder: str,
        ttl_s: float = 10.0,
        *,
        poll_s: float | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.kv = kv
        self.name = name
        self.holder = holder
        self.ttl_s = ttl_s
        self.poll_s = poll_s if poll_s is not None else min(1.0, ttl_s / 4)
        self.on_lost = on_lost
        self.max_backoff_s = max(self.poll_s, min(5.0, ttl_s))
        self.last_error: str | None = None  # the NATS error of the last failed attempt
        self.lost = asyncio.Event()
        self._revision: int | None = None
        self._expires_at = 0.0
        self._acquired_at = 0.0
        self._renewer: asyncio.Task[None] | None = None
        self._log = get_logger(lease=name, holder=holder)

    @property
    def is_held(self) -> bool:
        return self._revision is not None and time.time() < self._expires_at

    def _record(self) -> LeaseRecord:
        now = time.time()
        return LeaseRecord(holder=self.holder, expires_at=now + self.ttl_s, acquired_at=now)

    async def try_acquire(self) -> bool:
        """One attempt: True when this holder now has the lease; False when someone else has it
        or NATS could not be asked (the error is kept in ``last_error`` and logged)."""
        record = self._record()
        try:
            current = await self.kv.get(self.name)
            if current is None:
                rev = await self.kv.create(self.name, record)
            elif current.value.holder == self.holder or current.value.expires_at < time.time():
                rev = await self.kv.update(self.name, record, current.revision)
            else:
                self.last_error = None
                return False
        except (KeyExists, CasConflict):
            self.last_error = None
            return False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # NATS down or slow: the caller simply tries again
            if self.last_error is None:
                self._log.warning("lease_acquire_failed", error=repr(exc))
            self.last_error = repr(exc)
            return False
        self.last_error = None
        self._revision, self._expires_at = rev, record.expires_at
        self._acquired_at = record.acquired_at
        self.lost.clear()
        return True

    async def acquire(self) -> None:
        """Wait until held, then start renewing. Polls every ``poll_s`` while someone else holds
        it; after NATS errors the wait doubles each time up to ``max_backoff_s``."""
        backoff = self.poll_s
        while not await self.try_acquire():
            if self.last_error is None:
                backoff = self.poll_s
                await asyncio.sleep(self.poll_s)
            else:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
        self._log.info("lease_acquired", ttl_s=self.ttl_s)
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew_loop(), name=f"lease:{self.name}")

    async def renew(self) -> bool:
        """Extend the lease by ``ttl_s``. False (and ``lost`` set) when someone else has it, or
        when NATS could not be reached and our own expiry has passed; a NATS error before that
        keeps the lease (True) and the next renewal tries again."""
        if self._revision is None:
            return False
        record = LeaseRecord(
            holder=self.holder, expires_at=time.time() + self.ttl_s, acquired_at=self._acquired_at
        )
        try:
            self._revision = await self.kv.update(self.name, record, self._revision)
        except CasConflict:
            self._mark_lost()
            return False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # server unreachable: keep trying until our expiry
            self._log.warning("lease_renew_failed", error=repr(exc))
            if time.time() >= self._expires_at:
                self._mark_lost()
                return False
            return True
        self._expires_at = record.expires_at
        return True

    async def _renew_loop(self) -> None:
        while self._revision is not None:
            # sooner than ttl/3 once a renewal failed, so a short blip does not cost the lease
            left = self._expires_at - time.time()
            await asyncio.sleep(max(0.05, min(self.ttl_s / 3, left / 2)))
            if not await self.renew():
                return

    def _mark_lost(self) -> None:
        if self._revision is not None:
            self._log.warning("lease_lost")
        self._revision = None
        self.lost.set()
        if self.on_lost is not None:
            self.on_lost()

    async def release(self) -> None:
        """Stop renewing and delete the record (only if still ours), so a standby takes over
        at once instead of waiting for expiry."""
        renewer, self._renewer = self._renewer, None
        await cancel_and_wait(renewer)  # before reading the revision: a last renewal may move it
        rev, self._revision = self._revision, None
        if rev is not None:
            try:
                await self.kv.delete(self.name, revision=rev)
                self._log.info("lease_released")
            except CasConflict:
                pass
            except Exception as exc:  # NATS down: the record simply expires
                self._log.warning("lease_release_failed", error=repr(exc))
