"""``run_simulation`` end to end on the synthetic trace: schema, files, errors."""

from __future__ import annotations

import json

import pytest

from libs.sim.report import render_table
from libs.sim.runner import main, resolve_cluster, run_simulation

KEYS = (
    "utilization",
    "work_utilization",
    "allocation_ratio",
    "jct_mean_s",
    "jct_p99_s",
    "queue_delay_high_mean_s",
    "queue_delay_high_p99_s",
    "deadline_attainment",
    "energy_kwh",
    "energy_cost_usd",
    "failure_rate",
    "starvation_p99_wait_s",
    "makespan_s",
    "wall_s",
)


def test_results_json_and_plots(tmp_path):
    seen = []
    r = run_simulation(
        "synthetic:300",
        "seed",
        64,
        ["fifo", "mosaic"],
        tmp_path,
        load=0.8,
        progress=lambda p, f: seen.append((p, f)),
    )
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["policies"].keys() == {"fifo", "mosaic"}
    for name in ("fifo", "mosaic"):
        for k in KEYS:
            assert k in on_disk["policies"][name], k
        assert on_disk["policies"][name]["bound_violations"] == []
    assert set(on_disk["bounds"]) >= {"jct_mean_lb_s", "energy_kwh_lb", "work_utilization_ub"}
    assert on_disk["load"]["offered_demand_over_capacity"] == pytest.approx(0.8)
    for png in ("jct_cdf.png", "utilization.png", "queue.png", "energy.png"):
        assert (tmp_path / png).stat().st_size > 1000
    assert {p for p, _ in seen} == {"fifo", "mosaic"} and ("mosaic", 1.0) in seen
    assert len(render_table(r)) >= 2


def test_cluster_names():
    assert sum(n.gpu_count for n in resolve_cluster("v100=8,k80=4", None)) == 12
    assert sum(n.gpu_count for n in resolve_cluster("counts:t4=8", None)) == 8
    assert len(resolve_cluster("demo", None)) == 10
    with pytest.raises(ValueError, match="--gpus"):
        resolve_cluster("seed", None)
    with pytest.raises(FileNotFoundError):
        resolve_cluster("missing.json", None)
    with pytest.raises(ValueError, match="unknown cluster"):
        resolve_cluster("nonsense", None)


def test_bad_policy_and_cli_error(capsys):
    with pytest.raises(ValueError, match="unknown policy"):
        run_simulation("synthetic:10", "demo", 0, ["fifo", "sjf"], None)
    assert main(["--trace", "synthetic:10", "--cluster", "nonsense"]) == 2
    assert "unknown cluster" in capsys.readouterr().out


def test_bench_page_keeps_the_sections_other_commands_measured(tmp_path) -> None:
    from libs.sim.bench import KEEP_MARKER, kept_sections

    page = tmp_path / "benchmarks.md"
    assert kept_sections(page) == ""  # no page yet
    page.write_text(f"# Benchmarks\nold figures\n\n{KEEP_MARKER}\n\n## Fuzzing\n10,000 requests\n")
    kept = kept_sections(page)
    assert kept.startswith(f"\n{KEEP_MARKER}") and "10,000 requests" in kept
    assert "old figures" not in kept
