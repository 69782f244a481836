"""``mosaic calibrate`` end to end on a tiny synthetic trace: the report, the file, resuming."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libs.calibrate.evaluate import Setup, open_dir
from libs.calibrate.objective import Objective
from libs.calibrate.report import calibrate
from libs.calibrate.space import default_params
from libs.calibrate.study import Plan, open_study
from libs.policy.config import PolicyConfig
from libs.policy_io.policy_file import load_policy_file, write_policy_file

SETUP = Setup(trace="synthetic:120", cluster="seed", gpus=32, objective=Objective().as_dict())


def test_calibrate_writes_the_report_and_resumes_the_trial_count(tmp_path: Path) -> None:
    out = tmp_path / "cal"
    seen: list[tuple[int, int]] = []
    report = calibrate(Plan(SETUP, out, trials=2), lambda d, t, _b: seen.append((d, t)))
    for key in ("objective", "train", "holdout", "trials", "wall_s"):
        assert key in report
    assert json.loads((out / "report.json").read_text())["trials"] == report["trials"] == 2
    for part in ("train", "holdout"):
        assert set(report[part]) >= {"default", "calibrated"}
    assert report["train"]["calibrated"] <= report["train"]["default"]  # trial 0 is the default
    assert seen[-1] == (2, 2) and seen[0][0] == 0
    cfg = load_policy_file(out / "policy.json")
    assert report["changed"] == json.loads(json.dumps(_flat(out / "policy.json")))
    study = open_study(out, 0)
    first = {t.number: t.value for t in study.trials}
    assert sorted(first) == [0, 1]
    assert study.trials[0].params == default_params()  # the study starts at the defaults
    open_study(out, 0).ask()  # a trial left running, as by a run killed mid-trial
    # resumed with the same folder: the count goes on, the first trials are kept as they were
    again = calibrate(Plan(SETUP, out, trials=3), None)
    assert again["trials"] == 3
    study = open_study(out, 0)
    states = {t.number: t.state.name for t in study.trials}
    assert states == {0: "COMPLETE", 1: "COMPLETE", 2: "FAIL", 3: "COMPLETE"}
    assert {t.number: t.value for t in study.trials if t.number < 2} == first
    assert isinstance(cfg, PolicyConfig)
    # every replay gives the peers Mosaic's node power saving (Setup.power_saving "all")
    peers = json.loads((out / "peers.json").read_text())
    assert {n: m["power_saving"] for n, m in peers["train"].items()} == dict.fromkeys(
        ("fifo", "drf", "tiresias", "gavel", "mosaic"), True
    )


def _flat(path: Path) -> dict:
    from libs.policy_io.policy_file import flatten

    return flatten(json.loads(path.read_text()), "t")


def test_a_folder_made_for_another_setting_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "cal"
    open_dir(out, Setup(trace="synthetic:40", cluster="seed", gpus=16))
    with pytest.raises(ValueError, match="gpus: 16 there, 32 now"):
        open_dir(out, Setup(trace="synthetic:40", cluster="seed", gpus=32))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--objective", "jct=1"], "unknown key 'jct'"),
        (["--holdout-frac", "1.5"], "holdout_frac"),
        (["--load-basis", "fast"], "--load-basis"),
        (["--trials", "0"], "--trials"),
        (["--power-saving", "sometimes"], "power_saving must be one of"),
        (["--radius", "0"], "--radius"),
    ],
)
def test_mosaic_calibrate_names_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    from libs.client.cli import main

    base = ["calibrate", "--trace", "synthetic:20", "--gpus", "16", "--out", str(tmp_path)]
    assert main([*base, *args]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "setup.json").exists()  # nothing kept from a refused setting


def test_plan_refuses_bad_counts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--trials"):
        Plan(SETUP, tmp_path, trials=0)
    with pytest.raises(ValueError, match="--workers"):
        Plan(SETUP, tmp_path, trials=1, workers=0)


def test_the_simulator_runs_mosaic_with_the_policy_file(tmp_path: Path) -> None:
    from libs.sim.runner import run_simulation

    def run(base: PolicyConfig | None) -> dict:
        return run_simulation("synthetic:40", "seed", 16, ["mosaic"], None, base_cfg=base)

    a, b = run(None), run(load_policy_file(write_policy_file(tmp_path / "p.json", _no_saving())))
    assert a["base_policy"] is None and b["base_policy"] == {"power_saving": False}
    # the file changed what mosaic did: no node is ever suspended without power saving
    assert b["policies"]["mosaic"]["node_suspend_hours"] == 0.0
    assert a["policies"]["mosaic"]["node_suspend_hours"] > 0.0


def _no_saving() -> PolicyConfig:
    import dataclasses

    return dataclasses.replace(PolicyConfig.default(), power_saving=False)


def test_several_fill_seeds_score_each_config_by_their_mean(tmp_path: Path) -> None:
    import dataclasses

    out = tmp_path / "cal"
    setup = dataclasses.replace(SETUP, train_seeds=2, radius=0.2)
    report = calibrate(Plan(setup, out, trials=2), None)
    assert (out / "peers.json").exists() and (out / "peers.seed1.json").exists()
    one = json.loads((out / "peers.json").read_text())["train"]["mosaic"]
    other = json.loads((out / "peers.seed1.json").read_text())["train"]["mosaic"]
    assert one != other  # the second seed drew other priorities and deadlines
    for part in ("train", "holdout"):
        seeds = report[part]["by_seed"]
        assert seeds["seeds"] == [0, 1]
        for who in ("default", "calibrated"):
            assert len(seeds[who]) == 2
            assert report[part][who] == pytest.approx(sum(seeds[who]) / 2)
    assert report["train"]["calibrated"] <= report["train"]["default"] + 1e-12
    with pytest.raises(ValueError, match="--train-seeds"):
        Setup(trace="synthetic:40", cluster="seed", train_seeds=0)
