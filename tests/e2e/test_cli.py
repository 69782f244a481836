"""The command line on its own: flag parsing, and how answers and refusals are printed.

The HTTP peer here is a tiny aiohttp stub (we test the CLI's parsing and printing, not the
gateway); the real stack is exercised by the other files of this folder.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from aiohttp import web

from libs.bus.server import free_port
from libs.client import parse
from libs.client.cli import main
from libs.client.specs import build_spec, server_now
from proto.jobs import JobSpec
from proto.validation import FieldError
from proto.views import ErrorResponse, JobView, SubmitResponse

ROOT = Path(__file__).resolve().parents[2]


# --- parsers ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "gb"),
    [("128G", 128.0), ("512M", 0.5), ("1T", 1024.0), ("64", 64.0), ("2.5g", 2.5), ("16GB", 16.0)],
)
def test_mem_sizes_become_gb(text: str, gb: float) -> None:
    assert parse.parse_mem_gb(text) == pytest.approx(gb)


@pytest.mark.parametrize("bad", ["", "G", "12X", "-5G", "1.2.3G"])
def test_bad_mem_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="memory"):
        parse.parse_mem_gb(bad)


@pytest.mark.parametrize(
    ("text", "seconds"), [("30m", 1800), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("90", 90)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse.parse_duration_s(text) == seconds


@pytest.mark.parametrize("bad", ["", "2x", "h", "0m", "2h foo"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse.parse_duration_s(bad)


def test_deadline_relative_or_absolute() -> None:
    now = 1_800_000_000.0
    assert parse.parse_deadline("2h", now) == now + 7200
    assert parse.parse_deadline("1900000000", now) == 1_900_000_000.0
    assert parse.parse_deadline("600", now) == now + 600  # small numbers are seconds from now


def test_elastic_and_lists() -> None:
    assert parse.parse_elastic("2:8") == (2, 8)
    for bad in ("8:2", "0:4", "two:8", "3"):
        with pytest.raises(ValueError, match="elastic"):
            parse.parse_elastic(bad)
    assert parse.parse_list(["a100", "v100,t4", "a100"]) == ("a100", "v100", "t4")
    assert parse.parse_list(None) == ()


def _flags(**over: object) -> dict[str, object]:
    base: dict[str, object] = dict(
        gpus=4.0,
        gpu_mem=40.0,
        mem="128G",
        cpus=8.0,
        constraint=["a100,h100"],
        priority=7,
        deadline="2h",
        workload_class="cnn",
        elastic="2:8",
        checkpointable=True,
        energy_sensitivity=0.8,
        runtime="30m",
        tenant="vision",
        job_id="j-1",
        kind="training",
        command=None,
    )
    base.update(over)
    return base


def test_build_spec_from_slurm_like_flags() -> None:
    spec = build_spec(now=lambda: 1000.0, **_flags())
    assert spec.host_mem_gb == 128.0
    assert spec.constraints == ("a100", "h100")
    assert spec.deadline == 1000.0 + 7200
    assert spec.elastic is not None and (spec.elastic.min_gpus, spec.elastic.max_gpus) == (2, 8)
    assert spec.est_runtime_s == 1800 and spec.checkpointable and spec.priority == 7


def test_server_now_reads_the_stack_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOSAIC_CLOCK_EPOCH", raising=False)
    monkeypatch.setenv("MOSAIC_DATA_DIR", str(tmp_path))
    epoch = time.time() - 100
    (tmp_path / "stack.json").write_text(
        json.dumps({"gateway_url": "http://127.0.0.1:9", "clock_epoch": epoch, "clock_factor": 60})
    )
    # 100 wall seconds at 60x: about 6000 Mosaic seconds after the epoch
    assert server_now("http://127.0.0.1:9") == pytest.approx(epoch + 6000, abs=120)
    assert server_now("http://127.0.0.1:10") == pytest.approx(time.time(), abs=5)


# --- against a stub gateway ------------------------------------------------------------------
STUB_NOW = 2_000_000_000.0  # the stub's Mosaic clock, far from wall time on purpose


@pytest.fixture
async def stub_gateway():
    """Answers POST /v1/jobs: 400 for gpus <= 0 (like the gateway), else 201; records bodies."""
    posted: list[dict] = []

    async def submit(request: web.Request) -> web.Response:
        body = await request.read()
        posted.append(json.loads(body))
        raw = json.loads(body)
        if raw.get("gpus", 1) <= 0:
            err = ErrorResponse(
                error="invalid job", errors=(FieldError("gpus", "must be > 0, got 0"),)
            )
            return web.Response(status=400, body=msgspec.json.encode(err))
        spec = msgspec.convert({"id": "gen-1", **raw}, JobSpec)
        view = JobView(
            id=spec.id, tenant=spec.tenant, state="pending", priority=spec.priority,
            gpus=spec.gpus, spec=spec,
        )  # fmt: skip
        return web.Response(status=201, body=msgspec.json.encode(SubmitResponse(job=view)))

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "now": STUB_NOW, "clock_factor": 60.0})

    app = web.Application()
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}", posted
    finally:
        await runner.cleanup()


async def test_submit_sends_the_parsed_spec(stub_gateway, capsys) -> None:
    url, posted = stub_gateway
    args = ["submit", "--gpus", "2", "--mem", "512M", "-C", "a100", "-C", "v100,t4",
            "--elastic", "1:4", "--runtime", "2h", "--id", "mine", "--gateway", url,
            "--latency-p99-ms", "100", "--solo-latency-p99-ms", "90"]  # fmt: skip
    code = await asyncio.to_thread(main, args)
    assert code == 0
    assert capsys.readouterr().out.strip() == "mine"
    sent = posted[-1]
    assert sent["host_mem_gb"] == 0.5 and sent["constraints"] == ["a100", "v100", "t4"]
    assert sent["elastic"] == {"min_gpus": 1, "max_gpus": 4} and sent["est_runtime_s"] == 7200
    assert (sent["latency_p99_ms"], sent["solo_latency_p99_ms"]) == (100.0, 90.0)


async def test_relative_deadline_counts_from_the_gateway_clock(stub_gateway, capsys) -> None:
    url, posted = stub_gateway
    code = await asyncio.to_thread(
        main, ["submit", "--deadline", "2h", "--id", "d", "--gateway", url]
    )
    assert code == 0
    assert posted[-1]["deadline"] == pytest.approx(STUB_NOW + 7200, abs=5)


async def test_submit_without_id_lets_the_gateway_assign_one(stub_gateway, capsys) -> None:
    url, posted = stub_gateway
    assert await asyncio.to_thread(main, ["submit", "--gateway", url]) == 0
    assert "id" not in posted[-1]
    assert capsys.readouterr().out.strip() == "gen-1"


async def test_refusal_is_one_line_and_exit_2(stub_gateway, capsys) -> None:
    url, _ = stub_gateway
    code = await asyncio.to_thread(main, ["submit", "--gpus", "0", "--gateway", url])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err]
    assert "gpus: must be > 0" in err


def test_bad_flag_is_one_line_exit_2(capsys) -> None:
    assert main(["submit", "--mem", "lots"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "memory 'lots'" in err


def test_unreachable_gateway_is_one_line_no_traceback() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "libs.client.cli", "queue", "--gateway", url],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "gateway not reachable" in lines[0] and "mosaic up" in lines[0]


def test_sim_prints_the_comparison(tmp_path: Path, capsys) -> None:
    pytest.importorskip("libs.sim.runner", reason="the simulator (libs.sim.runner) is not here")
    args = ["sim", "--trace", "synthetic", "--gpus", "32", "--max-jobs", "60",
            "--policies", "fifo,mosaic", "--out", str(tmp_path)]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "fifo" in text and "mosaic" in text and str(tmp_path) in text
    assert (tmp_path / "results.json").is_file()
    assert main(["sim", "--trace", "no-such-trace", "--max-jobs", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no-such-trace" in err


def test_up_cluster_choices() -> None:
    from libs.client.cli import UsageProblem, _cluster
    from libs.policy.inventory import demo_cluster, seed_cluster

    assert _cluster(None, None) == demo_cluster()
    assert _cluster(None, ROOT / "deploy" / "clusters" / "demo.json") == demo_cluster()
    assert _cluster(10, None) == seed_cluster(68)  # about 10 nodes of the seed mix
    assert 8 <= len(_cluster(10, None)) <= 12
    with pytest.raises(UsageProblem, match="not both"):
        _cluster(3, ROOT / "deploy" / "clusters" / "demo.json")
