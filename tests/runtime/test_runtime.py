"""libs.runtime on its own: the checkpoint signal served at a step boundary, the progress file,
the task exporter over real HTTP, and refusals that name what is wrong."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import libs.runtime as runtime
from libs.runtime.checkpoint import signal_number

ROOT = Path(__file__).resolve().parents[2]

JOB = """
import sys, time
sys.path.insert(0, {root!r})
import libs.runtime as runtime
saved = []
def save():
    open({ckpt!r}, "w").write(str(len(steps)))
steps = []
rt = runtime.start(save=save, signal_name={sig!r})
print("ready", flush=True)
while True:
    time.sleep(0.01)
    steps.append(1)
    rt.progress(min(1.0, len(steps) / 10000))
    rt.step(samples=4)
"""


def _job(tmp_path: Path, sig: str) -> subprocess.Popen[str]:
    env = {**os.environ, "MOSAIC_PROGRESS_FILE": str(tmp_path / "progress.json")}
    env["MOSAIC_CHECKPOINT_DIR"] = str(tmp_path / "ckpt")
    code = JOB.format(root=str(ROOT), ckpt=str(tmp_path / "saved"), sig=sig)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("sig", ["SIGUSR1", "SIGUSR2"])
def test_the_signal_saves_at_the_next_step_and_exits_zero(tmp_path: Path, sig: str) -> None:
    proc = _job(tmp_path, sig)
    try:
        time.sleep(0.3)
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(10) == 0  # a clean exit: the executor reads it as the checkpoint
    finally:
        proc.kill()
    saved_steps = int((tmp_path / "saved").read_text())
    record = json.loads((tmp_path / "progress.json").read_text())
    assert record["saved"] is True and record["version"] == 1
    assert record["steps"] == saved_steps > 0  # saved at a step boundary, reported as such
    assert record["progress"] == pytest.approx(saved_steps / 10000)
    assert record["samples"] == 4 * saved_steps
    assert 0.005 < record["step_time_s"] < 1.0 and record["steps_per_s"] > 1


def test_immediate_saving_serves_the_signal_inside_a_long_step(tmp_path: Path) -> None:
    """A job whose step is longer than its grace: with ``immediate`` the save runs from the
    handler, in the middle of the step, and the process still exits 0."""
    code = (
        f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); import libs.runtime as runtime\n"
        f"rt = runtime.start(save=lambda: open({str(tmp_path / 'saved')!r}, 'w').write('x'),"
        " immediate=True)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)  # one long step, never reaching rt.step()\n"
    )
    env = {**os.environ, "MOSAIC_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    argv = [sys.executable, "-c", code]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        started = time.monotonic()
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(10) == 0
        assert time.monotonic() - started < 5
    finally:
        proc.kill()
    assert (tmp_path / "saved").read_text() == "x"


def test_another_signal_than_the_jobs_is_not_a_checkpoint(tmp_path: Path) -> None:
    proc = _job(tmp_path, "SIGUSR2")
    try:
        proc.send_signal(signal.SIGUSR1)  # not its checkpoint signal: default action, killed
        assert proc.wait(10) == -signal.SIGUSR1
    finally:
        proc.kill()
    assert not (tmp_path / "saved").exists()


@pytest.fixture
def rt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[runtime.Runtime]:
    monkeypatch.setenv("MOSAIC_JOB_ID", "exp-7")
    monkeypatch.setenv("MOSAIC_ATTEMPT", "2")
    monkeypatch.setenv("MOSAIC_RESUME_PROGRESS", "0.25")
    r = runtime.start(checkpoint_dir=str(tmp_path / "c"), metrics_port=0, signal_name="SIGUSR2")
    yield r
    r.close()


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_the_exporter_serves_step_time_throughput_and_says_why_cuda_is_absent(
    rt: runtime.Runtime,
) -> None:
    assert rt.resume_progress == 0.25 and rt.attempt == 2 and rt.checkpoint_dir.is_dir()
    for _ in range(3):
        time.sleep(0.02)
        rt.step(samples=8)
    rt.progress(0.5)
    assert rt.exporter is not None
    status, kind, text = _get(f"http://127.0.0.1:{rt.exporter.port}/metrics")
    assert status == 200 and kind.startswith("text/plain; version=0.0.4")
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    labels = '{attempt="2",job="exp-7"}'
    assert samples[f"mosaic_task_steps_total{labels}"] == 3
    assert samples[f"mosaic_task_samples_total{labels}"] == 24
    assert 0.015 < samples[f"mosaic_task_step_seconds{labels}"] < 1.0
    assert 10 < samples[f"mosaic_task_steps_per_second{labels}"] < 70
    assert samples[f"mosaic_task_samples_per_second{labels}"] == pytest.approx(
        8 * samples[f"mosaic_task_steps_per_second{labels}"]
    )
    assert samples[f"mosaic_task_progress{labels}"] == 0.5
    # without torch (this test's process), the CUDA family is there with no sample, and says why
    assert "# TYPE mosaic_task_cuda_seconds_total counter" in text
    assert "Not measured: torch is not imported in this process." in text
    assert not any(k.startswith("mosaic_task_cuda_seconds_total{") for k in samples)
    status, _, _ = _get(f"http://127.0.0.1:{rt.exporter.port}/other")
    assert status == 404


def test_bad_values_are_refused_naming_what(rt: runtime.Runtime) -> None:
    with pytest.raises(ValueError, match="progress"):
        rt.progress(1.5)
    with pytest.raises(ValueError, match="progress"):
        rt.progress(float("nan"))
    with pytest.raises(ValueError, match="samples"):
        rt.step(samples=-1)
    with pytest.raises(ValueError, match="SIGKILL"):
        signal_number("SIGKILL")
    with pytest.raises(ValueError, match="NOPE"):
        signal_number("NOPE")
    assert signal_number("USR2") == signal.SIGUSR2


def test_a_progress_record_is_replaced_whole(tmp_path: Path) -> None:
    w = runtime.ProgressWriter(str(tmp_path / "p.json"), min_interval_s=60)
    assert w.write({"progress": 0.1}) and not w.write({"progress": 0.2})  # throttled
    assert w.write({"progress": 0.3}, force=True)
    assert json.loads((tmp_path / "p.json").read_text())["progress"] == 0.3
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temporary file left


def test_the_cache_timer_is_inert_without_torch_and_refuses_a_bad_period(tmp_path: Path) -> None:
    """No torch in this process: asking for the timer starts nothing (a job on a machine
    without torch runs the same code); a period that is no period is refused by name."""
    rt = runtime.start(checkpoint_dir=str(tmp_path / "c"), empty_cache_every_s=0.01)
    try:
        assert rt.cache is not None and not rt.cache.active
    finally:
        rt.close()
    with pytest.raises(ValueError, match="empty_cache_every_s"):
        runtime.start(checkpoint_dir=str(tmp_path / "c"), empty_cache_every_s=-1.0)
