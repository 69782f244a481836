"""Gavel-recipe traces: seeded, Poisson at the asked rate, Gavel's job-type, scale-factor and
duration distributions, and runtimes per GPU type in the ratios of Gavel's throughput table."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from libs.sim.loaders import load_trace
from libs.sim.loaders.gavel import load_throughputs
from libs.sim.loaders.gavel_recipe import (
    DISTRIBUTED,
    JOB_TYPES,
    SCALE_FACTORS,
    Recipe,
    generate,
)
from libs.sim.runner import resolve_cluster, run_simulation


def _table() -> dict[str, dict[tuple[str, int], float]]:
    """A made-up table with Gavel's keys: every type on every GPU, speed v100 > p100 > k80;
    non-distributed types only at one GPU (as in Gavel's)."""
    out: dict[str, dict[tuple[str, int], float]] = {}
    for g, speed in (("v100", 3.0), ("p100", 2.0), ("k80", 1.0)):
        out[g] = {
            (t, s): speed * (1 + k) * s
            for k, t in enumerate(JOB_TYPES)
            for s in (1, 2, 4, 8)
            if s == 1 or t in DISTRIBUTED
        }
    return out


def test_the_recipe_is_parsed_and_bad_fields_are_named():
    r = Recipe.parse("rate=6,jobs=1000,seed=1")
    assert (r.rate_per_h, r.jobs, r.seed, r.multi_gpu) == (6.0, 1000, 1, True)
    assert Recipe.parse("rate=2.5", default_seed=7).seed == 7
    assert not Recipe.parse("rate=6,multi=0").multi_gpu
    for text, field in [
        ("jobs=10", "rate"),
        ("rate=-1", "rate"),
        ("rate=x", "rate"),
        ("rate=6,jobs=0", "jobs"),
        ("rate=6,seed=a", "seed"),
        ("rate=6,multi=2", "multi"),
        ("rate=6,speed=2", "speed"),
        ("rate=6,rate=7", "rate"),
    ]:
        with pytest.raises(ValueError, match=field):
            Recipe.parse(text)


def test_the_same_seed_gives_the_same_jobs_and_another_seed_others():
    a = generate(Recipe(6.0, 300, seed=1), _table())
    assert a == generate(Recipe(6.0, 300, seed=1), _table())
    b = generate(Recipe(6.0, 300, seed=2), _table())
    assert [j.arrival_s for j in a] != [j.arrival_s for j in b]
    assert [j.job_type for j in a] != [j.job_type for j in b]


def test_arrivals_are_poisson_at_the_asked_rate():
    n, rate = 4000, 6.0
    jobs = generate(Recipe(rate, n, seed=3), _table())
    t = np.array([j.arrival_s for j in jobs])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    mean = 3600.0 / rate
    # the mean gap within 5 standard errors; exponential gaps: std = mean (CV 1)
    assert abs(gaps.mean() - mean) < 5 * mean / math.sqrt(len(gaps))
    assert 0.9 < gaps.std() / gaps.mean() < 1.1
    # arrivals per hour: Poisson, variance = mean
    per_h = np.bincount((t // 3600).astype(int))[:-1]
    assert abs(per_h.mean() - rate) < 5 * math.sqrt(rate / len(per_h))
    assert 0.7 < per_h.var() / per_h.mean() < 1.3


def test_job_types_scale_factors_and_durations_follow_gavels_distributions():
    n = 6000
    jobs = generate(Recipe(6.0, n, seed=4), _table())
    sf = Counter(j.scale_factor for j in jobs)
    for s, p in SCALE_FACTORS:
        assert abs(sf[s] / n - p) < 4 * math.sqrt(p * (1 - p) / n), (s, sf[s])
    single = Counter(j.job_type for j in jobs if j.scale_factor == 1)
    multi = Counter(j.job_type for j in jobs if j.scale_factor > 1)
    assert set(single) == set(JOB_TYPES)  # every template, uniformly
    k = sum(single.values())
    p = 1 / len(JOB_TYPES)
    assert all(abs(c / k - p) < 5 * math.sqrt(p * (1 - p) / k) for c in single.values())
    assert set(multi) == set(DISTRIBUTED)  # multi-GPU jobs: the distributed templates only
    v100_min = np.array([j.runtime_s["v100"] for j in jobs]) / 60.0
    assert v100_min.min() >= 10**1.5 - 1e-6 and v100_min.max() <= 10**4 + 1e-6
    long = (v100_min >= 1000).mean()
    assert abs(long - 0.2) < 4 * math.sqrt(0.2 * 0.8 / n)
    single_only = generate(Recipe(6.0, 500, seed=4, multi_gpu=False), _table())
    assert {j.scale_factor for j in single_only} == {1}


@pytest.mark.traces
def test_runtimes_per_gpu_type_follow_gavels_throughput_table(traces_dir: Path):
    tputs = load_throughputs(traces_dir / "gavel" / "simulation_throughputs.json")
    tr = load_trace("gavel:rate=6,jobs=400,seed=1", traces_dir=traces_dir)
    gen = generate(Recipe(6.0, 400, seed=1), tputs)
    assert len(tr.jobs) == 400
    barred = 0
    for tj, g in zip(tr.jobs, gen, strict=True):
        key = (g.job_type, g.scale_factor)
        rt = tj.runtime_by_model
        assert tj.spec.gpus == g.scale_factor and tj.submit_s == g.arrival_s
        assert tj.spec.est_runtime_s == rt["v100-32gb"]
        assert rt["v100-32gb"] / rt["p100"] == pytest.approx(
            tputs["p100"][key] / tputs["v100"][key]
        )
        if key in tputs["k80"]:
            assert rt["v100-32gb"] / rt["k80"] == pytest.approx(
                tputs["k80"][key] / tputs["v100"][key]
            )
            assert tj.spec.constraints == ()
        else:  # no K80 throughput at this scale factor: it may not run there
            barred += 1
            assert "k80" not in rt and tj.spec.constraints == ("p100", "v100-32gb")
        assert tj.spec.checkpointable and tj.spec.deadline is None
    assert barred > 0  # ResNet-50 (batch 128) on several K80s has no throughput


@pytest.mark.traces
def test_every_policy_sees_the_same_per_type_truth_on_gavels_cluster(traces_dir: Path):
    nodes = resolve_cluster("gavel", None)
    per_model = Counter()
    for n in nodes:
        per_model[n.gpu_model] += n.gpu_count
        assert n.gpu_count <= 8
    assert per_model == {"v100-32gb": 36, "p100": 36, "k80": 36}
    runs: dict = {}
    r = run_simulation(
        "gavel:rate=6,jobs=40,seed=2",
        "gavel",
        0,
        ["fifo", "gavel", "mosaic"],
        None,
        traces_dir=traces_dir,
        keep_runs=runs,
        power_saving="all",
    )
    assert r["dropped_jobs"] == 0 and r["jobs"] == 40
    first = np.stack([j.runtime_s for j in runs["fifo"].jobs])
    for name, run in runs.items():
        assert np.array_equal(np.stack([j.runtime_s for j in run.jobs]), first), name
        assert r["policies"][name]["jobs_completed"] == 40
        assert r["policies"][name]["bound_violations"] == []


def test_the_bench_section_replaces_only_itself(tmp_path: Path):
    from libs.sim.bench_gavel import END, START, write_section

    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\nothers\n")
    write_section(f"{START}\nfirst\n{END}\n", page)
    assert page.read_text() == f"# Benchmarks\nothers\n\n{START}\nfirst\n{END}\n"
    page.write_text(page.read_text() + "\n## Later section\nkept\n")
    write_section(f"{START}\nsecond\n{END}\n", page)
    text = page.read_text()
    assert "first" not in text and "second" in text
    assert text.startswith("# Benchmarks\nothers\n") and text.endswith("## Later section\nkept\n")


@pytest.mark.traces
def test_the_recipe_written_in_gavels_layout_reads_back_as_the_same_jobs(
    traces_dir: Path, tmp_path: Path
):
    from libs.sim.loaders.gavel_recipe import gavel_trace_lines

    path = tmp_path / "recipe.trace"
    tputs_path = traces_dir / "gavel" / "simulation_throughputs.json"
    path.write_text(
        "\n".join(gavel_trace_lines(Recipe(6.0, 50, seed=5), load_throughputs(tputs_path)))
    )
    back = load_trace(f"gavel:{path}", traces_dir=traces_dir)
    ours = load_trace("gavel:rate=6,jobs=50,seed=5", traces_dir=traces_dir)
    assert len(back.jobs) == len(ours.jobs) == 50
    for a, b in zip(back.jobs, ours.jobs, strict=True):
        assert a.submit_s == pytest.approx(b.submit_s, abs=1e-6)
        assert a.spec.gpus == b.spec.gpus
        for model, r in b.runtime_by_model.items():  # whole steps: within a step's time
            assert a.runtime_by_model[model] == pytest.approx(r, rel=1e-3, abs=1.0)
