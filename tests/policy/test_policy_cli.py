"""``mosaic policy`` (issue 16): the weights and day/night shifts in force now and at another
time, from the defaults, ``--policy-file`` or ``--set``, without a running stack."""

from __future__ import annotations

import json

import pytest

from libs.client.cli import main

DAY0 = 20 * 86_400.0  # a midnight UTC


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["policy", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_policy_shows_now_and_the_given_hour(capsys, monkeypatch) -> None:
    monkeypatch.setenv("MOSAIC_CLOCK_EPOCH", str(DAY0 + 10 * 3600))  # the Mosaic clock: 10:00
    monkeypatch.setenv("MOSAIC_CLOCK_MODE", "stepped")  # time stands still
    rep = run(capsys, "--set", "calendar.enabled=true", "--at", "21:30")
    now, at = rep["moments"]
    assert (now["period"], at["period"]) == ("day", "night")
    assert now["local_time"].startswith("1970-01-21T10:00")
    assert at["local_time"] == "1970-01-21T21:30+00:00"
    assert (now["inference_boost"], now["headroom_share"]) == (0.5, 0.1)
    assert (at["training_boost"], at["w_speed"]) == (0.25, 1.5)
    assert now["next_switch_s"] == DAY0 + 20 * 3600
    assert rep["calendar"]["night"]["hours"] == "20:00-08:00"


def test_policy_reads_a_policy_file_and_says_when_the_calendar_is_off(
    capsys, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("MOSAIC_CLOCK_EPOCH", str(DAY0))
    monkeypatch.setenv("MOSAIC_CLOCK_MODE", "stepped")  # time stands still
    assert run(capsys, "--time", "1970-01-21T12:00")["moments"][1]["period"] == "(calendar off)"
    f = tmp_path / "policy.json"
    f.write_text(json.dumps({"calendar": {"enabled": True, "day": {"hours": "06:00-18:00"}}}))
    rep = run(capsys, "--policy-file", str(f), "--time", "1970-01-21T17:59")
    assert rep["moments"][1]["period"] == "day" and rep["moments"][0]["period"] == "night"


def test_policy_refuses_bad_input_naming_it(capsys) -> None:
    assert main(["policy", "--at", "25:00"]) == 2
    assert "--at" in capsys.readouterr().err
    assert main(["policy", "--set", "calendar.day.hours=noon"]) == 2
    assert "calendar.day.hours" in capsys.readouterr().err


def test_mosaic_explain_shows_the_policy_a_wait_decision_was_taken_under(monkeypatch) -> None:
    """A wait decision's record carries the period and what it sets under ``mosaic policy``'s
    names (``daynight.in_force``); ``mosaic explain`` prints them."""
    from rich.console import Console

    from libs.client import cli_explain
    from libs.policy.config import PolicyConfig
    from libs.policy.daynight import effective_policy, in_force
    from libs.policy_io.overrides import apply_overrides

    cfg, _ = apply_overrides(["calendar.enabled=true"], PolicyConfig.default())
    eff, period = effective_policy(cfg, DAY0 + 21 * 3600)
    record = in_force(eff, "balanced")
    assert period == "night" and record["w_speed"] == 1.5 and record["training_boost"] == 0.25
    assert record["w_fair_share"] == cfg.weights("balanced").fair_share
    monkeypatch.setattr(cli_explain, "out", Console(record=True, width=400))
    cli_explain._print_wait({"rank": 1, "queued": 1, "period": period, "policy": record})
    text = cli_explain.out.export_text()
    assert "policy in force: period night" in text and "w_speed 1.500" in text
