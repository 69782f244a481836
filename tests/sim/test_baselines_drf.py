"""Weighted DRF (libs.sim.baselines.drf), the policy registry's -np twins, and the one
checkpoint cost the runner gives every policy."""

from __future__ import annotations

import pytest

from libs.sim.baselines import POLICIES, make_policy, parse_policies
from libs.sim.baselines.drf import Drf
from libs.sim.engine import simulate
from tests.sim.helpers import FlatProfiles, job, node

NODES = [node("n0", gpus=4)]


def _gpus_by_tenant_at_start(weights: dict | None) -> dict[str, int]:  # type: ignore[type-arg]
    """Two tenants each queue six 1-GPU jobs at t=0 on 4 GPUs: who gets the first four?"""
    jobs = [job(f"{t}{i}", 0.0, 1_000, tenant=t) for t in ("a", "b") for i in range(6)]
    res = simulate(jobs, NODES, Drf(weights), FlatProfiles())
    got: dict[str, int] = {"a": 0, "b": 0}
    for j in res.jobs:
        if j.first_start_s == 0.0:
            got[j.spec.tenant] += 1
    return got


def test_plain_drf_splits_evenly() -> None:
    assert _gpus_by_tenant_at_start(None) == {"a": 2, "b": 2}


def test_a_tenant_of_weight_three_gets_three_times_the_dominant_share() -> None:
    assert _gpus_by_tenant_at_start({"a": 3.0}) == {"a": 3, "b": 1}


def test_weights_scale_shares_not_absolute_values() -> None:
    assert _gpus_by_tenant_at_start({"a": 6.0, "b": 2.0}) == {"a": 3, "b": 1}


def test_a_bad_weight_names_its_tenant() -> None:
    with pytest.raises(ValueError, match=r"weights\['b'\]"):
        Drf({"a": 1.0, "b": 0.0})
    with pytest.raises(ValueError, match=r"weights\['a'\]"):
        make_policy("drf", weights={"a": float("nan")})


def test_every_preempting_policy_has_a_twin_that_never_preempts() -> None:
    for name in ("tiresias", "gavel", "gavel-fifo", "las", "mosaic"):
        assert f"{name}-np" in POLICIES
        assert make_policy(f"{name}-np").name == f"{name}-np"
    assert getattr(make_policy("tiresias-np"), "move_step", None) is None
    assert make_policy("mosaic-np").cfg.preempt.enabled is False  # type: ignore[attr-defined]
    assert make_policy("mosaic-np").cfg.preempt.short_enabled is False  # type: ignore[attr-defined]
    assert getattr(make_policy("mosaic-np"), "move_step", None) is None
    assert parse_policies("gavel,gavel-np") == ["gavel", "gavel-np"]
    with pytest.raises(ValueError, match="unknown policy 'drf-np'"):
        parse_policies("drf-np")


def test_the_runner_charges_every_policy_the_configured_checkpoint_cost(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from libs.sim.runner import run_simulation

    got = {}
    for cost in ("0", "600"):
        r = run_simulation(
            "synthetic:150",
            "counts:v100-32gb=16",
            0,
            ["tiresias"],
            None,
            seed=1,
            load=3.0,
            traces_dir=tmp_path / "absent",
            overrides=[f"preempt.checkpoint_cost_s={cost}"],
        )
        got[cost] = r["policies"]["tiresias"]
    assert got["0"]["preemptions"] > 0
    assert got["600"]["jct_mean_s"] > got["0"]["jct_mean_s"]


def test_drf_weights_from_the_command_line_reach_drf_and_the_results(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--drf-weights``: the runner hands them to drf and records them in results.json; a
    malformed one is refused with a message naming the flag (exit 2), nothing written."""
    import json

    from libs.client.cli import main as mosaic_main
    from libs.sim.runner import main
    from libs.sim.runner_args import parse_weights

    assert parse_weights("a=2, b=0.5") == {"a": 2.0, "b": 0.5}
    for bad in ("a", "a=0", "=2", "a=x", "a=inf"):
        with pytest.raises(ValueError, match="--drf-weights"):
            parse_weights(bad)
    argv = ["--trace", "synthetic:40", "--cluster", "demo", "--policies", "drf"]
    out = tmp_path / "w"
    assert main([*argv, "--drf-weights", "tenant-a=3", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["drf_weights"] == {"tenant-a": 3.0}
    assert main([*argv, "--drf-weights", "tenant-a=-1", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x" / "results.json").exists()
    sim = ["sim", "--trace", "synthetic:40", "--cluster", "demo", "--policies", "drf"]
    assert mosaic_main([*sim, "--drf-weights", "oops", "--out", str(tmp_path / "y")]) == 2


def test_the_simulator_asks_for_moves_whenever_some_move_rule_is_on() -> None:
    """The adapter drops the engine's per-instant move step only when every rule
    ``core_moves.preempt_step`` runs is off: with the priority and burst rules off, the
    short-wait rule alone still moves jobs (as the live placer's tick would); with it, grow
    and boot protection off too, none does."""
    import dataclasses

    from libs.policy.config import PolicyConfig
    from libs.sim.baselines.mosaic import Mosaic

    cfg = PolicyConfig.default()
    only_short = dataclasses.replace(
        cfg, preempt=dataclasses.replace(cfg.preempt, enabled=False, burst_enabled=False)
    )
    assert getattr(Mosaic(only_short), "move_step", None) is not None
    none = dataclasses.replace(
        only_short,
        preempt=dataclasses.replace(
            only_short.preempt, short_enabled=False, grow_enabled=False, boot_enabled=False
        ),
    )
    assert getattr(Mosaic(none), "move_step", None) is None
