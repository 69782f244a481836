"""``report_load``: what an inference service (or its sidecar) tells Mosaic about its load.

Why core NATS and not the HTTP API: a service reports every few seconds and only the newest
report matters (as telemetry); a lost one is replaced by the next, so it is not worth a stream.
The subject is ``load.<service>`` and the body a ``proto.inference.LoadReport`` in JSON
(docs/runtime-contract.md, "Inference services"); the NATS user ``producer`` may publish it.

    nc = await nats.connect(**load_connect_options(".mosaic/credentials/producer.json"))
    await report_load(nc, "chat", rps=412.0, p99_ms=83.0)

A report the placer cannot use (a negative rate, a service id that is no id) is refused here,
naming the field, before it is sent; one sent anyway goes to ``dlq.placer``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from libs.clock import Clock
from proto import subjects
from proto.inference import LoadReport, validate_report
from proto.validation import describe


async def report_load(
    nc: Any,
    service: str,
    *,
    rps: float,
    p99_ms: float | None = None,
    time_s: float | None = None,
    clock: Clock | None = None,
) -> LoadReport:
    """Publish one load report and return it. ``nc``: a connected ``nats`` client or a
    ``libs.bus.Bus``. ``time_s``: the Mosaic clock at the end of the measured window (default
    now, on ``clock`` or the deployment's ``MOSAIC_CLOCK_*``). Raises ``ValueError`` naming each
    unsound field."""
    if time_s is None:
        time_s = (clock or Clock.from_env()).now()
    report = LoadReport(service=service, time=time_s, rps=rps, p99_ms=p99_ms)
    errors = validate_report(report)
    if errors:
        raise ValueError(f"load report refused: {describe(errors)}")
    client = getattr(nc, "nc", nc)  # a Bus holds its connection as ``nc``
    await client.publish(subjects.load(service), msgspec.json.encode(report))
    return report
