"""Hostile messages on ``jobs.submit`` (issue 13): the gateway's producer consumer is a trust
boundary (rule 6), so what arrives there is fuzzed with the service fuzzer's inputs.

Two levels: the decision itself (``parse_bus`` → ``admit`` → ``bus_rules``) on thousands of drawn
messages, which must never raise anything but ``JobRejected`` and must never accept a job the
services downstream would refuse; and the real gateway on a real nats-server fed a batch of the
worst of them, which must keep serving, raise in no handler, and account for every message as a
job (pending or refused) or a dead letter.
"""

from __future__ import annotations

import math

import msgspec
from hypothesis import given, settings
from prometheus_client import REGISTRY

from proto import subjects
from proto.nodes import NodeSpec
from proto.validation import FieldError, JobRejected, revalidate_spec
from services.gateway.admission import admit
from services.gateway.producers import REASON_MAX_CHARS, bus_rules, parse_bus, refusal_reason
from tests.fuzz import service_inputs as inp
from tests.services.test_gateway import get_job, until
from tests.services.test_gateway_producers import consumer_done, dead_letters, gateway
from tests.services.test_placer import small_cluster

NOW = 1.7e9
messages = inp.garbage | inp.job_specs(inp.SUBMIT_IDS).map(inp.encode)


@settings(max_examples=400, deadline=None, database=None)
@given(data=messages)
def test_the_decision_never_raises_and_never_accepts_what_services_would_refuse(
    data: bytes,
) -> None:
    try:
        spec = parse_bus(data, now=NOW)
    except JobRejected as exc:
        assert exc.errors and all(isinstance(e, FieldError) for e in exc.errors)
        return
    errors = admit(spec, now=NOW, nodes=small_cluster()) or bus_rules(spec, {})
    if errors:
        reason = refusal_reason(errors)
        assert reason.startswith("Refused: ") and len(reason) <= REASON_MAX_CHARS
        assert all(e.field and e.field in reason for e in errors[:1])
    else:
        assert spec.submit_time == NOW  # the gateway's time, never the producer's
        assert revalidate_spec(spec) == []  # the scorer and placer take it as it is
        assert spec.command is None  # no tenant may run commands here


def _handler_errors() -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        for s in metric.samples:
            if s.name == "mosaic_handler_errors_total" and s.labels.get("service") == "gateway":
                total += s.value
    return total


HOSTILE = [
    b'{"id": "h-nan", "gpus": NaN}',
    b'{"id": "h-inf", "gpus": 1e999}',
    b'{"id": "h-neg0", "gpus": -0.0}',
    b'{"id": "h-tiny", "gpus": 1e-320}',
    b'{"id": "h-prio", "priority": 18446744073709551615}',
    b'{"id": "h-bool", "priority": true}',
    b'{"id": "h-null", "tenant": null}',
    b'{"id": "h-deep", "elastic": ' + b'{"a":' * 300 + b"1" + b"}" * 300 + b"}",
    b'{"id": "h-cons", "constraints": ["' + b"x" * 5000 + b'"]}',
    b'{"id": "h-nul", "command": "a\\u0000b"}',
    b'{"id": "h-ten", "tenant": "a.b"}',
    b'{"id": "h-dead", "deadline": -1}',
    b'{"id": "h-long", "est_runtime_s": 1e308}',
    b'{"id": "h-elastic", "gpus": 2, "elastic": {"min_gpus": 3, "max_gpus": 1}}',
    b'{"id": "h-fine", "gpus": 1, "est_runtime_s": 60}',
    b'{"id": "lifecycle.>"}',
    b'{"id": "' + b"x" * 300 + b'"}',
    b"\xff\xfe\xfd",
    b"[" * 5000,
    b"null",
    b"",
]


async def test_the_gateway_takes_hostile_messages_and_accounts_for_each(nats_url, bus, http):
    nodes_kv = await bus.kv(subjects.KV_NODES, NodeSpec)
    for node in small_cluster():
        await nodes_kv.put(node.id, node)
    errors_before = _handler_errors()
    async with gateway(nats_url) as base:
        for i, data in enumerate(HOSTILE):
            await bus.publish_bytes(subjects.SUBJECT_SUBMIT, data, msg_id=f"hostile-{i}")
        await until(lambda: consumer_done(bus), "every hostile message handled")
        jobs = {}
        for data in HOSTILE:
            try:
                job_id = msgspec.json.decode(data, type=dict)["id"]
            except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError):
                continue
            if isinstance(job_id, str) and (view := await get_job(http, base, job_id)):
                jobs[job_id] = view
        letters = await dead_letters(bus)
        assert len(jobs) + len(letters) == len(HOSTILE), (sorted(jobs), len(letters))
        assert jobs["h-fine"].state == "pending"
        for job_id, view in jobs.items():
            if job_id != "h-fine":
                assert view.state == "failed" and view.reason.startswith("Refused: "), view
                assert all(math.isfinite(x) for x in (view.gpus, view.spec.gpu_mem_gb))
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200
        async with http.get(f"{base}/v1/jobs") as r:
            assert r.status == 200
    assert _handler_errors() == errors_before


def test_the_hostile_batch_covers_every_outcome() -> None:
    """A batch that only dead-letters (or only refuses) would prove little."""
    outcomes = set()
    for data in HOSTILE:
        try:
            spec = parse_bus(data, now=NOW)
        except JobRejected:
            outcomes.add("dead")
            continue
        outcomes.add("refused" if admit(spec, now=NOW, nodes=small_cluster()) else "accepted")
    assert outcomes == {"dead", "refused", "accepted"}
