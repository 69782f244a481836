"""Tracing export over real OTLP/HTTP, metrics endpoint, log format selection."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from aiohttp import web

from libs.bus.server import free_port
from libs.obs.logging import log_format, setup_logging
from libs.obs.metrics import MESSAGES, start_metrics_server
from libs.obs.tracing import build_tracer_provider, span_trace_id


async def test_spans_are_exported_over_otlp_http() -> None:
    bodies: list[tuple[str, bytes]] = []

    async def traces(request: web.Request) -> web.Response:
        bodies.append((request.content_type, await request.read()))
        return web.Response(status=200, body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        provider = build_tracer_provider("obs-test", f"http://127.0.0.1:{port}")
        with provider.get_tracer("t").start_as_current_span("place-job-42") as span:
            trace_id = span_trace_id(span)
        # the exporter posts synchronously from a worker thread: keep the loop free meanwhile
        flushed = await asyncio.to_thread(provider.force_flush, 10_000)
        provider.shutdown()
        assert flushed
        assert len(bodies) >= 1
        content_type, body = bodies[0]
        assert content_type == "application/x-protobuf"
        assert b"place-job-42" in body
        assert b"obs-test" in body  # the service.name resource
        assert trace_id is not None and bytes.fromhex(trace_id) in body
    finally:
        await runner.cleanup()


def test_no_endpoint_means_no_exporter() -> None:
    provider = build_tracer_provider("obs-test", None)
    assert provider._active_span_processor._span_processors == ()
    provider.shutdown()


def test_metrics_server_serves_shared_counters() -> None:
    assert start_metrics_server(0) is None  # off
    port = free_port()
    assert start_metrics_server(port, host="127.0.0.1") == port
    MESSAGES.labels("obs-test", "lifecycle.>").inc()
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'mosaic_messages_total{service="obs-test",subject="lifecycle.>"} 1.0' in text
    assert "mosaic_handler_seconds" in text and "mosaic_dead_letters_total" in text


def test_metrics_port_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="metrics port"):
        start_metrics_server(-1)


def test_log_format_selection(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("MOSAIC_LOG_FORMAT", "json")
    assert log_format() == "json"
    assert log_format("console") == "console"
    monkeypatch.setenv("MOSAIC_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="json"):
        log_format()
    monkeypatch.delenv("MOSAIC_LOG_FORMAT")
    assert log_format() == "json"  # pytest captures stdout: not a terminal
    log = setup_logging("svc-x", "json")
    log.info("placed", job_id="j1")
    line = capsys.readouterr().out.strip().splitlines()[-1]
    record = json.loads(line)
    assert record["service"] == "svc-x" and record["event"] == "placed"
    assert record["job_id"] == "j1" and record["level"] == "info"


def test_healthz_reports_failing_checks_as_503() -> None:
    import json
    import urllib.error

    from libs.obs.health import Health, Heartbeat

    health = Health("obs-test")
    beat = Heartbeat("consumer lifecycle.>", max_age_s=60.0)
    health.register("consumer", beat.check)
    port = start_metrics_server(free_port(), health=health)
    url = f"http://127.0.0.1:{port}/healthz"
    body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert body["status"] == "ok" and body["checks"] == ["consumer"]
    beat.dead("RecursionError in decode")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url, timeout=5)
    assert err.value.code == 503
    body = json.loads(err.value.read())
    assert body["problems"] == {"consumer": "consumer lifecycle.> died: RecursionError in decode"}


def test_heartbeat_goes_stale_and_a_raising_check_is_a_problem() -> None:
    from libs.obs.health import Health, Heartbeat

    beat = Heartbeat("loop", max_age_s=0.0)
    assert beat.check() is not None and "wedged" in beat.check()
    health = Health("obs-test")

    def broken() -> str | None:
        raise RuntimeError("boom")

    health.register("broken", broken)
    assert health.problems() == {"broken": "check raised RuntimeError: boom"}
    health.unregister("broken")
    assert health.healthy()


def test_logging_follows_stdout_when_the_stream_it_started_with_is_gone(monkeypatch) -> None:
    import io

    from libs.obs.logging import get_logger, setup_logging

    first = io.StringIO()
    monkeypatch.setattr("sys.stdout", first)
    setup_logging("obs-test", "json", "info")
    get_logger().info("to_the_first")
    first.close()  # a test's capture ends; the services' loggers live on
    second = io.StringIO()
    monkeypatch.setattr("sys.stdout", second)
    get_logger().info("to_the_second")
    assert '"event": "to_the_second"' in second.getvalue()
