"""Profiles: the shipped table reproduces the seed facts; any GPU model gets an estimate."""

from __future__ import annotations

import json

import pytest

from libs.policy.energy import energy_per_work_j, job_energy_kwh
from libs.policy.profiles import DATA_FILE, REFERENCE_MODEL, ProfileTable
from proto.jobs import WORKLOAD_CLASSES, JobSpec
from proto.nodes import NodeSpec

P = ProfileTable.default()


def test_seed_facts_a100_vs_t4_on_resnet50():
    assert P.speed("a100-80gb", "cnn") / P.speed("t4", "cnn") == pytest.approx(2.3, abs=0.15)
    assert P.power_w("a100-80gb", "cnn") / P.power_w("t4", "cnn") == pytest.approx(1.58, abs=0.15)
    assert not P.is_estimated("a100-80gb", "cnn") and not P.is_estimated("t4", "cnn")
    # so the A100 is the greener place for ResNet-50 work
    assert energy_per_work_j("a100-80gb", "cnn", P) < energy_per_work_j("t4", "cnn", P)


def test_reference_is_one_and_every_entry_has_provenance():
    for c in WORKLOAD_CLASSES:
        assert P.speed(REFERENCE_MODEL, c) == 1.0
    raw = json.loads(DATA_FILE.read_text())
    assert raw["entries"] and all(e["source"] for e in raw["entries"])


def test_unknown_models_get_estimates_and_never_raise():
    for model in ("h100", "l4", "h800", "a10", "NVIDIA H200", "no-such-gpu"):
        for c in WORKLOAD_CLASSES:
            s, w = P.speed(model, c), P.power_w(model, c)
            assert s > 0 and w > 0
            assert P.source(model, c)
    for m in ("l4", "h800", "no-such-gpu"):
        assert P.is_estimated(m, "cnn")
    assert P.speed("h800", "cnn") == pytest.approx(P.speed("h100", "cnn"), rel=0.05)
    assert P.speed("l4", "cnn") > P.speed("t4", "cnn")  # newer, faster datasheet


def test_estimate_for_a_model_the_catalog_does_not_know():
    node = NodeSpec(
        id="x0",
        gpu_model="h900",
        gpu_count=8,
        gpu_mem_gb=192,
        host_mem_gb=2048,
        cpus=128,
        idle_power_w=90,
        max_power_w=1000,
    )
    t = P.estimate_for(node)
    assert t.is_estimated("h900", "cnn") and "max_power_w" in t.source("h900", "cnn")
    assert t.speed("h900", "cnn") > P.speed("no-such-gpu", "cnn")  # beats the blind default
    assert t.idle_power_w("h900") == 90
    assert t.estimate_for(node) is t  # nothing left to add
    spec = JobSpec(id="j", est_runtime_s=3600, workload_class="cnn")
    assert t.runtime_s(spec, "h900") == pytest.approx(3600 / t.speed("h900", "cnn"))


def test_observe_smooths_and_returns_a_new_table():
    old = P.speed("t4", "rnn")
    t = P.observe("t4", "rnn", old * 2, alpha=0.5)
    assert t.speed("t4", "rnn") == pytest.approx(old * 1.5)
    assert P.speed("t4", "rnn") == old  # immutable
    with pytest.raises(ValueError):
        P.observe("t4", "rnn", -1.0)


def test_matrices_and_energy():
    m = P.speed_matrix(["t4", "a100-80gb"], ["cnn", "rnn"])
    assert m.shape == (2, 2) and m[1, 0] == P.speed("a100-80gb", "cnn")
    spec = JobSpec(id="j", gpus=2, est_runtime_s=3600, workload_class="cnn")
    e = job_energy_kwh(spec, "t4", P)
    assert e == pytest.approx(3600 / P.speed("t4", "cnn") * P.power_w("t4", "cnn") * 2 / 3.6e6)


def test_derive_script_reproduces_the_shipped_table(traces_dir):
    from libs.policy.derive_profiles import derive

    assert derive(traces_dir) == json.loads(DATA_FILE.read_text())
