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
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from libs.bus.errors import BusUnavailable
from libs.bus.kv import TypedKV
from libs.bus.tracectx import extract_context, inject_headers
from libs.obs.health import Health
from libs.obs.logging import get_logger
from libs.obs.metrics import DEAD_LETTERS, HANDLER_ERRORS, HANDLER_SECONDS, MESSAGES
from proto import subjects
from proto.decisions import DeadLetter

T = TypeVar("T")
Handler = Callable[[T], Awaitable[None]]

MSG_ID_HEADER = "Nats-Msg-Id"
DUPLICATE_WINDOW_S = 600.0  # Nats-Msg-Id dedupe horizon: a retry within 10 min is dropped
# err_code of "stream name already in use with a different configuration"
_STREAM_NAME_IN_USE = 10058

_OK, _DEAD, _FAILED = "ok", "dead", "failed"

Decode = Callable[[str, bytes], Any]


def stream_replicas() -> int:
    """Replicas of every stream and bucket: ``MOSAIC_STREAM_REPLICAS`` (3 on a three-server
    JetStream cluster, so losing one server loses nothing), else 1. Every service must agree,
    or the second to start finds a config that differs."""
    raw = os.environ.get("MOSAIC_STREAM_REPLICAS", "") or "1"
    try:
        return max(1, int(raw))
    except ValueError:
        raise ValueError(f"MOSAIC_STREAM_REPLICAS must be an integer, got {raw!r}") from None


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match: ``*`` is one token, a final ``>`` is one or more tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


def make_decoder(type_: Any) -> Decode:
    """``type_`` is one type for every subject, or a mapping ``{subject pattern: type}`` for a
    subscription whose subjects carry different messages (``node.<n>.run`` vs ``.kill``): the
    first matching pattern decides. A subject no pattern matches is a decode error."""
    if isinstance(type_, Mapping):
        table = [(pat, msgspec.json.Decoder(t)) for pat, t in type_.items()]

        def by_subject(subject: str, data: bytes) -> Any:
            for pat, dec in table:
                if subject_matches(pat, subject):
                    return dec.decode(data)
            raise msgspec.DecodeError(f"no message type for subject {subject!r}")

        return by_subject
    decoder = msgspec.json.Decoder(type_)
    return lambda _subject, data: decoder.decode(data)


@dataclass
class Consumer:
    """A running JetStream consumer loop; ``stop()`` ends it (the durable state stays on the
    server, so a restarted service resumes where it left off)."""

    stream: str
    subject: str
    durable: str | None
    task: asyncio.Task[None]
    sub: Any = field(repr=False, default=None)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
        with contextlib.suppress(Exception):
            await self.sub.unsubscribe()


class Bus:
    """One service's connection: ``nc`` (core NATS), ``js`` (JetStream), typed helpers."""

    def __init__(self, nc: NatsClient, service: str, url: str = "") -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.service = service
        self.url = url
        self.log = get_logger(service=service, component="bus")
        self._tracer = trace.get_tracer("libs.bus")
        self._consumers: list[Consumer] = []
        self._subs: list[Subscription] = []
        self._watchers: list[Any] = []
        # the service's health checks (``libs.obs.health``); ``serve`` hands in the one that
        # ``/healthz`` reports, so a consumer loop or watcher can register its own check
        self.health = Health(service)
        self.health.register("nats", self._connection_problem)

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

        Once connected, nats-py reconnects on its own forever; a service only gives up at start.
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
                nc = await nats.connect(
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
        """Stop consumers and watchers, then drain: in-flight handlers finish, publishes flush."""
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

    async def ensure_topology(self) -> None:
        """Create every stream and KV bucket of ``proto.subjects`` if missing.

        Idempotent and safe when several services race: the server accepts a create with a
        config identical to the existing one. A stream created by an older version with a
        different config is updated in place (or kept, with a warning, if the change is not
        allowed); its messages are never deleted.
        """
        for name, subs in subjects.STREAMS.items():
            await self._ensure_stream(name, subs)
        for bucket in subjects.KV_BUCKETS:
            await self._ensure_bucket(bucket)

    async def _ensure_stream(self, name: str, subs: tuple[str, ...]) -> None:
        config = api.StreamConfig(
            name=name,
            subjects=list(subs),
            storage=api.StorageType.FILE,
            num_replicas=stream_replicas(),
            retention=api.RetentionPolicy.LIMITS,
            discard=api.DiscardPolicy.OLD,
            duplicate_window=DUPLICATE_WINDOW_S,
        )
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise
            try:
                await self.js.update_stream(config)
                self.log.info("stream_updated", stream=name)
            except nats.js.errors.APIError as upd:
                self.log.warning("stream_config_differs", stream=name, error=str(upd))

    async def _ensure_bucket(self, bucket: str) -> None:
        try:
            await self.js.create_key_value(
                bucket=bucket, history=1, storage=api.StorageType.FILE, replicas=stream_replicas()
            )
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise
            self.log.warning("bucket_config_differs", bucket=bucket, error=str(exc))

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
        headers = inject_headers()
        if durable:
            if msg_id:
                headers[MSG_ID_HEADER] = msg_id
            ack = await self.js.publish(subject, data, headers=headers)
            return not ack.duplicate
        if msg_id:
            headers[MSG_ID_HEADER] = msg_id
        await self.nc.publish(subject, data, headers=headers or None)
        return True

    async def dead_letter(
        self,
        subject: str,
        data: bytes,
        reason: str,
        *,
        pattern: str | None = None,
        msg_id: str | None = None,
    ) -> None:
        """Park ``data`` (received on ``subject``) on ``dlq.<service>`` with ``reason``; count it.

        Never raises: a dead letter that cannot be published is logged with its reason, because
        the caller is a handler loop that must keep running.
        """
        DEAD_LETTERS.labels(self.service, pattern or subject).inc()
        letter = DeadLetter(
            service=self.service, subject=subject, reason=reason, time=time.time(), data=data
        )
        self.log.warning("dead_letter", subject=subject, reason=reason, size=len(data))
        try:
            await self.publish(subjects.dlq(self.service), letter, msg_id=msg_id)
        except Exception as exc:
            self.log.error("dead_letter_lost", subject=subject, reason=reason, error=repr(exc))

    # --- receiving -----------------------------------------------------------------------------

    async def subscribe(
        self,
        subject: str,
        type_: Any,
        handler: Callable[[Any], Awaitable[None]],
        *,
        queue: str | None = None,
    ) -> Subscription:
        """Core NATS subscription (no redelivery: for telemetry and pokes). Handlers of one
        subscription run one at a time, in order. ``type_``: see ``make_decoder``."""
        decoder = make_decoder(type_)

        async def on_msg(msg: Msg) -> None:
            await self._dispatch(subject, decoder, handler, msg)

        sub = await self.nc.subscribe(subject, queue=queue or "", cb=on_msg)
        self._subs.append(sub)
        return sub

    async def consume(
        self,
        stream: str,
        subject: str,
        type_: Any,
        handler: Callable[[Any], Awaitable[None]],
        *,
        durable: str | None = None,
        deliver_all: bool = True,
        max_deliver: int = 5,
        retry_delay_s: float = 0.5,
        ack_wait_s: float = 30.0,
        batch: int = 32,
        opt_start_seq: int | None = None,
    ) -> Consumer:
        """A JetStream pull consumer on ``subject`` of ``stream``, handled in order by a task.

        The message is acked after ``handler`` returns. A handler exception is logged and the
        message nak'ed with a growing delay; after ``max_deliver`` failed attempts it is
        dead-lettered (so it is never lost and never loops forever). ``durable`` consumers keep
        their position on the server across restarts; ``deliver_all`` replays the stream from
        its start on first creation (else only new messages); ``opt_start_seq`` (>= 1) starts at
        that stream sequence instead (a read model resuming from a snapshot, ``libs.bus.snapshot``).
        ``type_``: see ``make_decoder``.
        """
        deliver = api.DeliverPolicy.ALL if deliver_all else api.DeliverPolicy.NEW
        if opt_start_seq is not None:
            deliver = api.DeliverPolicy.BY_START_SEQUENCE
        config = api.ConsumerConfig(
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=deliver,
            opt_start_seq=opt_start_seq,
            max_deliver=max_deliver,
            ack_wait=ack_wait_s,
            filter_subject=subject,
            inactive_threshold=None if durable else 300.0,
            # as many replicas as the stream: an ephemeral consumer is R1 otherwise, and dies
            # with its server in a cluster (the gateway's read model then stops for good)
            num_replicas=stream_replicas(),
        )
        psub = await self.js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
        decoder = make_decoder(type_)
        task = asyncio.create_task(
            self._pull_loop(psub, subject, decoder, handler, max_deliver, retry_delay_s, batch),
            name=f"consume:{stream}:{subject}",
        )
        consumer = Consumer(stream=stream, subject=subject, durable=durable, task=task, sub=psub)
        self._consumers.append(consumer)
        return consumer

    async def _pull_loop(
        self,
        psub: Any,
        pattern: str,
        decoder: Decode,
        handler: Callable[[Any], Awaitable[None]],
        max_deliver: int,
        retry_delay_s: float,
        batch: int,
    ) -> None:
        while True:
            try:
                msgs = await psub.fetch(batch, timeout=5.0)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.nc.is_closed:
                    return
                self.log.warning("fetch_failed", subject=pattern, error=repr(exc))
                await asyncio.sleep(1.0)
                continue
            for msg in msgs:
                await self._handle_durable(
                    msg, pattern, decoder, handler, max_deliver, retry_delay_s
                )

    async def _handle_durable(
        self,
        msg: Msg,
        pattern: str,
        decoder: Decode,
        handler: Callable[[Any], Awaitable[None]],
        max_deliver: int,
        retry_delay_s: float,
    ) -> None:
        outcome, error = await self._dispatch(pattern, decoder, handler, msg)
        try:
            if outcome == _FAILED:
                delivered = msg.metadata.num_delivered
                if delivered >= max_deliver:
                    await self.dead_letter(
                        msg.subject,
                        msg.data,
                        f"handler failed {delivered} times: {error}",
                        pattern=pattern,
                    )
                    await msg.term()
                else:
                    await msg.nak(delay=retry_delay_s * delivered)
            elif outcome == _DEAD:
                await msg.term()
            else:
                await msg.ack()
        except Exception as exc:  # the connection may be closing; the server redelivers
            self.log.warning("ack_failed", subject=msg.subject, error=repr(exc))

    async def _dispatch(
        self,
        pattern: str,
        decoder: Decode,
        handler: Callable[[Any], Awaitable[None]],
        msg: Msg,
    ) -> tuple[str, str]:
        """Decode, then run ``handler`` in a span parented by the message's trace context.
        Returns (outcome, error text); never raises (except cancellation)."""
        try:
            value = decoder(msg.subject, msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self.dead_letter(msg.subject, msg.data, f"decode: {exc}", pattern=pattern)
            return _DEAD, str(exc)
        parent = extract_context(msg.headers)
        with self._tracer.start_as_current_span(
            f"handle {pattern}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": msg.subject,
                "mosaic.service": self.service,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            t0 = time.perf_counter()
            try:
                await handler(value)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, repr(exc)))
                HANDLER_ERRORS.labels(self.service, pattern).inc()
                self.log.exception("handler_failed", subject=msg.subject, error=repr(exc))
                return _FAILED, repr(exc)
            finally:
                HANDLER_SECONDS.labels(self.service, pattern).observe(time.perf_counter() - t0)
        MESSAGES.labels(self.service, pattern).inc()
        return _OK, ""

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
