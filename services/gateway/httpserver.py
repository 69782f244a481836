"""How the gateway's HTTP server treats connections: slow clients are cut off, and what the HTTP
parser refuses (before any handler runs) is answered in JSON like everything else.

Slow clients: a deadline for each request's head and body, so stalled connections are closed.

Why our own: aiohttp has no header timeout. Its keep-alive timer is the nearest thing (since
3.10 or so it also starts when a connection opens), but its default is an hour and older
releases start it only after a first response, so 400 connections that send half a request
head and then nothing stay open. The guard works with aiohttp's public pieces only:

- ``track`` (the outermost middleware) marks a connection busy from the moment its request
  head has been parsed until the response is out, and notes when it became idle again;
- ``read_body`` reads the body before the handler, within ``body_timeout_s`` (the handler's own
  ``request.read()`` then returns the cached bytes); a stalled body is answered 408 and the
  connection closed;
- ``watch`` sweeps the server's connections every ``sweep_s``: one that is not busy and has been
  idle (open without a complete head, or since its last response) for ``header_timeout_s`` is
  closed. That is also the keep-alive timeout between requests: an idle client reconnects.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus

import aiohttp
import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from proto.views import ErrorResponse

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ErrorFactory = Callable[[int, str], web.Response]

HEADER_TIMEOUT_S = 10.0  # a request head (and the wait for the next one) at most this long
BODY_TIMEOUT_S = 30.0  # a request body (at most MAX_BODY_BYTES) at most this long


@dataclass(frozen=True)
class HttpTimeouts:
    header_s: float = HEADER_TIMEOUT_S
    body_s: float = BODY_TIMEOUT_S

    @property
    def sweep_s(self) -> float:
        """How often the watchdog looks: a stalled connection lives at most header_s + this."""
        return max(0.05, min(1.0, self.header_s / 4))


class ConnectionGuard:
    """Busy/idle bookkeeping per connection, the two middlewares and the watchdog task."""

    def __init__(self, timeouts: HttpTimeouts, error: ErrorFactory) -> None:
        self.timeouts = timeouts
        self._error = error
        self._busy: dict[RequestHandler, int] = {}  # connection -> requests in its handler
        self._idle_since: dict[RequestHandler, float] = {}
        self._task: asyncio.Task[None] | None = None
        self.closed = 0  # connections closed for being slow (tests and logs)

    @web.middleware
    async def track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = request.protocol
        self._busy[conn] = self._busy.get(conn, 0) + 1
        try:
            return await handler(request)
        finally:
            left = self._busy.get(conn, 1) - 1
            if left <= 0:
                self._busy.pop(conn, None)
                self._idle_since[conn] = asyncio.get_running_loop().time()
            else:
                self._busy[conn] = left

    @web.middleware
    async def read_body(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The whole body within ``body_s``; an over-long body raises aiohttp's 413 as usual."""
        if request.body_exists:
            try:
                await asyncio.wait_for(request.read(), self.timeouts.body_s)
            except TimeoutError:
                wait = self.timeouts.body_s
                resp = self._error(408, f"request body not received within {wait:g} s")
                resp.force_close()
                return resp
            except (HttpProcessingError, aiohttp.ClientError, ConnectionError) as exc:
                # a broken chunked or compressed body, or a client gone mid-body
                resp = self._error(400, f"malformed request body: {type(exc).__name__}")
                resp.force_close()
                return resp
        return await handler(request)

    def watch(self, server: web.Server) -> None:
        """Start sweeping ``server``'s connections (call after ``AppRunner.setup``)."""
        self._task = asyncio.create_task(self._sweep(server), name="gateway:slow-clients")

    async def close(self, _app: web.Application | None = None) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _sweep(self, server: web.Server) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.timeouts.sweep_s)
            now = loop.time()
            open_now = set(server.connections)
            for conn in list(self._idle_since):
                if conn not in open_now:
                    del self._idle_since[conn]
            for conn in open_now:
                if conn in self._busy:
                    continue
                since = self._idle_since.setdefault(conn, now)  # first seen: opened just now
                if now - since >= self.timeouts.header_s:
                    del self._idle_since[conn]
                    self.closed += 1
                    conn.force_close()


# --- the parser's refusals in JSON ------------------------------------------------------------


class GatewayRunner(web.AppRunner):
    """An ``AppRunner`` whose connections answer the HTTP parser's refusals (an unknown method,
    a header over 8 KB, a broken request line) with a JSON ``ErrorResponse``, as the app
    answers everything else; aiohttp's own answer there is plain text (or an HTML page)."""

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return _JsonErrorServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            **self._kwargs,
        )


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class _JsonErrorHandler(RequestHandler):
    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """Bad input (a 4xx) is logged at debug level, a failure (5xx) as an exception; the
        message of a 4xx says what the parser objected to, cut to 300 characters."""
        if status >= 500:
            self.log_exception("Error handling request", exc_info=exc)
        else:
            self.log_debug("Refused a malformed request: %s", message)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started, cannot send an error")
        try:
            text = f"{status} {HTTPStatus(status).phrase}"
        except ValueError:
            text = str(status)
        if message and status < 500:
            text += f": {message.strip()[:300]}"
        resp = web.Response(
            body=msgspec.json.encode(ErrorResponse(error=text)),
            status=status,
            content_type="application/json",
        )
        resp.force_close()
        return resp


DEFAULT_HTTP_PORT = 8080


def add_http_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--http-host``/``--http-port``, defaulting to MOSAIC_HTTP_HOST/MOSAIC_HTTP_PORT."""
    port_text = os.environ.get("MOSAIC_HTTP_PORT") or str(DEFAULT_HTTP_PORT)
    try:
        port = int(port_text)
    except ValueError:
        raise SystemExit(f"MOSAIC_HTTP_PORT must be a port number, got {port_text!r}") from None
    parser.add_argument(
        "--http-host",
        default=os.environ.get("MOSAIC_HTTP_HOST") or "127.0.0.1",
        help="address to listen on (env MOSAIC_HTTP_HOST)",
    )
    parser.add_argument(
        "--http-port", type=int, default=port, help="HTTP port (env MOSAIC_HTTP_PORT)"
    )
    parser.add_argument(
        "--admin-token-file",
        default=os.environ.get("MOSAIC_ADMIN_TOKEN_FILE") or None,
        help="file holding the admin bearer token (env MOSAIC_ADMIN_TOKEN_FILE)",
    )
    parser.add_argument(
        "--insecure-no-auth",
        action="store_true",
        default=os.environ.get("MOSAIC_INSECURE_NO_AUTH") == "1",
        help="no admin token: every caller is the admin (env MOSAIC_INSECURE_NO_AUTH=1)",
    )
    parser.add_argument(
        "--http-header-timeout-s",
        type=float,
        default=HEADER_TIMEOUT_S,
        help="close a connection without a full request head (or idle) this long",
    )
    parser.add_argument(
        "--http-body-timeout-s",
        type=float,
        default=BODY_TIMEOUT_S,
        help="answer 408 to a request whose body has not arrived within this",
    )
    return parser
