"""The thermal guard's definition (libs.policy.stages.thermal) and the thermal model
(libs.policy.thermal_model): unit tests and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.policy.config import PolicyConfig, ThermalConfig
from libs.policy.stages.thermal import HoldAction, MigrateAction, NodeJob, ThermalGuard
from libs.policy.thermal_model import HEAT_LABEL, ThermalModel, heat_factor
from proto.nodes import NodeSpec

JOBS = (
    NodeJob("cool-job", 1, (0,)),
    NodeJob("hot-job", 1, (2,)),
    NodeJob("pinned", 1, (3,)),  # not movable
    NodeJob("warm-job", 2, (1,)),
)


def feed(guard: ThermalGuard, temps: list[list[float]], *, step_s: float = 5.0, **kw):
    out = []
    for i, t in enumerate(temps):
        out.append(guard.observe("n0", t, 100.0 + i * step_s, **kw))
    return out


def movable(job: NodeJob) -> bool:
    return job.job_id != "pinned"


# --- the guard ------------------------------------------------------------------------------


def test_a_window_of_hot_samples_holds_the_node_and_migrates_hottest_first() -> None:
    guard = ThermalGuard(ThermalConfig(max_moves_per_window=2))
    hot = [60.0, 80.0, 92.0, 95.0]
    steps = feed(guard, [hot, hot, hot], jobs=JOBS, movable=movable)
    assert steps[0] == [] and steps[1] == []  # one or two samples are not a trend
    hold, *moves = steps[2]
    assert isinstance(hold, HoldAction) and hold.on and hold.node == "n0"
    assert hold.detected_s == 100.0  # the first over-threshold sample of the window
    assert hold.ttl_s >= 60.0
    # GPU 3 (95 C) is the hottest, but its job may not move: the next hottest go, two at most
    assert [m.job_id for m in moves] == ["hot-job", "warm-job"]
    assert all(isinstance(m, MigrateAction) and m.detected_s == 100.0 for m in moves)
    assert moves[0].gpu == 2 and moves[0].temp_c == 92.0
    assert guard.is_hot("n0")


def test_hold_is_renewed_each_window_and_remaining_jobs_move_then() -> None:
    guard = ThermalGuard(ThermalConfig(max_moves_per_window=1))
    hot = [90.0, 90.0, 91.0, 70.0]
    steps = feed(guard, [hot] * 6, jobs=JOBS, movable=movable)
    assert [type(a).__name__ for a in steps[2]] == ["HoldAction", "MigrateAction"]
    assert steps[2][1].job_id == "hot-job"
    assert steps[3] == [] and steps[4] == []
    renew, move = steps[5]
    assert renew.on and renew.renewal
    # the next hottest not asked yet (GPUs 0 and 1 tie at 90 C: job id order)
    assert move.job_id == "cool-job"


def test_a_job_asked_once_is_not_asked_again_in_the_same_hot_spell() -> None:
    guard = ThermalGuard(ThermalConfig(max_moves_per_window=4))
    hot = [90.0, 90.0, 91.0, 70.0]
    steps = feed(guard, [hot] * 9, jobs=JOBS, movable=movable)
    asked = [a.job_id for s in steps for a in s if isinstance(a, MigrateAction)]
    assert sorted(asked) == ["cool-job", "hot-job", "warm-job"]


def test_no_migration_once_the_node_is_below_threshold() -> None:
    guard = ThermalGuard(ThermalConfig(max_moves_per_window=1))
    hot, warm = [90.0] * 4, [80.0] * 4  # warm: below 85, above 75 (held, nothing moves)
    steps = feed(guard, [hot, hot, hot, warm, warm, warm, warm], jobs=JOBS, movable=movable)
    moves = [a for s in steps for a in s if isinstance(a, MigrateAction)]
    assert len(moves) == 1
    assert guard.is_hot("n0")  # not released: 80 C is above clear_c


def test_release_needs_a_window_below_clear() -> None:
    guard = ThermalGuard(ThermalConfig())
    hot, cold = [90.0] * 2, [60.0] * 2
    steps = feed(guard, [hot, hot, hot, cold, cold, [76.0, 60.0], cold, cold, cold])
    assert steps[2][0].on
    assert all(s == [] or s[0].renewal for s in steps[3:8])
    (release,) = steps[8]
    assert isinstance(release, HoldAction) and not release.on
    assert not guard.is_hot("n0")


def test_the_window_is_one_gpus() -> None:
    """Spikes taking turns on different GPUs are noise, not a hot GPU."""
    guard = ThermalGuard()
    turns = [[90.0, 60.0, 60.0], [60.0, 90.0, 60.0], [60.0, 60.0, 90.0]] * 3
    assert all(step == [] for step in feed(guard, turns))
    assert not guard.is_hot("n0")


def test_stale_or_repeated_samples_are_ignored() -> None:
    guard = ThermalGuard()
    for _ in range(5):
        assert guard.observe("n0", [99.0], 10.0) == [] or not guard.is_hot("n0")
    assert not guard.is_hot("n0")  # one sample at one time, however often it is delivered
    guard.observe("n0", [99.0], 15.0)
    assert guard.observe("n0", [99.0], 12.0) == []


def test_ttl_follows_the_sample_cadence() -> None:
    """At a fast demo clock 5 wall seconds are 3,000 Mosaic seconds: the TTL must cover that."""
    guard = ThermalGuard(ThermalConfig(hold_ttl_windows=4, window=3))
    acts = [guard.observe("n0", [99.0], t) for t in (0.0, 3000.0, 6000.0)]
    assert acts[2][0].ttl_s == pytest.approx(4 * 3 * 3000.0)


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="clear_c"):
        ThermalConfig(threshold_c=80, clear_c=80)
    with pytest.raises(ValueError, match="window"):
        ThermalConfig(window=0)
    cfg = PolicyConfig()
    assert cfg.thermal.threshold_c == cfg.thermal_max_c  # the filter and the guard agree
    assert cfg.describe()["thermal"]["window"] == 3


# --- properties -----------------------------------------------------------------------------

temps = st.floats(min_value=20.0, max_value=110.0, allow_nan=False)
node_temps = st.lists(st.lists(temps, min_size=4, max_size=4), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(node_temps, st.integers(1, 4), st.integers(0, 4), st.sets(st.integers(0, 3)))
def test_never_migrates_a_job_the_predicate_refuses(samples, window, per_window, refused):
    jobs = [NodeJob(f"j{g}", 1, (g,)) for g in range(4)]
    guard = ThermalGuard(ThermalConfig(window=window, max_moves_per_window=per_window))
    spell: list[MigrateAction] = []  # the migrations of the current hot spell
    for i, t in enumerate(samples):
        acts = guard.observe("n0", t, float(i), jobs, lambda j: int(j.job_id[1:]) not in refused)
        if any(isinstance(a, HoldAction) and a.on and not a.renewal for a in acts):
            spell = []
        moves = [a for a in acts if isinstance(a, MigrateAction)]
        assert len(moves) <= per_window
        assert not {int(m.job_id[1:]) for m in moves} & refused
        spell += moves
        assert len({m.job_id for m in spell}) == len(spell)  # asked at most once a spell


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=-8.0, max_value=8.0), min_size=1, max_size=200),
    st.integers(1, 5),
)
def test_no_flapping_under_noise_around_the_threshold(noise, window):
    """Readings jittering by +-8 C around 85 C never fall below 75 C: once held, the node
    stays held (no release), and it is held at most once."""
    guard = ThermalGuard(ThermalConfig(window=window))
    ons = offs = 0
    for i, n in enumerate(noise):
        for a in guard.observe("n0", [85.0 + n, 60.0], float(i)):
            if isinstance(a, HoldAction) and not a.renewal:
                ons += a.on
                offs += not a.on
    assert offs == 0 and ons <= 1


@settings(max_examples=100, deadline=None)
@given(node_temps, st.integers(1, 4))
def test_holds_alternate_and_need_a_full_window(samples, window):
    """A hold follows `window` consecutive over-threshold samples; a release follows `window`
    consecutive samples below clear; on and off alternate, starting with on."""
    cfg = ThermalConfig(window=window)
    guard = ThermalGuard(cfg)
    state = False
    for i, t in enumerate(samples):
        for a in guard.observe("n0", t, float(i)):
            if isinstance(a, HoldAction) and not a.renewal:
                assert a.on != state
                state = a.on
                recent = samples[max(0, i - window + 1) : i + 1]
                assert len(recent) == window
                if a.on:  # one GPU over the threshold in every sample of the window
                    assert any(all(s[g] >= cfg.threshold_c for s in recent) for g in range(4))
                else:
                    assert all(max(s) < cfg.clear_c for s in recent)


# --- the model ------------------------------------------------------------------------------


def test_model_heats_toward_steady_state_and_cools_to_ambient() -> None:
    m = ThermalModel()
    t = np.array([35.0])
    for _ in range(100):
        t = m.step(t, 400.0, 5.0, max_power_w=400.0)
    assert t[0] == pytest.approx(m.full_load_c, abs=0.01)
    for _ in range(100):
        t = m.step(t, 0.0, 5.0, max_power_w=400.0)
    assert t[0] == pytest.approx(m.ambient_c, abs=0.01)


@settings(max_examples=100, deadline=None)
@given(
    st.floats(30.0, 100.0),
    st.floats(0.0, 400.0),
    st.floats(0.1, 600.0),
    st.integers(1, 20),
    st.floats(0.5, 2.0),
)
def test_model_steps_compose(start_c, power_w, dt_s, n, heat):
    """n steps of dt equal one step of n x dt (constant power): any sample cadence gives the
    same temperatures at the same instants, and a step never overshoots the steady state."""
    m = ThermalModel()
    t = np.array([start_c])
    for _ in range(n):
        t = m.step(t, power_w, dt_s, max_power_w=400.0, heat=heat)
    once = m.step(np.array([start_c]), power_w, n * dt_s, max_power_w=400.0, heat=heat)
    assert t[0] == pytest.approx(once[0], abs=1e-6)
    steady = float(m.steady_c(power_w, 400.0, heat))
    lo, hi = sorted((start_c, steady))
    assert lo - 1e-9 <= t[0] <= hi + 1e-9


def test_heat_profile_from_label_or_override() -> None:
    spec = NodeSpec(
        id="a100-0",
        gpu_model="a100-80gb",
        gpu_count=8,
        gpu_mem_gb=80,
        host_mem_gb=1,
        cpus=1,
        idle_power_w=55,
        max_power_w=400,
    )
    assert heat_factor(spec) == 1.0
    hot = NodeSpec(**{**_fields(spec), "labels": {HEAT_LABEL: "1.4"}})
    assert heat_factor(hot) == 1.4 and heat_factor(spec, 1.6) == 1.6
    m = ThermalModel()
    assert float(m.steady_c(365.0, 400.0, 1.4)) > 85.0 > float(m.steady_c(365.0, 400.0, 1.0))
    bad = NodeSpec(**{**_fields(spec), "labels": {HEAT_LABEL: "hot"}})
    with pytest.raises(ValueError, match=r"a100-0.*mosaic/heat"):
        heat_factor(bad)
    with pytest.raises(ValueError, match=r"\[0.1, 5"):
        heat_factor(spec, math.inf)


def _fields(spec: NodeSpec) -> dict:
    return {f: getattr(spec, f) for f in spec.__struct_fields__}
