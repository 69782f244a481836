"""Interference in the simulator (libs.sim.sharing, issue 16): fractions sharing a GPU run
slower by the model's factor for exactly the time they share; a job alone is not slowed; and
mosaic with the rule keeps a pair the model refuses apart while blind sharing packs it."""

from __future__ import annotations

import dataclasses

import pytest

from libs.policy.config import PolicyConfig
from libs.policy.interference import InterferenceModel
from libs.policy.profiles import ProfileTable
from libs.sim.baselines import make_policy
from libs.sim.bench_share import with_latency
from libs.sim.engine import simulate
from libs.sim.sharing import SimSharing, fractional_report
from libs.sim.trace import Trace, TraceJob
from tests.sim.helpers import FlatProfiles, job, node

M = InterferenceModel.default()


def _run(jobs, nodes, policy="fifo", sharing=True):  # type: ignore[no-untyped-def]
    s = SimSharing() if sharing else None
    res = simulate(jobs, nodes, make_policy(policy), FlatProfiles(), sharing=s)
    return {j.spec.id: j for j in res.jobs}, s


def test_two_fractions_on_one_gpu_run_slower_while_they_share() -> None:
    jobs = [
        job("c", 0.0, 1000.0, gpus=0.5, workload_class="cnn"),
        job("r", 0.0, 1000.0, gpus=0.5, workload_class="rnn"),
    ]
    got, sharing = _run(jobs, [node("n0", gpus=1)])
    f_c, f_r = M.slowdown("cnn", "rnn"), M.slowdown("rnn", "cnn")
    assert f_c > f_r > 1.0  # the data: a CNN suffers more beside an RNN than the reverse
    end_r = 1000.0 * f_r  # r shares the whole time
    end_c = end_r + (1000.0 - end_r / f_c)  # c shares until r leaves, then runs alone
    assert got["r"].end_s == pytest.approx(end_r, rel=1e-5)
    assert got["c"].end_s == pytest.approx(end_c, rel=1e-5)
    rep = fractional_report(got.values(), sharing)
    assert rep["completed"] == 2 and rep["slowed_share"] == 1.0
    want_lost_s = ((end_c - 1000) + (end_r - 1000)) / 2
    assert rep["mean_lost_to_sharing_s"] == pytest.approx(want_lost_s, abs=1e-2)


def test_alone_or_without_the_model_nothing_is_slowed() -> None:
    one = [job("c", 0.0, 1000.0, gpus=0.5, workload_class="cnn")]
    got, _ = _run(one, [node("n0", gpus=1)])
    assert got["c"].end_s == pytest.approx(1000.0)
    two = [job(x, 0.0, 1000.0, gpus=0.5, workload_class="cnn") for x in "ab"]
    got, _ = _run(two, [node("n0", gpus=1)], sharing=False)
    assert {j.end_s for j in got.values()} == {1000.0}
    whole = [job(x, 0.0, 1000.0, gpus=1, workload_class="cnn") for x in "ab"]
    got, _ = _run(whole, [node("n0", gpus=2)])
    assert {j.end_s for j in got.values()} == {1000.0}


def test_mosaic_keeps_apart_what_the_model_refuses_blind_sharing_packs_it() -> None:
    """Two RNN fractions (1.28x beside each other, above the 1.25 bound) and two GPUs: with the
    rule each gets a GPU of its own; blind (share_interference=false) they pack and both run
    1.28x longer."""
    assert M.slowdown("rnn", "rnn") > PolicyConfig.default().share_max_slowdown
    rt = {"v100-32gb": 1000.0}
    jobs = [job(x, 0.0, 1000.0, gpus=0.5, workload_class="rnn", runtime_by_model=rt) for x in "ab"]
    nodes = [node("n0", gpus=2)]
    ends = {}
    for on in (True, False):
        cfg = dataclasses.replace(PolicyConfig.default(), share_interference=on)
        res = simulate(
            jobs,
            nodes,
            make_policy("mosaic", cfg=cfg),
            ProfileTable.default(),
            sharing=SimSharing(),
        )
        ends[on] = sorted(j.end_s for j in res.jobs)
    assert ends[True] == pytest.approx([1000.0, 1000.0])
    assert ends[False] == pytest.approx([1000.0 * M.slowdown("rnn", "rnn")] * 2)


def test_a_latency_target_broken_while_sharing_is_counted_and_the_rule_prevents_it() -> None:
    """An RNN replica (90 ms alone, 100 ms target) and an RNN trainer on one GPU: blind, they
    share and the replica's modelled p99 (90 x 1.28) breaks its target; with the rule the
    replica waits for the GPU instead."""
    rt = {"v100-32gb": 1000.0}
    spec_kw = {"gpus": 0.5, "workload_class": "rnn", "runtime_by_model": rt}
    jobs = [
        job("train", 0.0, 1000.0, **spec_kw),
        job("serve", 1.0, 1000.0, kind="inference", latency_p99_ms=100.0,
            solo_latency_p99_ms=90.0, **spec_kw),
    ]  # fmt: skip
    broken = {}
    for on in (True, False):
        cfg = dataclasses.replace(PolicyConfig.default(), share_interference=on)
        sharing = SimSharing()
        res = simulate(
            jobs, [node("n0", gpus=1)], make_policy("mosaic", cfg=cfg), ProfileTable.default(),
            sharing=sharing,
        )  # fmt: skip
        rep = fractional_report(res.jobs, sharing)
        assert rep["latency_jobs"] == 1
        broken[on] = rep["latency_targets_broken"]
    assert broken == {True: 0, False: 1}


def test_the_bench_stamps_latency_targets_on_fractional_inference_only() -> None:
    jobs = (
        job("inf", 0.0, 10.0, gpus=0.5, kind="inference"),
        job("train", 1.0, 10.0, gpus=0.5),
        job("big", 2.0, 10.0, gpus=1, kind="inference"),
    )
    tr = Trace(name="t", jobs=tuple(TraceJob(spec=j.spec, submit_s=j.submit_s) for j in jobs))
    out = {j.spec.id: j.spec for j in with_latency(90.0, 100.0)(tr).jobs}
    assert (out["inf"].solo_latency_p99_ms, out["inf"].latency_p99_ms) == (90.0, 100.0)
    assert out["train"].latency_p99_ms is None and out["big"].latency_p99_ms is None
