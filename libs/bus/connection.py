"""The typed NATS + JetStream connection every service talks through.

Why a wrapper and not raw nats-py in each service: every subscription must do the same four
things — decode into a ``proto`` Struct, dead-letter what does not decode (and keep going), run the
handler inside a span that continues the publisher's trace, and count it — and every durable
publish must carry a ``Nats-Msg-Id`` so retries are deduplicated. Doing that once here keeps the
services thin and the guarantees uniform.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from opentelemetry import trace

from libs.bus import topology
from libs.bus.errors import BusUnavailable, PayloadTooLarge
from libs.bus.kv import TypedKV
from libs.bus.limits import (
    DEAD_LETTER_REASON_MAX,
    PAYLOAD_MARGIN_BYTES,
    DecodeLimits,
    header_size,
    truncated,
)
from libs.bus.monitor import LoopMonitor
from libs.bus.receive import Consumer, Receiver, make_decoder, subject_matches
from libs.bus.tracectx import inject_headers
from libs.obs.health import Health
from libs.obs.logging import get_logger
from libs.obs.metrics import DEAD_LETTER_KINDS, DEAD_LETTERS
from proto import subjects
from proto.decisions import DeadLetter

__all__ = ["Bus", "Consumer", "make_decoder", "subject_matches"]

T = TypeVar("T")
Handler = Callable[[T], Awaitable[None]]

MSG_ID_HEADER = "Nats-Msg-Id"
DUPLICATE_WINDOW_S = topology.DUPLICATE_WINDOW_S

# server errors after which reconnecting cannot help: the credentials are wrong or gone
_FINAL_SERVER_ERRORS = ("authorization violation", "authentication expired", "revoked")


class _ReconnectingClient(NatsClient):
    """nats-py's client, except that a server ``-ERR`` reconnects instead of closing for good.

    Why: on any ``-ERR`` but a stale connection or a permissions violation, nats-py 2.x closes
    the client (``_process_err``), and a closed client never comes back. The server sends one
    for a publish over ``max_payload`` ("Maximum Payload Violation"), a slow consumer, a parser
    error — and drops that connection; so one oversized message cut the placer off NATS for
    good (issue 12). Here those take the same path as a lost socket: the normal reconnect, with
    the subscriptions replayed. Authentication failures still close (retrying the same
    credentials would loop), and ``Bus``'s "nats" health check then reports the closed
    connection, so the supervisor restarts the service.
    """

    async def _process_err(self, err_msg: str) -> None:
        text = err_msg.strip("'")
        lowered = text.lower()
        if (
            self.is_connecting
            or "permissions violation" in lowered
            or "stale connection" in lowered
            or any(e in lowered for e in _FINAL_SERVER_ERRORS)
        ):
            await super()._process_err(err_msg)
            return
        err = nats.errors.Error(f"nats: {text}")
        self._err = err
        await self._error_cb(err)
        await self._process_op_err(err)


class Bus(Receiver):
    """One service's connection: ``nc`` (core NATS), ``js`` (JetStream), typed helpers.

    Receiving (``subscribe``, ``consume``) lives in ``libs.bus.receive``."""

    def __init__(
        self, nc: NatsClient, service: str, url: str = "", *, limits: DecodeLimits | None = None
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.service = service
        self.url = url
        self.log = get_logger(service=service, component="bus")
        self._tracer = trace.get_tracer("libs.bus")
        self._consumers: list[Consumer] = []
        self._subs: list[Subscription] = []
        self._watchers: list[Any] = []
        self._monitors: dict[str, LoopMonitor] = {}
        # what a received message may be before it is decoded (size, JSON depth)
        self.limits = limits or DecodeLimits.from_env()
        self._health = Health(service)
        self.health = self._health

    @property
    def health(self) -> Health:
        """The service's health checks (``libs.obs.health``): "nats" and one per receive loop.

        ``serve`` hands in the one ``/healthz`` reports; the checks of loops started before
        move to it, so none is lost whichever comes first."""
        return self._health

    @health.setter
    def health(self, health: Health) -> None:
        self._health = health
        health.register("nats", self._connection_problem)
        for name, monitor in self._monitors.items():
            health.register(name, monitor.check)

    def _monitor(self, name: str, *, wedged_after_s: float, idle_ok: bool) -> LoopMonitor:
        """A ``LoopMonitor`` for a new loop, registered as health check ``name`` (``#2`` etc.
        appended when that name is taken)."""
        unique, n = name, 1
        while unique in self._monitors:
            n += 1
            unique = f"{name}#{n}"
        monitor = LoopMonitor(
            unique,
            service=self.service,
            wedged_after_s=wedged_after_s,
            idle_ok=idle_ok,
            log=self.log,
            on_stop=self._forget_monitor,
        )
        self._monitors[unique] = monitor
        self._health.register(unique, monitor.check)
        return monitor

    def _forget_monitor(self, monitor: LoopMonitor) -> None:
        self._monitors.pop(monitor.name, None)
        self._health.unregister(monitor.name)

    # --- connection ----------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        url: str,
        service: str,
        *,
        attempts: int = 20,
        delay_s: float = 0.25,
        **options: Any,
    ) -> Bus:
        """Connect, retrying with exponential backoff (capped at 5 s) while the server starts.

        Once connected, nats-py reconnects on its own forever, after a server ``-ERR`` too
        (``_ReconnectingClient``); a service only gives up at start.
        ``options`` go to ``nats.connect`` as they are: the service's credentials (``user``,
        ``password``, ``inbox_prefix``, ``tls``; ``libs.bus.auth.load_connect_options``).
        """
        options.pop("servers", None)  # a credentials file names them; ``url`` decides here
        servers: str | list[str] = [u.strip() for u in url.split(",")] if "," in url else url
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        log = get_logger(service=service, component="bus")
        last: BaseException | None = None
        for i in range(attempts):
            try:
                nc = _ReconnectingClient()
                await nc.connect(
                    servers,
                    name=service,
                    connect_timeout=2,
                    allow_reconnect=True,
                    # nats-py retries the *initial* connect through the same reconnect loop, so
                    # -1 here would hang forever on a wrong URL; this loop does the retrying.
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0.5,
                    error_cb=_error_cb(log),
                    disconnected_cb=_event_cb(log, "nats_disconnected"),
                    reconnected_cb=_event_cb(log, "nats_reconnected"),
                    **options,
                )
                nc.options["max_reconnect_attempts"] = -1  # once up, reconnect forever
                return cls(nc, service, url)
            except (OSError, TimeoutError, nats.errors.Error) as exc:
                last = exc
                if i + 1 < attempts:
                    await asyncio.sleep(min(delay_s * 2**i, 5.0))
        raise BusUnavailable(
            f"cannot reach NATS at {url} after {attempts} attempts: {type(last).__name__}: {last}"
        )

    def _connection_problem(self) -> str | None:
        """A closed connection never comes back by itself (nats-py gave up): unhealthy, so the
        supervisor restarts the service. A reconnect in progress is not a problem yet."""
        if self.nc.is_closed:
            return "NATS connection closed"
        return None

    async def close(self) -> None:
        """Stop consumers and watchers, then drain: in-flight handlers finish, publishes flush.
        Every loop is marked stopped first, so ending them raises no health alarm."""
        for monitor in list(self._monitors.values()):
            monitor.stop()
        for c in self._consumers:
            await c.stop()
        for w in self._watchers:
            with contextlib.suppress(Exception):
                await w.stop()
        self._consumers.clear()
        self._watchers.clear()
        if not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()
            with contextlib.suppress(Exception):
                await self.nc.close()

    # --- topology ------------------------------------------------------------------------------

    async def ensure_topology(self, env: Mapping[str, str] | None = None) -> None:
        """Create every stream and KV bucket of ``proto.subjects``, with their retention limits
        (``env`` overrides, default ``os.environ``); see ``libs.bus.topology``."""
        await topology.ensure_topology(self.js, self.log, env)

    # --- publishing ----------------------------------------------------------------------------

    async def publish(
        self,
        subject: str,
        msg: msgspec.Struct,
        *,
        msg_id: str | None = None,
        durable: bool = True,
    ) -> bool:
        """Encode ``msg`` as JSON and publish it with the current trace context in the headers.

        ``durable``: JetStream publish, waiting for the stream's ack; with ``msg_id`` the server
        drops a repeat within the duplicate window, and this returns False for it. Not durable:
        fire-and-forget core NATS (telemetry, pokes); always True.
        """
        data = msgspec.json.encode(msg)
        return await self.publish_bytes(subject, data, msg_id=msg_id, durable=durable)

    async def publish_bytes(
        self, subject: str, data: bytes, *, msg_id: str | None = None, durable: bool = True
    ) -> bool:
        """``publish`` for bytes already encoded. Raises ``PayloadTooLarge`` (sending nothing)
        when ``data`` and the headers could exceed the server's max payload."""
        headers = inject_headers()
        if msg_id:
            headers[MSG_ID_HEADER] = msg_id
        self.check_payload(subject, data, headers)
        if durable:
            ack = await self.js.publish(subject, data, headers=headers)
            return not ack.duplicate
        await self.nc.publish(subject, data, headers=headers or None)
        return True

    def max_publish_bytes(self) -> int:
        """The most a message (data plus headers) may be: the server's ``max_payload`` (from
        its INFO, so a reconfigured server counts) less ``PAYLOAD_MARGIN_BYTES``."""
        return self.nc.max_payload - PAYLOAD_MARGIN_BYTES

    def check_payload(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        """Raise ``PayloadTooLarge`` unless ``data`` with ``headers`` fits; see
        ``max_publish_bytes``. Sent anyway, the server would drop the connection."""
        size = len(data) + header_size(headers)
        limit = self.max_publish_bytes()
        if size > limit:
            raise PayloadTooLarge(subject, size, limit)

    async def dead_letter(
        self,
        subject: str,
        data: bytes,
        reason: str,
        *,
        pattern: str | None = None,
        msg_id: str | None = None,
        kind: str = "decode",
    ) -> None:
        """Park ``data`` (received on ``subject``) on ``dlq.<service>`` with ``reason``; count it
        (``mosaic_dead_letters_total`` by subscription, ``..._by_kind_total`` by ``kind``:
        too_large, too_deep, decode, handler).

        Never raises: a dead letter that cannot be published is logged with its reason, because
        the caller is a handler loop that must keep running. Data over ``DEAD_LETTER_DATA_MAX``
        is cut (the reason says so), so the letter itself always fits the server's limit.
        """
        DEAD_LETTERS.labels(self.service, pattern or subject).inc()
        DEAD_LETTER_KINDS.labels(self.service, kind).inc()
        kept, note = truncated(data)
        if len(reason) > DEAD_LETTER_REASON_MAX:
            reason = reason[:DEAD_LETTER_REASON_MAX] + "…"
        reason += note
        letter = DeadLetter(
            service=self.service, subject=subject, reason=reason, time=time.time(), data=kept
        )
        self.log.warning("dead_letter", subject=subject, reason=reason, size=len(data))
        try:
            await self.publish(subjects.dlq(self.service), letter, msg_id=msg_id)
        except Exception as exc:
            self.log.error("dead_letter_lost", subject=subject, reason=reason, error=repr(exc))

    # --- key/value -----------------------------------------------------------------------------

    async def kv(self, bucket: str, type_: type[T]) -> TypedKV[T]:
        """A typed view of KV ``bucket`` (which ``ensure_topology`` created)."""
        raw = await self.js.key_value(bucket)
        return TypedKV(self, raw, bucket, type_)

    def _track_watcher(self, watcher: Any) -> None:
        self._watchers.append(watcher)


def _error_cb(log: Any) -> Callable[[Exception], Awaitable[None]]:
    async def cb(exc: Exception) -> None:
        log.warning("nats_error", error=repr(exc))

    return cb


def _event_cb(log: Any, event: str) -> Callable[[], Awaitable[None]]:
    async def cb() -> None:
        log.info(event)

    return cb
