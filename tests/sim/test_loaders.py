"""Trace loaders: real files checked against the facts in ../shared/traces/README.md, and the
seeded synthetic trace (which needs no files)."""

from __future__ import annotations

import csv
import gzip
import math
from collections import Counter
from pathlib import Path

import msgspec
import numpy as np
import pytest

from libs.sim.loaders import load_trace
from libs.sim.trace import REFERENCE_MODEL, Trace, TraceJob
from proto.jobs import HIGH_PRIORITY, JobSpec
from proto.validation import validate_job

OPENB = Path("alibaba-gpu-v2023-openb")
CHRONUS = Path("philly-derived") / "chronus-deadline"


def _rows(path: Path) -> list[dict[str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _by_id(trace: Trace) -> dict[str, TraceJob]:
    return {j.spec.id: j for j in trace.jobs}


def _assert_sorted_and_valid(trace: Trace) -> None:
    subs = [j.submit_s for j in trace.jobs]
    assert subs == sorted(subs)
    assert trace.invalid_jobs() == []
    assert len({j.spec.id for j in trace.jobs}) == len(trace.jobs)


# ---------------------------------------------------------------- synthetic (no files needed)


def test_synthetic_needs_no_files_and_is_valid(tmp_path: Path) -> None:
    trace = load_trace("synthetic", traces_dir=tmp_path / "absent", seed=3)
    assert len(trace.jobs) == 1000
    _assert_sorted_and_valid(trace)
    specs = [j.spec for j in trace.jobs]
    assert any(s.gpus < 1 and s.kind == "inference" for s in specs)
    assert any(s.gpus >= 8 for s in specs)
    assert any(s.constraints for s in specs)
    assert any(s.elastic is not None for s in specs)
    assert 0.1 < np.mean([s.priority >= HIGH_PRIORITY for s in specs]) < 0.3
    assert 0.1 < np.mean([s.deadline is not None for s in specs]) < 0.4
    for j in trace.jobs:
        if j.spec.deadline is not None:
            assert j.spec.deadline > j.submit_s
    assert len({s.workload_class for s in specs}) >= 5
    assert any("synthetic" in a for a in trace.assumptions)


def test_synthetic_is_deterministic_per_seed() -> None:
    a = msgspec.json.encode(load_trace("synthetic", seed=7, max_jobs=300))
    b = msgspec.json.encode(load_trace("synthetic", seed=7, max_jobs=300))
    c = msgspec.json.encode(load_trace("synthetic", seed=8, max_jobs=300))
    assert a == b
    assert a != c


def test_synthetic_count_in_name() -> None:
    assert len(load_trace("synthetic:42").jobs) == 42


def test_missing_folder_names_path_and_suggests_synthetic(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as err:
        load_trace("philly", traces_dir=missing)
    assert str(missing) in str(err.value)
    assert "synthetic" in str(err.value)


def test_unknown_trace_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown trace"):
        load_trace("nonesuch")


# ---------------------------------------------------------------- Trace helpers


def _job(i: int, submit: float, deadline: float | None = None) -> TraceJob:
    return TraceJob(
        spec=JobSpec(id=f"j{i}", est_runtime_s=100.0, deadline=deadline), submit_s=submit
    )


def test_trace_rejects_unsorted_jobs() -> None:
    with pytest.raises(ValueError, match="sorted"):
        Trace(name="x", jobs=(_job(0, 5.0), _job(1, 1.0)))


def test_slice_rebases_and_keeps_deadline_slack() -> None:
    trace = Trace(name="x", jobs=(_job(0, 0.0), _job(1, 10.0, 60.0), _job(2, 20.0), _job(3, 30.0)))
    part = trace.slice(start_s=10.0, end_s=30.0)
    assert [j.spec.id for j in part.jobs] == ["j1", "j2"]
    assert [j.submit_s for j in part.jobs] == [0.0, 10.0]
    assert part.jobs[0].spec.deadline == 50.0
    assert len(trace.slice(max_jobs=3).jobs) == 3
    assert len(part.assumptions) == len(trace.assumptions) + 1


def test_scale_arrivals_compresses_submits_not_slack() -> None:
    trace = Trace(name="x", jobs=(_job(0, 0.0), _job(1, 100.0, 400.0)))
    fast = trace.scale_arrivals(4.0)
    assert [j.submit_s for j in fast.jobs] == [0.0, 25.0]
    assert fast.jobs[1].spec.deadline == 325.0
    assert fast.jobs[1].spec.est_runtime_s == 100.0
    with pytest.raises(ValueError):
        trace.scale_arrivals(0)


def test_summary_counts_sizes_and_gpu_hours() -> None:
    jobs = (
        TraceJob(spec=JobSpec(id="a", gpus=0.5, est_runtime_s=3600.0), submit_s=0.0),
        TraceJob(spec=JobSpec(id="b", gpus=4, est_runtime_s=1800.0), submit_s=86400.0),
    )
    s = Trace(name="x", jobs=jobs).summary()
    assert s["jobs"] == 2
    assert s["gpu_hours"] == 2.5
    assert s["span_days"] == 1.0
    assert s["size_mix"]["fractional"] == 1 and s["size_mix"]["2-4"] == 1


# ---------------------------------------------------------------- Philly


@pytest.fixture(scope="module")
def philly(traces_dir: Path) -> Trace:
    return load_trace("philly", traces_dir=traces_dir, seed=0)


def test_philly_reads_every_row(philly: Trace, traces_dir: Path) -> None:
    raw = _rows(traces_dir / "philly-derived" / "sia_philly_jobs.csv.gz")
    assert len(raw) == 82_247  # README
    droppable = sum(float(r["duration"]) <= 0 or int(r["num_gpus"]) > 64 for r in raw)
    assert len(philly.jobs) == len(raw) - droppable
    assert f"{len(raw)} rows read" in philly.assumptions[0]
    assert philly.jobs[0].submit_s == 0.0
    assert max(j.spec.gpus for j in philly.jobs) <= 64
    # a hand-picked row keeps its duration, size and VC
    first = raw[0]
    job = _by_id(philly)["philly-0"]
    assert job.spec.est_runtime_s == float(first["duration"])
    assert job.spec.gpus == float(first["num_gpus"])
    assert job.spec.tenant == f"vc-{first['cluster']}"


def test_philly_fills_are_realistic_valid_and_listed(philly: Trace) -> None:
    _assert_sorted_and_valid(philly)
    s = philly.summary()
    assert 0.25 <= s["gpu_mem_over_16gb_share"] <= 0.35
    assert 0.02 <= s["gpu_mem_over_32gb_share"] < 0.15
    assert 0.15 <= s["high_priority_share"] <= 0.20
    assert 0.15 <= s["deadline_share"] <= 0.35
    ck = np.mean([j.spec.checkpointable for j in philly.jobs])
    assert 0.25 <= ck <= 0.40
    es = np.array([j.spec.energy_sensitivity for j in philly.jobs])
    assert es.min() < 0.05 and es.max() > 0.95
    for j in philly.jobs[:5000]:
        if j.spec.deadline is not None:
            slack = (j.spec.deadline - j.submit_s) / j.spec.est_runtime_s
            assert 1.5 <= slack <= 4.0
    text = " ".join(philly.assumptions)
    for field in ("priority", "gpu_mem_gb", "deadline", "energy_sensitivity", "checkpointable"):
        assert field in text
    assert REFERENCE_MODEL in text


def test_philly_seeded_fills_reproduce_and_vary(philly: Trace, traces_dir: Path) -> None:
    other = load_trace("philly", traces_dir=traces_dir, seed=1, max_jobs=2000)
    again = load_trace("philly", traces_dir=traces_dir, seed=0, max_jobs=2000)
    assert [j.spec for j in again.jobs] == [j.spec for j in philly.jobs[:2000]]
    assert [j.spec.priority for j in other.jobs] != [j.spec.priority for j in again.jobs]
    # the trace's own fields do not depend on the seed
    assert [j.submit_s for j in other.jobs] == [j.submit_s for j in again.jobs]


# ---------------------------------------------------------------- Chronus


@pytest.mark.parametrize("variant", ["slo", "mix1", "mix2"])
def test_chronus_units_and_deadlines(traces_dir: Path, variant: str) -> None:
    files = {
        "slo": "trace_job_Philly_SLO.csv",
        "mix1": "trace_job_Philly_MIX1.csv",
        "mix2": "trace_job_Philly_MIX2.csv.gz",
    }
    raw = _rows(traces_dir / CHRONUS / files[variant])
    assert len(raw) == 30_940  # README
    trace = load_trace(f"chronus:{variant}", traces_dir=traces_dir)
    with_gpu = [r for r in raw if int(r["num_gpu"]) > 0]
    assert len(trace.jobs) == len(with_gpu)
    jobs = _by_id(trace)
    for r in with_gpu[:300]:
        j = jobs[f"chronus-{variant}-{r['job_id']}"]
        assert j.submit_s == float(r["submit_time"]) * 60
        assert j.spec.est_runtime_s == float(r["duration"]) * 60
        assert j.spec.workload_class == "cnn"
        if r["best_effort"] == "1":
            assert j.spec.deadline is None
        else:
            first = float(r["expect_time_list"].split("-")[0])
            assert j.spec.deadline == pytest.approx((float(r["submit_time"]) + first) * 60)
    expected_deadlines = sum(r["best_effort"] != "1" for r in with_gpu)
    assert sum(j.spec.deadline is not None for j in trace.jobs) == expected_deadlines
    assert trace.invalid_jobs() == []


def test_chronus_unknown_variant(traces_dir: Path) -> None:
    with pytest.raises(ValueError, match="variant"):
        load_trace("chronus:mix9", traces_dir=traces_dir)


# ---------------------------------------------------------------- openb


def test_openb_pods_nodes_and_fractions(traces_dir: Path) -> None:
    raw = _rows(traces_dir / OPENB / "openb_pod_list_default.csv")
    assert len(raw) == 8_152  # README
    frac_raw = [r for r in raw if r["num_gpu"] == "1" and int(r["gpu_milli"]) < 1000]
    assert len(frac_raw) == 3_078  # README
    cpu_only = sum(r["num_gpu"] == "0" for r in raw)
    trace = load_trace("openb", traces_dir=traces_dir)
    assert f"skipped {cpu_only} CPU-only" in trace.assumptions[0]
    frac = [j for j in trace.jobs if j.spec.gpus < 1]
    assert len(frac_raw) - 5 <= len(frac) <= len(frac_raw)
    pod = _by_id(trace)[frac_raw[0]["name"]]
    assert pod.spec.gpus == int(frac_raw[0]["gpu_milli"]) / 1000
    assert pod.submit_s == float(frac_raw[0]["creation_time"])
    assert len(trace.nodes) == 1_213
    assert sum(n.gpu_count for n in trace.nodes) == 6_212
    models = Counter(n.gpu_model for n in trace.nodes)
    assert models["g2"] == 549 and models["t4"] == 404 and models["v100-32gb"] == 30
    qos = {r["name"]: r["qos"] for r in raw}
    for j in trace.jobs:  # the QoS classes (libs.sim.loaders.openb.with_qos)
        q, s = qos[j.spec.id], j.spec
        assert (s.kind == "inference") == (q == "LS") == (s.latency_p99_ms is not None)
        assert s.checkpointable == (q in ("Burstable", "BE"))
        assert (s.elastic is not None) == (q == "BE" and s.gpus >= 2)
        assert (s.priority >= HIGH_PRIORITY) == (q in ("LS", "Guaranteed"))
        assert (q == "BE") == (s.priority <= 3)
    assert Counter(qos[j.spec.id] for j in trace.jobs).keys() >= {"LS", "BE", "Burstable"}
    _assert_sorted_and_valid(trace)


def test_openb_gpu_type_constraints_parsed(traces_dir: Path) -> None:
    raw = _rows(traces_dir / OPENB / "openb_pod_list_gpuspec33.csv")
    trace = load_trace("openb:gpuspec33", traces_dir=traces_dir)
    by_id = _by_id(trace)
    kept = [r for r in raw if r["name"] in by_id]
    t4_only = [r for r in kept if r["gpu_spec"] == "T4"]
    assert t4_only
    for r in t4_only:
        spec = by_id[r["name"]].spec
        assert spec.constraints == ("t4",)
        assert spec.gpu_mem_gb <= 16
    dup = next(r for r in kept if r["gpu_spec"] == "V100M16|V100M32|V100M32")
    assert by_id[dup["name"]].spec.constraints == ("v100-16gb", "v100-32gb")
    g2 = next(r for r in kept if r["gpu_spec"] == "G2")
    assert by_id[g2["name"]].spec.constraints == ("g2",)
    # g2 is not in the catalog: valid only against a cluster that has it
    assert validate_job(by_id[g2["name"]].spec, now=-math.inf)
    assert trace.invalid_jobs() == []


def test_openb_variants_without_times_are_refused(traces_dir: Path) -> None:
    with pytest.raises(ValueError, match="no creation/deletion times"):
        load_trace("openb:multigpu20", traces_dir=traces_dir)
    with pytest.raises(FileNotFoundError):
        load_trace("openb:gpushare999", traces_dir=traces_dir)


# ---------------------------------------------------------------- Helios


def test_helios_keeps_real_arrival_counts_per_bin(traces_dir: Path) -> None:
    raw = _rows(traces_dir / "helios" / "venus_cluster_throughput_10min.csv")
    counts = np.array([int(r["submit_gpu_job"]) for r in raw])
    assert counts.sum() == 125_214  # README
    trace = load_trace("helios", traces_dir=traces_dir)
    assert len(trace.jobs) == counts.sum()
    bins = np.bincount(
        (np.array([j.submit_s for j in trace.jobs]) // 600).astype(int), minlength=len(counts)
    )
    assert (bins[: len(counts)] == counts).all()
    gpus = np.array([j.spec.gpus for j in trace.jobs])
    assert np.median(gpus) == 1 and gpus.max() <= 64
    sub = Trace(name="h", jobs=trace.jobs[:3000], nodes=())
    assert sub.invalid_jobs() == []


# ---------------------------------------------------------------- Gavel


def test_gavel_runtime_is_steps_over_throughput(traces_dir: Path) -> None:
    trace = load_trace("gavel:small_test", traces_dir=traces_dir)
    assert len(trace.jobs) == 20
    first = _by_id(trace)["gavel-small_test-0"]
    # row 1: Transformer (batch size 128), total_steps 346, scale_factor 2; isolated throughputs
    # read by hand from simulation_throughputs.json["<gpu>"]["('Transformer (batch size 128)', 2)"]
    assert first.spec.gpus == 2
    assert first.spec.workload_class == "transformer"
    assert first.runtime_by_model == pytest.approx(
        {
            "v100-32gb": 346 / 10.069238394742342,
            "p100": 346 / 5.087428857861381,
            "k80": 346 / 1.6574724675832473,
        }
    )
    assert first.spec.est_runtime_s == pytest.approx(346 / 10.069238394742342)
    _assert_sorted_and_valid(trace)


def test_gavel_per_vc_layout(traces_dir: Path) -> None:
    trace = load_trace("gavel:0e4a51", traces_dir=traces_dir)
    assert len(trace.jobs) > 500
    assert all(j.runtime_by_model and REFERENCE_MODEL in j.runtime_by_model for j in trace.jobs)
    assert "per-VC layout" in trace.assumptions[0]
    _assert_sorted_and_valid(trace)


def test_gavel_missing_file_is_clear(traces_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        load_trace("gavel:no_such_trace", traces_dir=traces_dir)
