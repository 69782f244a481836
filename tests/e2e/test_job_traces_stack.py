"""A job's one trace across real processes (issue 13): the stack as ``mosaic up`` starts it
(NATS with a user per service, every service a child process), each exporting its spans over
OTLP/HTTP (``OTEL_EXPORTER_OTLP_ENDPOINT``) to a receiver in this test. The trace context
crosses process boundaries only through NATS headers and the stored ``Submitted.trace`` /
``RunCommand.trace``, so this is what Jaeger would show."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from libs.client.supervisor import Stack, start_stack
from libs.policy.inventory import demo_cluster
from proto.jobs import JobSpec
from tests.e2e.conftest import E2E_CLOCK_FACTOR, all_terminal, require_services, wait_for
from tests.obs._spans import CHAIN, OtlpReceiver, job_chain


@pytest.fixture
def traced_stack(tmp_path: Path) -> Iterator[tuple[Stack, OtlpReceiver]]:
    require_services()
    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        stack = start_stack(
            demo_cluster(), clock_factor=E2E_CLOCK_FACTOR, data_dir=tmp_path, extra_env=env
        )
        try:
            yield stack, receiver
        finally:
            forced = stack.stop()  # every service flushes its spans on a clean stop
            assert not forced, f"services needed SIGKILL: {forced} (logs in {stack.logs_dir})"


def test_a_jobs_spans_from_every_process_share_one_trace(traced_stack) -> None:
    stack, receiver = traced_stack
    client = stack.client()
    spec = JobSpec(id="traced-e2e", gpus=1, est_runtime_s=120.0)  # 0.2 s at 600x
    assert not client.submit(spec).duplicate
    wait_for(all_terminal(client, {spec.id}), timeout_s=60, what="the job to end", stack=stack)
    assert client.job(spec.id).state == "completed"
    stack.stop()
    got = job_chain(list(receiver.spans), spec.id)
    assert {name: s.service for name, s in got.items()} == CHAIN  # exported by each process
