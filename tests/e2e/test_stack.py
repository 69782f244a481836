"""The walking skeleton end to end: real nats-server, every service a real process.

One stack serves the whole module (tests run in file order; the placer-kill test is last
because it disturbs the stack). Jobs are short at a 600x clock, so the module takes well under
two minutes on a 2-core machine.
"""

from __future__ import annotations

import json
import random
import urllib.request

import msgspec
import nats
import pytest

from libs.client.api import ClientError, MosaicClient
from libs.client.cli import main
from libs.client.demo import make_job
from libs.client.supervisor import Stack
from proto import subjects
from proto.decisions import DeadLetter
from proto.jobs import JobSpec
from tests.e2e.checker import Report, check, read_stream
from tests.e2e.conftest import all_terminal, wait_for


async def _check_lifecycle(stack: Stack) -> Report:
    report = check(await read_stream(stack.nats_url), stack.nodes)
    assert report.violations == [], "\n".join(report.violations[:20])
    bad = [s for s in report.undecodable if not s.startswith("lifecycle.garbage")]
    assert bad == [], f"undecodable lifecycle events on {bad}"
    return report


def _short(spec: JobSpec, rng: random.Random) -> JobSpec:
    """Demo jobs with 2-10 minute runtimes: at 600x they last 0.2-1 s of wall time."""
    return msgspec.structs.replace(spec, est_runtime_s=rng.uniform(120, 600))


async def test_200_jobs_end_once_and_no_node_is_ever_overbooked(
    stack: Stack, client: MosaicClient
) -> None:
    rng = random.Random(7)
    ids = set()
    for i in range(200):
        spec = _short(make_job(rng, f"load-{i:03d}", stack.clock.now()), rng)
        resp = client.submit(spec)
        assert resp.job.id == spec.id and not resp.duplicate
        ids.add(spec.id)
    wait_for(all_terminal(client, ids), timeout_s=150, what="200 jobs to finish", stack=stack)

    report = await _check_lifecycle(stack)
    for jid in ids:
        assert report.submitted[jid] == 1, jid
        assert len(report.terminal[jid]) == 1, (jid, report.terminal[jid])
        assert report.placed[jid], f"{jid} ended without being placed"
    states = {j.id: j for j in client.jobs() if j.id in ids}
    failed = {j.id: j.reason for j in states.values() if j.state != "completed"}
    assert not failed, f"jobs that did not complete: {failed}"
    # the checker saw real sharing: some node held several jobs at once
    assert max(report.peak_gpus.values()) > 1


async def test_same_id_twice_is_one_job(stack: Stack, client: MosaicClient) -> None:
    spec = JobSpec(id="twice-1", gpus=1, gpu_mem_gb=8, est_runtime_s=120)
    first = client.submit(spec)
    second = client.submit(spec)
    assert not first.duplicate and second.duplicate
    wait_for(all_terminal(client, {"twice-1"}), timeout_s=60, what="twice-1", stack=stack)
    report = await _check_lifecycle(stack)
    assert report.submitted["twice-1"] == 1
    assert report.terminal["twice-1"] == ["completed"]
    assert len(report.placed["twice-1"]) == 1


async def test_big_memory_job_never_on_t4_and_impossible_job_refused(
    stack: Stack, client: MosaicClient
) -> None:
    ids = {f"big-{i}" for i in range(6)}
    for jid in ids:
        client.submit(JobSpec(id=jid, gpus=1, gpu_mem_gb=40, host_mem_gb=16, est_runtime_s=300))
    wait_for(all_terminal(client, ids), timeout_s=60, what="40 GB jobs", stack=stack)
    report = await _check_lifecycle(stack)
    models = {n.id: n.gpu_model for n in stack.nodes}
    for jid in ids:
        assert report.terminal[jid] == ["completed"]
        assert all(models[node] == "a100-80gb" for node, _ in report.placed[jid])

    for impossible, field in (
        (JobSpec(id="never-gpus", gpus=48, gpu_mem_gb=8), "gpus"),  # 32 A100s at most here
        (JobSpec(id="never-mem", gpus=1, gpu_mem_gb=100), "gpu_mem_gb"),  # 80 GB at most here
    ):
        with pytest.raises(ClientError) as info:
            client.submit(impossible)
        assert info.value.status == 400
        assert info.value.errors, "a refusal names its reason"
        assert any(e.field == field or field in e.reason for e in info.value.errors), (
            info.value.errors
        )
        with pytest.raises(ClientError) as info404:
            client.job(impossible.id)
        assert info404.value.status == 404  # refused means never published


def test_malformed_and_invalid_input_is_400_with_reasons(
    stack: Stack, client: MosaicClient
) -> None:
    with pytest.raises(ClientError) as bad_json:
        client.submit_raw(b'{"id": "broken", "gpus": ')
    assert bad_json.value.status == 400 and bad_json.value.errors

    body = json.dumps({"id": "invalid-1", "priority": 12, "energy_sensitivity": 2, "gpus": -1})
    with pytest.raises(ClientError) as invalid:
        client.submit_raw(body.encode())
    assert invalid.value.status == 400
    fields = {e.field for e in invalid.value.errors}
    assert {"priority", "energy_sensitivity", "gpus"} <= fields, invalid.value.errors

    with pytest.raises(ClientError) as wrong_type:
        client.submit_raw(b'{"id": "typed", "gpus": "four"}')
    assert wrong_type.value.status == 400
    assert any(e.field == "gpus" for e in wrong_type.value.errors)
    for jid in ("broken", "invalid-1", "typed"):
        with pytest.raises(ClientError) as info:
            client.job(jid)
        assert info.value.status == 404

    # the raw HTTP answer is JSON with the reasons (not only what our client makes of it)
    req = urllib.request.Request(
        stack.gateway_url + "/v1/jobs", data=b"not json", method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {client.token}"},
    )  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(req, timeout=10)
    assert raw.value.code == 400
    assert json.loads(raw.value.read())["errors"]


async def test_garbage_goes_to_the_dlq_and_services_go_on(
    stack: Stack, client: MosaicClient
) -> None:
    node = next(n.id for n in stack.nodes if n.gpu_model == "a100-80gb")
    garbage = {
        "lifecycle.garbage-1": b"\x00\xffnot an event{",
        subjects.node_command(node, "run"): b'{"allocation": 42}',
    }
    nc = await nats.connect(stack.nats_url)
    try:
        js = nc.jetstream()
        for subject, data in garbage.items():
            await js.publish(subject, data)
    finally:
        await nc.close()

    async def dead_letters() -> dict[str, set[str]]:
        seen: dict[str, set[str]] = {}
        for dlq_subject, data in await read_stream(stack.nats_url, subjects.STREAM_DLQ):
            letter = msgspec.json.decode(data, type=DeadLetter)
            assert dlq_subject == subjects.dlq(letter.service) and letter.reason
            seen.setdefault(letter.subject, set()).add(letter.service)
        return seen

    seen: dict[str, set[str]] = {}

    async def both_seen() -> bool:
        nonlocal seen
        seen = await dead_letters()
        return all(s in seen for s in garbage)

    await _poll_async(both_seen, timeout_s=30, what=f"dead letters for {list(garbage)}")
    assert "executor" in seen[subjects.node_command(node, "run")]
    assert seen["lifecycle.garbage-1"], "some lifecycle consumer dead-lettered the garbage"

    # every service still handles the next good job, including one that needs that node model
    good = JobSpec(id="after-garbage", gpus=4, gpu_mem_gb=60, est_runtime_s=120)
    client.submit(good)
    wait_for(all_terminal(client, {good.id}), timeout_s=60, what="the job after garbage")
    assert client.job(good.id).state == "completed"
    assert all(stack.alive().values()), stack.alive()


def test_cli_against_the_real_stack(
    stack: Stack, client: MosaicClient, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """submit (deadline on the stack's clock), queue, nodes, show, cancel, through `main`."""
    monkeypatch.setenv("MOSAIC_GATEWAY", stack.gateway_url)
    monkeypatch.setenv("MOSAIC_DATA_DIR", str(stack.data_dir))  # the CLI finds the admin token
    monkeypatch.delenv("MOSAIC_TOKEN", raising=False)
    for key, value in stack.clock.env().items():
        monkeypatch.setenv(key, value)
    args = ["submit", "--id", "cli-1", "--gpus", "2", "--gpu-mem", "40", "--mem", "64G",
            "-C", "a100", "--deadline", "2h", "--runtime", "2h", "--priority", "8"]  # fmt: skip
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == "cli-1"
    job = client.job("cli-1")
    assert job.spec.host_mem_gb == 64 and job.spec.constraints == ("a100",)
    assert job.spec.deadline == pytest.approx(stack.clock.now() + 7200, abs=600)

    assert main(["queue", "--all"]) == 0
    assert "cli-1" in capsys.readouterr().out
    assert main(["nodes"]) == 0
    table = capsys.readouterr().out
    assert all(n.id in table for n in stack.nodes) and "a100-80gb" in table
    assert main(["show", "cli-1"]) == 0
    assert "submitted" in capsys.readouterr().out
    assert main(["cancel", "cli-1"]) == 0
    assert "cancelling" in capsys.readouterr().out
    wait_for(all_terminal(client, {"cli-1"}), timeout_s=30, what="cli-1 cancelled", stack=stack)
    assert client.job("cli-1").state == "cancelled"
    assert main(["cancel", "cli-1"]) == 1  # already terminal: the gateway's 409, one line
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main(["submit", "--gpus", "16"]) == 2  # no node has 16 GPUs: refused
    assert "gpus" in capsys.readouterr().err


def test_explain_says_where_and_why(
    stack: Stack, client: MosaicClient, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """Rule 5: the placement decision, with the candidates and their score terms, is readable."""
    monkeypatch.setenv("MOSAIC_GATEWAY", stack.gateway_url)
    monkeypatch.setenv("MOSAIC_TOKEN", client.token or "")
    client.submit(JobSpec(id="why-1", gpus=1, gpu_mem_gb=8, constraints=("t4",), est_runtime_s=120))
    wait_for(all_terminal(client, {"why-1"}), timeout_s=60, what="why-1", stack=stack)
    node = client.job("why-1").node
    assert node and node.startswith("t4-")
    wait_for(
        lambda: client.get_json("/v1/jobs/why-1/decisions")["decisions"],
        timeout_s=10, what="why-1's decision", stack=stack,
    )  # fmt: skip
    assert main(["explain", "why-1"]) == 0
    text = capsys.readouterr().out
    assert f"place on {node}" in text
    assert "candidates weighed" in text and node in text.split("candidates weighed", 1)[1]
    assert main(["explain", "no-such-job"]) == 1
    assert "unknown job" in capsys.readouterr().err


async def test_placer_killed_and_restarted_loses_nothing(
    stack: Stack, client: MosaicClient
) -> None:
    rng = random.Random(11)
    before = [_short(make_job(rng, f"kill-a-{i:02d}", stack.clock.now()), rng) for i in range(40)]
    for spec in before:
        client.submit(spec)
    wait_for(
        lambda: any(j.state in ("placed", "running", "completed") for j in client.jobs("running")
                    + client.jobs("completed") if j.id.startswith("kill-a-")),
        timeout_s=30, what="the first placements", stack=stack,
    )  # fmt: skip
    stack.kill("placer")
    assert not stack.services["placer"].alive()
    during = [_short(make_job(rng, f"kill-b-{i:02d}", stack.clock.now()), rng) for i in range(20)]
    for spec in during:
        client.submit(spec)  # accepted while no placer runs: they wait, they are not lost
    stack.restart("placer")

    ids = {s.id for s in before + during}
    wait_for(
        all_terminal(client, ids), timeout_s=120, what="jobs across a placer crash", stack=stack
    )
    report = await _check_lifecycle(stack)
    for jid in ids:
        assert report.submitted[jid] == 1
        assert len(report.terminal[jid]) == 1, (jid, report.terminal[jid])
        attempts = [a for _, a in report.placed[jid]]
        assert len(attempts) == len(set(attempts)), f"{jid} placed twice: {report.placed[jid]}"
        assert len(attempts) == 1 + report.preempted[jid], (jid, report.placed[jid])
    assert {j.state for j in client.jobs() if j.id in ids} == {"completed"}


async def _poll_async(predicate, *, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    import asyncio
    import time

    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.5)
