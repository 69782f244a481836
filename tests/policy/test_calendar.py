"""The day/night calendar (issue 16): periods, wrap past midnight, the switch at the exact
minute, time zones, validation that names the field, and ``effective_policy``."""

from __future__ import annotations

import dataclasses
import datetime as dt

import numpy as np
import pytest

from libs.policy.calendar import CalendarConfig, Period, next_switch_s, period_at
from libs.policy.config import PolicyConfig
from libs.policy.daynight import DayNight, effective_policy, headroom_gpus, holds_off, kind_boost
from libs.policy_io.overrides import apply_overrides

H = 3600.0
DAY0 = 20 * 86_400.0  # a midnight UTC (1970-01-21)


def cal(**kw) -> CalendarConfig:
    return CalendarConfig(enabled=True, **kw)


def test_day_runs_from_its_start_included_to_its_end_excluded() -> None:
    c = cal()
    assert period_at(c, DAY0 + 8 * H - 0.001) == "night"
    assert period_at(c, DAY0 + 8 * H) == "day"  # the switch at the exact minute
    assert period_at(c, DAY0 + 20 * H - 0.001) == "day"
    assert period_at(c, DAY0 + 20 * H) == "night"
    assert period_at(c, DAY0) == "night" and period_at(c, DAY0 + 12 * H) == "day"


def test_a_day_that_wraps_past_midnight() -> None:
    c = cal(day=Period(hours="22:00-06:00", inference_boost=0.5))
    assert [period_at(c, DAY0 + h * H) for h in (21.99, 22, 23.5, 0, 5.99, 6, 12)] == [
        "night", "day", "day", "day", "day", "night", "night",
    ]  # fmt: skip
    assert c.night_hours() == "06:00-22:00"
    assert next_switch_s(c, DAY0 + 23 * H) == DAY0 + 30 * H  # 06:00 the next morning


def test_the_next_switch_is_the_next_boundary() -> None:
    c = cal()
    assert next_switch_s(c, DAY0 + 7 * H) == DAY0 + 8 * H
    assert next_switch_s(c, DAY0 + 8 * H) == DAY0 + 20 * H  # strictly after
    assert next_switch_s(c, DAY0 + 21 * H) == DAY0 + 32 * H


def test_the_hours_are_local_time_in_the_calendar_zone() -> None:
    c = cal(timezone="Europe/Paris")  # UTC+1 in winter, UTC+2 in summer
    winter = dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()
    summer = dt.datetime(2026, 7, 1, tzinfo=dt.UTC).timestamp()
    assert period_at(c, winter + 6.99 * H) == "night" and period_at(c, winter + 7 * H) == "day"
    assert period_at(c, summer + 5.99 * H) == "night" and period_at(c, summer + 6 * H) == "day"
    assert next_switch_s(c, winter) == winter + 7 * H


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["calendar.day.hours=8-20"], "calendar.day.hours"),
        (["calendar.day.hours=08:00-25:00"], "calendar.day.hours"),
        (["calendar.day.hours=08:00-08:00"], "calendar.day.hours"),
        (["calendar.night.hours=19:00-07:00"], "calendar.night.hours"),
        (["calendar.day.headroom_share=1"], "calendar.day.headroom_share"),
        (["calendar.night.inference_boost=-1"], "calendar.night.inference_boost"),
        (["calendar.night.speed_weight_factor=0"], "calendar.night.speed_weight_factor"),
        (["calendar.timezone=Mars/Olympus"], "calendar.timezone"),
        (["calendar.active=noon"], "calendar.active"),
    ],
)
def test_a_bad_calendar_is_refused_naming_the_field(sets: list[str], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        apply_overrides(sets)


def test_night_hours_given_must_be_the_rest_of_the_day() -> None:
    c = cal(night=Period(hours="20:00-08:00"))
    assert period_at(c, DAY0 + 21 * H) == "night"


def test_effective_policy_applies_the_period_and_is_neutral_when_off() -> None:
    base = PolicyConfig.default()
    assert effective_policy(base, DAY0 + 12 * H) == (base, "")  # off by default
    on = dataclasses.replace(base, calendar=cal())
    day, name = effective_policy(on, DAY0 + 12 * H)
    assert name == "day" and day.calendar.active == "day"
    assert day.warm_reserve_frac == 0.1 and day.w_speed == base.w_speed
    night, name = effective_policy(on, DAY0 + 22 * H)
    assert name == "night" and night.w_speed == pytest.approx(1.5 * base.w_speed)
    assert night.warm_reserve_frac == base.warm_reserve_frac
    assert effective_policy(on, DAY0 + 12 * H)[0] == day  # pure: same time, equal config
    # the configured record is inert: only an active period changes a stage
    assert kind_boost(np.array([1.0, 0.0]), on) is None and headroom_gpus(100, on) == 0


def test_the_periods_shift_the_rank_and_the_headroom() -> None:
    on = dataclasses.replace(PolicyConfig.default(), calendar=cal())
    day, _ = effective_policy(on, DAY0 + 12 * H)
    night, _ = effective_policy(on, DAY0 + 22 * H)
    kinds = np.array([1.0, 0.0])  # inference, training
    assert kind_boost(kinds, day).tolist() == [0.5, 0.0]
    assert kind_boost(kinds, night).tolist() == [0.0, 0.25]
    assert headroom_gpus(48, day) == 5 and headroom_gpus(48, night) == 0  # 10%, rounded up
    assert holds_off("training", 1, 5, 5) and not holds_off("training", 1, 6, 5)
    assert holds_off("training", 0.5, 5, 5)  # a fraction takes a whole GPU out of the free
    assert not holds_off("inference", 4, 5, 5)


def test_daynight_gives_one_config_object_per_period() -> None:
    """The rank epoch keys on the config's identity: the same period, the same object."""
    dn = DayNight(dataclasses.replace(PolicyConfig.default(), calendar=cal()))
    a, _ = dn.at(DAY0 + 9 * H)
    b, _ = dn.at(DAY0 + 19 * H)
    c, name = dn.at(DAY0 + 21 * H)
    assert a is b and c is not a and name == "night"
    assert dn.next_switch_s(DAY0 + 9 * H) == DAY0 + 20 * H
    off = DayNight(PolicyConfig.default())
    assert off.at(DAY0)[0] is off.base and off.next_switch_s(DAY0) is None
