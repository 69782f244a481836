"""``mosaic bench placer``: one JSON object with the issue's fields, from the placer's own code."""

from __future__ import annotations

import json
import subprocess
import sys

from services.placer.bench import run


def test_the_bench_fills_a_cluster_and_holds_the_queue():
    out = run(300, 800, steady_cycles=5)
    assert out["gpus"] >= 290 and out["pending"] == 800
    assert 0 < out["placements"] <= out["gpus"] and out["placements_per_s"] > 0
    assert out["queued_after"] >= 800 - out["placements"]  # the queue is held at 800
    assert 0 < out["cycle_p50_s"] <= out["cycle_p99_s"]


def test_mosaic_bench_placer_prints_one_json_object():
    cmd = [sys.executable, "-m", "libs.client.cli", "bench", "placer", "--gpus", "100"]
    cmd += ["--pending", "200", "--steady-cycles", "3", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    body = json.loads(done.stdout)
    for key in ("nodes", "gpus", "pending", "placements_per_s", "cycle_p50_s", "cycle_p99_s"):
        assert key in body
