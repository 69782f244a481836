"""policy.json: a round trip, and a bad field is an error naming it (sim, runner, up, services)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from libs.policy.config import PolicyConfig
from libs.policy_io.overrides import apply_overrides, apply_values
from libs.policy_io.policy_file import (
    ENV,
    dump_policy,
    live_policy,
    load_policy_file,
    parse_policy,
    write_policy_file,
)


def _changed() -> PolicyConfig:
    d = PolicyConfig.default()
    return dataclasses.replace(
        d,
        aging_per_h=0.0413,
        high_load=0.9,
        weights_high=dataclasses.replace(d.weights_high, deadline=0.4, priority=0.45),
        preempt=dataclasses.replace(d.preempt, protect_priority=7, min_wait_s=123.5),
    )


def test_round_trip_writes_only_the_differences(tmp_path: Path) -> None:
    cfg = _changed()
    path = write_policy_file(tmp_path / "policy.json", cfg)
    tree = json.loads(path.read_text())
    assert tree == {
        "aging_per_h": 0.0413,
        "high_load": 0.9,
        "preempt": {"min_wait_s": 123.5, "protect_priority": 7},
        "weights_high": {"deadline": 0.4, "priority": 0.45},
    }
    assert load_policy_file(path) == cfg
    assert json.loads(dump_policy(PolicyConfig.default())) == {}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"agin_per_h": 0.1}', "unknown PolicyConfig field 'agin_per_h'"),
        ('{"preempt": {"min_wiat_s": 1}}', "unknown PreemptConfig field 'min_wiat_s'"),
        ('{"aging_per_h": "fast"}', "aging_per_h: 'fast' is not a float"),
        ('{"preempt": {"protect_priority": 7.5}}', "preempt.protect_priority: 7.5 is not a int"),
        ('{"backfill": 1}', "backfill: 1 is not a bool"),
        ('{"preempt": 3}', "preempt' is a record"),
        ('{"low_load": 0.9}', "low_load <= high_load"),
        ("[1, 2]", "must be a JSON object"),
        ("{nope", "not JSON"),
    ],
)
def test_a_bad_file_is_an_error_naming_the_field(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match="policy file") as err:
        parse_policy(text)
    assert needle in str(err.value)


def test_related_fields_may_move_together_in_any_order() -> None:
    # high_load below the default low_load would fail if checked one field at a time
    cfg = apply_values({"high_load": 0.4, "low_load": 0.3})
    assert (cfg.low_load, cfg.high_load) == (0.3, 0.4)
    same, done = apply_overrides(["high_load=0.4", "low_load=0.3"])
    assert same == cfg and done == {"high_load": 0.4, "low_load": 0.3}


def test_set_applies_on_top_of_a_policy_file() -> None:
    base = _changed()
    cfg, _ = apply_overrides(["aging_per_h=0.05"], base)
    assert cfg.aging_per_h == 0.05 and cfg.preempt.protect_priority == 7


def test_live_services_load_the_file_named_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert live_policy() == PolicyConfig.default()
    path = write_policy_file(tmp_path / "p.json", _changed())
    monkeypatch.setenv(ENV, str(path))
    assert live_policy() == _changed()
    from services.defrag.service import Defragmenter
    from services.placer.service import Placer
    from services.scorer.service import Scorer
    from services.thermal.service import ThermalService

    # each service that decides reads the file when started without a policy of its own
    assert Scorer(None, None, None).policy == _changed()  # type: ignore[arg-type]
    assert Placer(None, None, None, None).policy == _changed()  # type: ignore[arg-type]
    assert Defragmenter(None, None, None).policy == _changed()  # type: ignore[arg-type]
    assert ThermalService(None, None, None).policy == _changed()  # type: ignore[arg-type]
    monkeypatch.setenv(ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"missing\.json"):
        live_policy()


def test_mosaic_up_hands_the_file_to_every_service(tmp_path: Path) -> None:
    from libs.client.up import _policy_env

    assert _policy_env(None) == {}
    assert _policy_env(Path("p.json")) == {ENV: str(Path("p.json").resolve())}


def test_mosaic_sim_and_up_refuse_a_bad_policy_file(tmp_path: Path) -> None:
    from libs.client.cli import main
    from libs.sim.runner import main as runner_main

    bad = tmp_path / "bad.json"
    bad.write_text('{"w_sped": 2}')
    assert main(["sim", "--trace", "synthetic:10", "--policy-file", str(bad)]) == 2
    assert runner_main(["--trace", "synthetic:10", "--policy-file", str(bad)]) == 2
    assert main(["up", "--policy-file", str(bad), "--duration", "1"]) == 2
