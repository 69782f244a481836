"""The objective: weighted ratios to the best peer, floors, the starvation penalty, its parsing."""

from __future__ import annotations

import math

import pytest

from libs.calibrate.objective import MISSING_RATIO, Objective, parse_objective


def _m(high_s: float, jct_s: float, met: float, kwh: float, starve_s: float, **kw) -> dict:
    """A run's metrics as run_simulation writes them (own window = common window)."""
    return {
        "queue_delay_high_mean_s": high_s,
        "jct_mean_s": jct_s,
        "deadline_attainment": met,
        "energy_kwh": kwh,
        "energy_own_window_kwh": kwh,
        "energy_active_kwh": kwh - 10.0,
        "energy_idle_kwh": 10.0,
        "idle_power_kw": 1.0,
        "end_idle_power_kw": 1.0,
        "makespan_s": 36_000.0,
        "tariff_usd_per_kwh": 0.1,
        "starvation_max_wait_s": starve_s,
        **kw,
    }


PEERS = {
    "fifo": _m(1000.0, 8000.0, 0.5, 200.0, 7200.0),
    "drf": _m(2000.0, 4000.0, 0.8, 100.0, 3600.0),
}


def test_each_term_is_a_ratio_to_the_best_peer_on_that_term() -> None:
    score, terms = Objective().score(_m(500.0, 4000.0, 0.9, 150.0, 3600.0), PEERS)
    assert terms["queue_delay_high_mean_s"]["ratio"] == pytest.approx(0.5)
    assert terms["jct_mean_s"]["ratio"] == pytest.approx(1.0)
    assert terms["deadline_miss"]["ratio"] == pytest.approx(0.1 / 0.2)
    assert terms["energy_kwh"]["ratio"] == pytest.approx(1.5)
    assert terms["starvation"]["penalty"] == 0.0  # 3,600 s <= 2 x 3,600 s
    assert score == pytest.approx((0.5 + 1.0 + 0.5 + 1.5) / 4)


def test_weights_move_the_score_and_a_floor_caps_tiny_peer_values() -> None:
    run = _m(600.0, 8000.0, 0.8, 100.0, 0.0)
    peers = {"fifo": _m(5.0, 4000.0, 0.8, 100.0, 0.0)}  # a peer with almost no wait
    only = Objective(weights={"queue_delay_high_mean_s": 1.0}, starvation_weight=0.0)
    assert only.score(run, peers)[0] == pytest.approx(600.0 / 60.0)  # floor 60 s, not 5 s
    jct = Objective(weights={"jct_mean_s": 3.0, "energy_kwh": 1.0}, starvation_weight=0.0)
    assert jct.score(run, peers)[0] == pytest.approx((3 * 2.0 + 1.0) / 4)


def test_starvation_penalty_grows_past_the_bound() -> None:
    obj = Objective(weights={"jct_mean_s": 1.0}, starvation_weight=0.5)
    base, _ = obj.score(_m(0, 4000.0, 1, 100.0, 7200.0), PEERS)
    worse, terms = obj.score(_m(0, 4000.0, 1, 100.0, 4 * 7200.0), PEERS)
    assert terms["starvation"]["bound_s"] == 7200.0  # 2 x the best peer's 3,600 s
    assert worse - base == pytest.approx(0.5 * (4.0 - 1.0))
    fixed = Objective(weights={"jct_mean_s": 1.0}, starvation_bound_s=100.0)
    assert fixed.score(_m(0, 4000.0, 1, 100.0, 300.0), PEERS)[1]["starvation"]["bound_s"] == 100.0


def test_energy_is_each_runs_own_and_does_not_move_with_the_run_s_makespan() -> None:
    obj = Objective(weights={"energy_kwh": 1.0}, starvation_weight=0.0)
    short = _m(0, 4000.0, 1, 150.0, 0.0)
    long_run = short | {"makespan_s": 36_000.0 + 7200.0}
    _, a = obj.score(short, PEERS)
    _, b = obj.score(long_run, PEERS)
    # the simulator's energy_kwh is over the trace's window already: the best peer stays 100
    assert a["energy_kwh"] == b["energy_kwh"] == {"value": 150.0, "best_peer": 100.0, "ratio": 1.5}


def test_the_default_config_s_own_starvation_caps_the_bound() -> None:
    obj = Objective(weights={"jct_mean_s": 1.0}, starvation_weight=0.5)
    default = _m(0, 4000.0, 1, 100.0, 5000.0)
    # peers: 2 x 3,600 s = 7,200 s; the default waited 5,000 s, which caps it
    assert obj.starvation_bound_s_of(PEERS) == 7200.0
    assert obj.starvation_bound_s_of(PEERS, default) == 5000.0
    run = _m(0, 4000.0, 1, 100.0, 10_000.0)
    _, terms = obj.score(run, PEERS, default)
    assert terms["starvation"] == {"max_wait_s": 10_000.0, "bound_s": 5000.0, "penalty": 0.5}
    assert obj.score(default, PEERS, default)[1]["starvation"]["penalty"] == 0.0
    # a default that starves longer than the peers allow does not loosen the bound
    assert obj.starvation_bound_s_of(PEERS, _m(0, 1, 1, 1, 50_000.0)) == 7200.0
    off = Objective(weights={"jct_mean_s": 1.0}, starvation_vs_default=0.0)
    assert off.starvation_bound_s_of(PEERS, default) == 7200.0
    tiny = _m(0, 1, 1, 1, 60.0)  # never below the floor of an hour
    assert obj.starvation_bound_s_of(PEERS, tiny) == 3600.0


def test_a_term_nobody_measured_is_left_out_and_a_missing_one_counts_ten() -> None:
    obj = Objective(weights={"deadline_miss": 1.0, "jct_mean_s": 1.0}, starvation_weight=0.0)
    no_deadlines = {n: p | {"deadline_attainment": None} for n, p in PEERS.items()}
    score, terms = obj.score(_m(0, 4000.0, math.nan, 1, 0), no_deadlines)
    assert terms["deadline_miss"]["ratio"] is None and score == pytest.approx(1.0)
    score, _ = obj.score(_m(0, 4000.0, math.nan, 1, 0), PEERS)
    assert score == pytest.approx((MISSING_RATIO + 1.0) / 2)


def test_parse_objective_json_and_pairs() -> None:
    a = parse_objective('{"jct_mean_s": 2, "starvation_weight": 0}')
    b = parse_objective("jct_mean_s=2,starvation_weight=0")
    assert a == b and a.weights == {"jct_mean_s": 2.0} and a.starvation_weight == 0.0
    assert parse_objective(None) == Objective()
    assert Objective().as_dict()["lower_is_better"] is True


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("jct=1", "unknown key 'jct'"),
        ('{"jct_mean_s": "lots"}', "jct_mean_s: 'lots' is not a number"),
        ("jct_mean_s=-1", "jct_mean_s: weight must be"),
        ("jct_mean_s=0", "at least one term"),
        ("starvation_bound_s=0", "starvation_bound_s"),
        ("starvation_vs_default=-1", "starvation_vs_default"),
        ("{bad", "not JSON"),
        ("jct_mean_s", "KEY=VALUE"),
    ],
)
def test_a_bad_objective_names_the_key(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match="--objective") as err:
        parse_objective(text)
    assert needle in str(err.value)
