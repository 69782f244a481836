"""The best-peer benchmark's verdicts (``libs.sim.bench_peers``): each target is judged against
the best peer of the same run, and its section replaces only itself on the page."""

from __future__ import annotations

from pathlib import Path

from libs.sim import bench_peers as BP


def _pol(jct_h: float, hp_h: float, deadlines: float, usd: float, failed: int = 0) -> dict:
    return {
        "jct_mean_s": jct_h * 3600,
        "queue_delay_high_mean_s": hp_h * 3600,
        "queue_delay_high_p99_s": hp_h * 7200,
        "deadline_attainment": deadlines,
        "energy_cost_usd": usd,
        "jobs_failed": failed,
    }


def _status(rows: list[str]) -> list[str]:
    return [r.rsplit("|", 2)[-2].strip() for r in rows]


def test_each_loaded_target_is_judged_against_the_best_peer_for_that_metric() -> None:
    run = {
        "dropped_jobs": 0,
        "policies": {
            "fifo": _pol(50, 40, 0.1, 900),
            "drf": _pol(7, 1.0, 0.80, 1000),  # best deadlines
            "tiresias": _pol(8, 0.5, 0.70, 800),  # best wait and energy
            "gavel": _pol(6, 2.0, 0.75, 1200),  # best JCT
            "mosaic": _pol(6.5, 0.4, 0.81, 700),
        },
    }
    rows = BP.loaded_rows(run)
    assert "gavel" in rows[0] and "tiresias" in rows[1] and "drf" in rows[2]
    # JCT 6.5 h > gavel's 6 h; wait and deadlines beat the best; 700/800 = 0.875 <= 0.9
    assert _status(rows) == ["NOT met", "met", "met", "met", "met"]
    run["dropped_jobs"] = 3
    assert _status(BP.loaded_rows(run))[-1] == "NOT met"


def test_natural_targets_read_fifo_and_the_lower_bound() -> None:
    fifo, mosaic = _pol(3.2, 0.0, 1.0, 1000), _pol(3.1, 30 / 3600, 1.0, 790)
    run = {"bounds": {"jct_mean_lb_s": 3.0 * 3600}, "policies": {"fifo": fifo, "mosaic": mosaic}}
    # JCT <= fifo, 3.1 / 3.0 <= 1.1, p99 60 s <= 60 s, 0.79 <= 0.8
    assert _status(BP.natural_rows(run)) == ["met", "met", "met", "met"]
    mosaic["queue_delay_high_p99_s"] = 61.0
    mosaic["jct_mean_s"] = 3.4 * 3600
    assert _status(BP.natural_rows(run)) == ["NOT met", "NOT met", "NOT met", "met"]


def test_the_section_replaces_only_itself(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\nbefore\n\n{BP.START}\nold\n{BP.END}\n\nafter\n")
    BP.write_section(f"{BP.START}\nnew\n{BP.END}\n", page)
    text = page.read_text()
    assert "new" in text and "old" not in text
    assert text.index("before") < text.index("new") < text.index("after")


def test_the_frontier_says_whether_the_two_natural_targets_can_be_met_together() -> None:
    fifo = {**_pol(3.2, 0.0, 1.0, 120), "energy_kwh": 1000.0}
    mosaic = {**_pol(3.3, 0.0, 1.0, 110), "energy_kwh": 950.0}
    floors = {"1": None, "1.1": 830.0, "2": 500.0}
    run = {
        "bounds": {"jct_mean_lb_s": 3.0 * 3600, "energy_kwh_lb_power_saving_at_jct": floors},
        "policies": {"fifo": fifo, "mosaic": mosaic},
    }
    text = "\n".join(BP.frontier_lines(run))
    assert "0.830x fifo's" in text and "cannot both be met by any schedule" in text
    assert "| 1 | none reaches it | - |" in text and "| 2 | 500 | 0.500 |" in text
    assert "1.100x the bound, 0.950x fifo's energy" in text
    floors["1.1"] = 790.0
    assert "can be met together only by" in "\n".join(BP.frontier_lines(run))
    run["bounds"].pop("energy_kwh_lb_power_saving_at_jct")
    assert BP.frontier_lines(run) == []  # a results.json from before the frontier
