"""Priority: regimes switch at 50%/80%, DRF is right by hand, urgency rises, aging wins."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.config import PolicyConfig
from libs.policy.priority import dominant_share, rank, regime, urgency
from libs.policy.profiles import ProfileTable
from libs.policy.queue import PendingQueue
from libs.policy.types import PendingJob
from proto.jobs import JobSpec

CFG = PolicyConfig.default()
PROFILES = ProfileTable.default()
CAP = np.array([100.0, 4000.0, 2000.0, 800.0])


def _rank(jobs, now=0.0, load=0.3, usage=None, cfg=CFG):
    return rank(
        jobs,
        now=now,
        load=load,
        tenant_usage=usage or {},
        capacity=CAP,
        cfg=cfg,
        profiles=PROFILES,
        models=["v100-32gb", "a100-80gb", "t4"],
    )


def test_regime_thresholds():
    assert regime(0.0, CFG) == "low" and regime(0.499, CFG) == "low"
    assert regime(0.5, CFG) == "balanced" and regime(0.8, CFG) == "balanced"
    assert regime(0.801, CFG) == "high" and regime(1.0, CFG) == "high"
    assert CFG.weights("low").fair_share == 0.7 and CFG.weights("high").priority == 0.6
    r = _rank([PendingJob(JobSpec(id="a"), 0.0)], load=0.9)
    assert r.regime == "high"


def test_dominant_share_hand_computed():
    # 10 GPUs of 100 (0.10), 800 GB GPU memory of 4000 (0.20), 100 of 2000 host (0.05),
    # 40 CPUs of 800 (0.05): the dominant share is GPU memory, 0.20
    assert dominant_share(np.array([10, 800, 100, 40]), CAP) == pytest.approx(0.20)
    assert dominant_share(30.0, CAP) == pytest.approx(0.30)  # a number = GPUs
    with pytest.raises(ValueError):
        dominant_share(np.array([1.0, 2.0]), CAP)


def test_fair_share_favours_the_lighter_tenant():
    jobs = [
        PendingJob(JobSpec(id="heavy", tenant="a"), 0.0),
        PendingJob(JobSpec(id="light", tenant="b"), 0.0),
    ]
    r = _rank(jobs, usage={"a": np.array([50, 0, 0, 0]), "b": np.array([5, 0, 0, 0])})
    assert r.order[0] == 1
    # two tenants: fair = 1 / (1 + dominant share * 2)
    assert r.terms["fair_share"][0] == pytest.approx(1 / (1 + 0.5 * 2))
    assert r.terms["fair_share"][1] == pytest.approx(1 / (1 + 0.05 * 2))


def test_urgency_rises_as_deadline_nears():
    rem = np.array([3600.0])
    dl = np.array([100_000.0])
    us = [float(urgency(dl, now, rem, CFG)[0]) for now in range(0, 100_000, 5000)]
    assert all(b >= a for a, b in itertools.pairwise(us)) and us[-1] > us[0]
    assert float(urgency(np.array([np.nan]), 0.0, rem, CFG)[0]) == 0.0
    assert float(urgency(dl, 99_000.0, rem, CFG)[0]) == CFG.urgency_missed  # cannot make it


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 9),
    st.integers(0, 9),
    st.floats(0, 1),
    st.floats(0, 1),
    st.floats(0.0, 1.0),
    st.sampled_from(["a", "b"]),
)
def test_aging_lifts_any_waiting_job_above_any_fresh_one(p_old, p_new, es_old, es_new, load, t):
    old = JobSpec(id="old", tenant=t, priority=p_old, energy_sensitivity=es_old)
    fresh = JobSpec(
        id="new",
        tenant="c",
        priority=p_new,
        energy_sensitivity=es_new,
        deadline=10_000_000.0 + 10.0,
        est_runtime_s=10.0,
    )
    usage = {"a": 90.0, "b": 90.0, "c": 0.0}
    # the bound: a fresh job scores at most 1 + w_short, aging adds aging_per_h per hour
    wait_s = 3600.0 * (1.0 + CFG.w_short) / CFG.aging_per_h + 3600.0
    now = 10_000_000.0
    r = _rank(
        [PendingJob(old, now - wait_s), PendingJob(fresh, now)], now=now, load=load, usage=usage
    )
    assert r.order[0] == 0


def test_high_load_protects_critical_jobs():
    crit = PendingJob(JobSpec(id="crit", tenant="a", priority=6), 0.0)
    low = PendingJob(JobSpec(id="low", tenant="b", priority=4), 0.0)
    usage = {"a": 60.0, "b": 0.0}
    assert _rank([crit, low], load=0.2, usage=usage).order[0] == 1  # fairness first when idle
    assert _rank([crit, low], load=0.9, usage=usage).order[0] == 0  # priority when busy


def test_a_shorter_job_ranks_first_and_the_term_is_bounded():
    # shortest remaining time first (issue 15): same job, same wait, only the length differs
    def job(i, est, prio=5, prog=0.0):
        return PendingJob(JobSpec(id=f"j{i}", est_runtime_s=est, priority=prio), 0.0, progress=prog)

    lengths = [86_400.0 * 5, 600.0, 3 * 3600.0, 60.0]
    r = _rank([job(i, e) for i, e in enumerate(lengths)], load=0.9)
    assert [int(i) for i in r.order] == [3, 1, 2, 0]
    short = r.terms["short"]
    assert ((short > 0) & (short <= 1)).all()
    # remaining work counts: a long job nine tenths done ranks like a short one
    done = _rank([job(0, 36_000.0, prog=0.9), job(1, 7200.0)], load=0.9)
    assert done.order[0] == 0
    # length leads priority: a lowest-priority 10-minute job before a top-priority 2-day one
    mixed = _rank([job(0, 2 * 86_400.0, prio=9), job(1, 600.0, prio=0)], load=0.9)
    assert mixed.order[0] == 1
    # ... and with w_short 0 the order is runtime-blind again (priority first when busy)
    blind = dataclasses.replace(CFG, w_short=0.0)
    mixed0 = _rank([job(0, 2 * 86_400.0, prio=9), job(1, 600.0, prio=0)], load=0.9, cfg=blind)
    assert mixed0.order[0] == 0
    with pytest.raises(ValueError):
        dataclasses.replace(CFG, short_scale_s=0.0)


def test_w_urgent_lets_a_deadline_that_can_still_be_met_lead_beside_length() -> None:
    """w_urgent adds w_urgent x urgency outside p x (...), only while the deadline can be met."""

    def job(i: int, est: float, deadline: float | None = None) -> PendingJob:
        return PendingJob(JobSpec(id=f"j{i}", est_runtime_s=est, deadline=deadline), 0.0)

    # j0: 2 h with a deadline it can just meet; j1: 30 min, no deadline; j2: lost already
    jobs = [job(0, 7200.0, deadline=7200.0), job(1, 1800.0), job(2, 7200.0, deadline=60.0)]
    off = _rank(jobs, load=0.9, cfg=dataclasses.replace(CFG, w_urgent=0.0))
    on = _rank(jobs, load=0.9, cfg=dataclasses.replace(CFG, w_urgent=5.0))
    assert off.order[0] == 1  # without it, length leads: the short job first
    assert on.order[0] == 0  # with it, the deadline that can still be met leads
    urgency_now = on.terms["urgency"]
    gain = on.scores - off.scores
    assert urgency_now[0] > 0 and gain[0] == pytest.approx(5.0 * urgency_now[0])
    assert urgency_now[2] == CFG.urgency_missed and gain[2] == 0.0  # lost: nothing added
    assert gain[1] == 0.0  # no deadline, nothing added
    with pytest.raises(ValueError):
        dataclasses.replace(CFG, w_urgent=-1.0)


def test_queue_columns_equal_list():
    rng = np.random.default_rng(1)
    jobs = [
        PendingJob(
            JobSpec(
                id=f"j{i}",
                tenant=f"t{i % 3}",
                priority=int(rng.integers(10)),
                deadline=float(rng.uniform(1e3, 1e5)) if i % 2 else None,
            ),
            float(rng.uniform(0, 1000)),
        )
        for i in range(30)
    ]
    q = PendingQueue(jobs)
    for jid in ("j3", "j17", "j29"):
        q.remove(jid)
    q.add(jobs[3])
    live = [j for j in jobs if j.spec.id not in ("j17", "j29")]
    a = _rank(list(q), now=2000.0)
    b = _rank(q, now=2000.0)
    assert [q[int(i)].spec.id for i in a.order] == [q[int(i)].spec.id for i in b.order]
    c = _rank(live, now=2000.0)
    assert sorted(np.round(c.scores, 12)) == sorted(np.round(b.scores, 12))


def test_config_is_printable_and_checked():
    d = CFG.describe()
    assert d["weights_high"]["priority"] == 0.6 and d["backfill"] is True
    with pytest.raises(ValueError):
        dataclasses.replace(CFG, aging_per_h=0.0)
