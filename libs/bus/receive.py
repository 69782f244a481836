"""The receive side of the bus: typed subscriptions and consumer loops that never die.

Why so defensive: one message once ended six consumer loops of a service for good (a deeply
nested JSON object made the decoder raise ``RecursionError``, which nothing caught; the task ended
silently, ``/healthz`` stayed 200, and every restart died on the same message). So here:

- every message passes the ``DecodeLimits`` (size, nesting depth) before msgspec sees it;
- any exception in decode or handler (cancellation aside) sends the message to ``dlq.<service>``
  with the reason and counts it; a JetStream message whose handler keeps failing is retried
  with a growing delay and terminated after ``max_deliver`` deliveries, so it cannot wedge its
  stream;
- a try/except around each message's whole handling keeps even a bug in this module from
  ending the loop;
- each loop is registered with the service health (``LoopMonitor``): a loop that ended for any
  reason but ``stop()``/``Bus.close()``, or is stuck, makes ``/healthz`` 503 and logs why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api
from opentelemetry.trace import SpanKind, Status, StatusCode

from libs.bus.limits import DecodeLimits
from libs.bus.monitor import LoopMonitor
from libs.bus.tasks import cancel_and_wait
from libs.bus.topology import stream_replicas
from libs.bus.tracectx import extract_context
from libs.obs.metrics import HANDLER_ERRORS, HANDLER_SECONDS, MESSAGES

Decode = Callable[[str, bytes], Any]
Handler = Callable[[Any], Awaitable[None]]

_OK, _DEAD, _FAILED = "ok", "dead", "failed"
FETCH_TIMEOUT_S = 5.0  # a pull loop wakes (and beats) at least this often
WEDGED_AFTER_S = 60.0  # one message in its handler longer than this: the loop is wedged


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


def guarded_decode(
    limits: DecodeLimits, decode: Callable[[bytes], Any], data: bytes
) -> tuple[Any, tuple[str, str] | None]:
    """(value, None), or (None, (kind, reason)) when ``data`` is over a limit or does not
    decode — whatever the decoder raised (``RecursionError`` included)."""
    problem = limits.problem(data)
    if problem is not None:
        return None, problem
    try:
        return decode(data), None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return None, ("decode", f"decode: {exc}")
    except Exception as exc:
        return None, ("decode", f"decode raised {type(exc).__name__}: {exc}")


@dataclass
class Consumer:
    """A running JetStream consumer loop; ``stop()`` ends it (the durable state stays on the
    server, so a restarted service resumes where it left off)."""

    stream: str
    subject: str
    durable: str | None
    task: asyncio.Task[None]
    sub: Any = field(repr=False, default=None)
    monitor: LoopMonitor | None = field(repr=False, default=None)

    async def stop(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        await cancel_and_wait(self.task)
        with contextlib.suppress(Exception):
            await self.sub.unsubscribe()


class Receiver:
    """Mixin of ``Bus``: subscribe, consume, and the per-message handling they share."""

    # provided by Bus
    nc: Any
    js: Any
    service: str
    log: Any
    limits: DecodeLimits
    _tracer: Any
    _consumers: list[Consumer]
    _subs: list[Subscription]

    # a loop's health monitor, registered with the service's health
    _monitor: Callable[..., LoopMonitor]
    # park an undeliverable message on dlq.<service> (Bus.dead_letter)
    dead_letter: Callable[..., Awaitable[None]]

    async def subscribe(
        self,
        subject: str,
        type_: Any,
        handler: Handler,
        *,
        queue: str | None = None,
        wedged_after_s: float = WEDGED_AFTER_S,
        with_subject: bool = False,
    ) -> Subscription:
        """Core NATS subscription (no redelivery: for telemetry and pokes). Handlers of one
        subscription run one at a time, in order, in a task of the bus's own. A message that
        does not decode, or whose handler raises, is dead-lettered at once (there is no second
        delivery). ``type_``: see ``make_decoder``. ``with_subject``: the handler gets
        ``(subject, value)``, for a wildcard whose subject says something the body must agree
        with (``load.<service>``). ``unsubscribe()`` ends it quietly."""
        decoder = make_decoder(type_)
        if with_subject:
            plain = decoder
            decoder = lambda subject, data: (subject, plain(subject, data))  # noqa: E731
        sub = await self.nc.subscribe(subject, queue=queue or "")
        self._subs.append(sub)
        name = f"subscribe:{subject}"
        monitor = self._monitor(name, wedged_after_s=wedged_after_s, idle_ok=True)
        monitor.attach(
            asyncio.create_task(self._sub_loop(sub, subject, decoder, handler, monitor), name=name)
        )
        return sub

    async def _sub_loop(
        self,
        sub: Subscription,
        pattern: str,
        decoder: Decode,
        handler: Handler,
        monitor: LoopMonitor,
    ) -> None:
        async for msg in sub.messages:
            monitor.begin()
            try:
                outcome, error = await self._dispatch(pattern, decoder, handler, msg)
                if outcome == _FAILED:
                    await self.dead_letter(
                        msg.subject,
                        msg.data,
                        f"handler failed: {error}",
                        pattern=pattern,
                        kind="handler",
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug here must not end the subscription
                self.log.exception("message_handling_failed", subject=msg.subject, error=repr(exc))
            finally:
                monitor.end()
        # the iterator ends on unsubscribe/drain (the owner's choice) or a closed connection
        if self.nc.is_closed:
            monitor.ended("NATS connection closed")
        else:
            monitor.stop()

    async def consume(
        self,
        stream: str,
        subject: str,
        type_: Any,
        handler: Handler,
        *,
        durable: str | None = None,
        deliver_all: bool = True,
        max_deliver: int = 5,
        retry_delay_s: float = 0.5,
        ack_wait_s: float = 30.0,
        batch: int = 32,
        opt_start_seq: int | None = None,
        wedged_after_s: float | None = None,
    ) -> Consumer:
        """A JetStream pull consumer on ``subject`` of ``stream``, handled in order by a task.

        The message is acked after ``handler`` returns. A handler exception is logged and the
        message nak'ed with a growing delay; after ``max_deliver`` failed attempts it is
        dead-lettered and terminated (so it is never lost and never loops forever). A message
        over the decode limits or that does not decode is dead-lettered and terminated at once.
        ``durable`` consumers keep their position on the server across restarts; ``deliver_all``
        replays the stream from its start on first creation (else only new messages);
        ``opt_start_seq`` (>= 1) starts at that stream sequence instead (a read model resuming
        from a snapshot, ``libs.bus.snapshot``). ``wedged_after_s`` (default: the larger of 60 s
        and twice ``ack_wait_s``): a loop with no progress for that long reports unhealthy.
        ``type_``: see ``make_decoder``.
        """
        if max_deliver < 1:
            raise ValueError(f"max_deliver must be >= 1, got {max_deliver}")
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
            # as many replicas as the stream: an ephemeral consumer on one server of three would
            # die with it, and a read model fed by it would stop for good
            num_replicas=stream_replicas(),
        )
        psub = await self.js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
        decoder = make_decoder(type_)
        name = f"consume:{stream}:{subject}" + (f":{durable}" if durable else "")
        wedged = wedged_after_s or max(WEDGED_AFTER_S, 2 * ack_wait_s)
        monitor = self._monitor(name, wedged_after_s=wedged, idle_ok=False)
        loop = self._pull_loop(
            psub, subject, decoder, handler, max_deliver, retry_delay_s, batch, monitor
        )
        task = monitor.attach(asyncio.create_task(loop, name=name))
        consumer = Consumer(stream, subject, durable, task, sub=psub, monitor=monitor)
        self._consumers.append(consumer)
        return consumer

    async def _pull_loop(
        self,
        psub: Any,
        pattern: str,
        decoder: Decode,
        handler: Handler,
        max_deliver: int,
        retry_delay_s: float,
        batch: int,
        monitor: LoopMonitor,
    ) -> None:
        while True:
            try:
                msgs = await psub.fetch(batch, timeout=FETCH_TIMEOUT_S)
            except (TimeoutError, nats.errors.TimeoutError):
                monitor.beat()  # a quiet stream (or an outage): no fault of this loop
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # reconnecting, consumer gone, ...: wait and go on
                if self.nc.is_closed:
                    monitor.ended("NATS connection closed")
                    return
                self.log.warning("fetch_failed", subject=pattern, error=repr(exc))
                if not self.nc.is_connected:
                    # an outage is not this loop's fault: restarting the service would not
                    # help; connected yet failing (its consumer deleted, ...) it wedges
                    monitor.beat()
                await asyncio.sleep(1.0)
                continue
            monitor.beat()
            for msg in msgs:
                monitor.beat()
                try:
                    await self._handle_durable(
                        msg, pattern, decoder, handler, max_deliver, retry_delay_s
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a bug here must not end the loop
                    self.log.exception(
                        "message_handling_failed", subject=msg.subject, error=repr(exc)
                    )
                    with contextlib.suppress(Exception):
                        await msg.term()

    async def _handle_durable(
        self,
        msg: Msg,
        pattern: str,
        decoder: Decode,
        handler: Handler,
        max_deliver: int,
        retry_delay_s: float,
    ) -> None:
        outcome, error = await self._dispatch(pattern, decoder, handler, msg)
        delivered = msg.metadata.num_delivered if outcome == _FAILED else 0
        if outcome == _FAILED and delivered >= max_deliver:
            # the last delivery the server would make: park it and end it, or it wedges
            await self.dead_letter(
                msg.subject,
                msg.data,
                f"handler failed {delivered} times: {error}",
                pattern=pattern,
                kind="handler",
            )
            outcome = _DEAD
        try:
            if outcome == _FAILED:
                await msg.nak(delay=retry_delay_s * delivered)
            elif outcome == _OK:
                await msg.ack()
            else:
                await msg.term()
        except Exception as exc:  # the connection may be closing; the server redelivers
            self.log.warning("ack_failed", subject=msg.subject, error=repr(exc))

    async def _dispatch(self, pattern: str, decoder: Decode, handler: Handler, msg: Msg) -> Any:
        """Decode within the limits, then run ``handler`` in a span parented by the message's
        trace context. Returns (outcome, error text); never raises (except cancellation)."""
        value, rejected = guarded_decode(
            self.limits, lambda data: decoder(msg.subject, data), msg.data
        )
        if rejected is not None:
            kind, reason = rejected
            await self.dead_letter(msg.subject, msg.data, reason, pattern=pattern, kind=kind)
            return _DEAD, reason
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
