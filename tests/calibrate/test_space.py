"""The search space follows PolicyConfig: every field is bounded or excluded with a reason."""

from __future__ import annotations

import dataclasses

import pytest

from libs.calibrate import space
from libs.calibrate.study import config_of
from libs.policy.config import PolicyConfig


def test_every_field_of_the_config_is_bounded_or_excluded() -> None:
    space.check_covers()
    names = {n for n, _ in space.leaf_fields()}
    assert names == set(space.BOUNDS) | set(space.EXCLUDED)
    assert "low_load" in space.BOUNDS and "high_load" in space.BOUNDS  # regime thresholds
    assert "weights_high.deadline" in space.BOUNDS and "preempt.min_wait_s" in space.BOUNDS
    assert all(reason.strip() for reason in space.EXCLUDED.values())


def test_a_new_coefficient_without_a_bound_fails() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Grown(PolicyConfig):
        w_new_term: float = 0.5

    with pytest.raises(ValueError, match="w_new_term: no bound and no exclusion"):
        space.check_covers(Grown)


def test_a_bound_for_a_field_that_is_gone_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(space.BOUNDS, "w_gone", space.Bound(0.0, 1.0))
    with pytest.raises(ValueError, match="w_gone: not a field"):
        space.check_covers()


def test_the_defaults_are_a_point_of_the_space_and_give_the_default_config() -> None:
    assert config_of(space.default_params(), where="t") == PolicyConfig.default()


@pytest.mark.parametrize("end", ["low", "high"])
def test_every_corner_of_the_box_is_a_valid_config(end: str) -> None:
    params = {k: getattr(b, end) for k, b in space.BOUNDS.items()}
    params = {k: int(v) if space.kind_of(k) is int else float(v) for k, v in params.items()}
    cfg = config_of(params, where="corner")  # the records' own checks accept it
    assert cfg.low_load <= cfg.high_load


def test_regime_weights_are_scaled_to_sum_one() -> None:
    params = space.default_params() | {
        "weights_low.fair_share": 0.9,
        "weights_low.energy": 0.9,
        "weights_low.deadline": 0.0,
        "weights_low.priority": 0.0,
    }
    w = config_of(params, where="t").weights_low
    assert (w.fair_share, w.energy, w.deadline, w.priority) == pytest.approx((0.5, 0.5, 0, 0))
    zero = {k: 0.0 for k in params if k.startswith("weights_high.")}
    wh = config_of(params | zero, where="t").weights_high
    assert wh.priority == pytest.approx(0.25)  # all zero: equal weights


def test_a_bound_refuses_an_empty_or_bad_log_range() -> None:
    with pytest.raises(ValueError, match="low < high"):
        space.Bound(1.0, 1.0)
    with pytest.raises(ValueError, match="log scale"):
        space.Bound(0.0, 1.0, log=True)


def test_the_shipped_calibration_loads_and_lies_in_the_space() -> None:
    import json

    from libs.policy_io.policy_file import CALIBRATED_FILE, flatten, load_policy_file

    cfg = load_policy_file(CALIBRATED_FILE)
    assert cfg != PolicyConfig.default()
    for key, value in flatten(json.loads(CALIBRATED_FILE.read_text()), "t").items():
        b = space.BOUNDS[key]  # a shipped value is a coefficient the search may set
        assert b.low <= value <= b.high, key


@pytest.mark.parametrize("radius", [0.05, 0.15, 0.5])
def test_the_region_near_the_defaults_holds_them_inside_the_whole_ranges(radius: float) -> None:
    near = space.near_defaults(radius)
    d = space.default_params()
    assert set(near) == set(space.BOUNDS)
    for name, b in near.items():
        whole = space.BOUNDS[name]
        assert whole.low <= b.low <= d[name] <= b.high <= whole.high, name
        if space.kind_of(name) is int:
            assert b.low == int(b.low) and b.high == int(b.high) and b.low < b.high
        elif whole.log:  # radius of the decades on each side, unless a range end cuts it
            f = (whole.high / whole.low) ** radius
            assert b.high == pytest.approx(min(whole.high, d[name] * f))
        else:
            w = radius * (whole.high - whole.low)
            assert b.low == pytest.approx(max(whole.low, d[name] - w))
    # a narrower region sits inside a wider one; the whole space is radius 1
    wide = space.near_defaults(min(1.0, 2 * radius))
    assert all(wide[n].low <= b.low and b.high <= wide[n].high for n, b in near.items())
    assert space.near_defaults(1.0) == space.BOUNDS


def test_a_radius_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="--radius"):
        space.near_defaults(0.0)


def test_a_trial_of_a_region_stays_in_it() -> None:
    import optuna

    from libs.calibrate.study import suggest

    near = space.near_defaults(0.1)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(5):
        p = suggest(study.ask(), near)
        assert all(near[n].low <= v <= near[n].high for n, v in p.items())
    whole = suggest(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3)).ask())
    assert any(not (near[n].low <= v <= near[n].high) for n, v in whole.items())
