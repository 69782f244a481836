"""The comparison's fairness: a policy's figures do not depend on which other policies run (the
energy window and the dropped jobs come from the trace and cluster alone), energy per unit of
work is reported, and ``--power-saving`` gives every policy the same node power saving."""

from __future__ import annotations

import numpy as np
import pytest

from libs.policy.config import PolicyConfig
from libs.policy.inventory import seed_cluster
from libs.policy.profiles import ProfileTable
from libs.sim import bounds as B
from libs.sim import metrics as M
from libs.sim.baselines import make_policy
from libs.sim.engine import Engine
from libs.sim.power_saving import PowerSaving, _Held, _per_node, apply_mode
from libs.sim.runner import main, run_simulation
from libs.sim.state import COMPLETED
from tests.sim.helpers import job

TIMING = ("wall_s", "jobs_per_s")  # the replay's own speed, not a figure of the schedule
PROFILES = ProfileTable.default()
NODES = seed_cluster(48)


def _figures(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in TIMING}


@pytest.mark.parametrize("mode", ["mosaic", "all"])
def test_a_policys_figures_do_not_change_when_others_join_the_run(mode):
    kw = dict(seed=3, load=0.9, max_jobs=None, power_saving=mode)
    alone = run_simulation("synthetic:200", "seed", 64, ["fifo"], None, **kw)
    many = run_simulation("synthetic:200", "seed", 64, ["fifo", "mosaic", "drf"], None, **kw)
    assert alone["jobs"] == many["jobs"] and alone["dropped_jobs"] == many["dropped_jobs"]
    assert alone["energy_window"] == many["energy_window"]
    assert _figures(alone["policies"]["fifo"]) == _figures(many["policies"]["fifo"])
    # the window is the trace's makespan lower bound, stated with its rule
    assert many["energy_window"]["energy_window_s"] == many["bounds"]["makespan_lb_s"]
    assert "makespan_lb_s" in many["energy_window"]["rule"]
    for m in many["policies"].values():
        assert m["energy_window_s"] == many["energy_window"]["energy_window_s"]
        assert m["energy_kwh_per_ref_gpu_hour"] == pytest.approx(
            m["energy_kwh"] / m["work_ref_gpu_hours"]
        )


def test_a_run_is_charged_to_the_window_or_past_it_for_its_real_draw():
    m = {
        "energy_kwh": 30.0,
        "energy_active_kwh": 10.0,
        "energy_idle_kwh": 20.0,
        "idle_power_kw": 2.0,
        "end_idle_power_kw": 0.5,
        "makespan_s": 36_000.0,
        "tariff_usd_per_kwh": 0.1,
        "work_ref_gpu_hours": 40.0,
    }
    short = M.rewindow(m, 7_200.0)  # the run went on past the window: its own draw, no more
    assert short["energy_kwh"] == pytest.approx(30.0)
    assert short["energy_charged_s"] == 36_000.0
    assert short["energy_kwh_per_ref_gpu_hour"] == pytest.approx(30.0 / 40.0)
    long = M.rewindow(m, 72_000.0)  # it ended first: the rest at its end idle draw (0.5 kW)
    assert long["energy_kwh"] == pytest.approx(30.0 + 0.5 * 10.0)
    assert long["energy_own_window_kwh"] == 30.0
    assert long["energy_cost_usd"] == pytest.approx(long["energy_kwh"] * 0.1)
    assert M.rewindow({**m, "work_ref_gpu_hours": 0.0}, 1.0)["energy_kwh_per_ref_gpu_hour"] != 0


def _bursts() -> list:
    """Two bursts of work 20 h apart: in between, the cluster is empty."""
    out = []
    for b, t0 in enumerate((0.0, 72_000.0)):
        for i in range(24):
            out.append(job(f"b{b}-{i}", t0 + 10.0 * i, 1800.0, gpus=float(1 + i % 4)))
    return out


def _run(policy):
    eng = Engine(_bursts(), NODES, policy, PROFILES)
    bounds = B.compute(
        eng.jobs, eng.cluster.models, eng.cluster.capacity_gpus, eng.idle_total_w, PROFILES
    )
    run = eng.run()
    m = M.compute(run)
    return run, m, B.check(run, m, bounds)


@pytest.mark.parametrize("name", ["fifo", "tiresias", "gavel", "drf"])
def test_a_wrapped_baseline_sleeps_idle_nodes_and_wakes_them_for_work(name):
    cfg = PolicyConfig.default()
    run_plain, plain, bad_plain = _run(make_policy(name))
    run_saving, saving, bad = _run(apply_mode(name, make_policy(name), "all", cfg))
    assert bad == [] and bad_plain == []
    assert all(j.state == COMPLETED for j in run_saving.jobs)
    assert plain["node_suspend_hours"] == 0
    assert saving["node_suspend_hours"] > 0
    assert saving["energy_idle_kwh"] < plain["energy_idle_kwh"]
    # the second burst arrived on a sleeping cluster: its nodes were woken (one boot at most
    # on top of the queueing the plain run had), and no job was ever lost
    late = max(j.first_start_s - j.submit_s for j in run_saving.jobs)
    late_plain = max(j.first_start_s - j.submit_s for j in run_plain.jobs)
    assert late <= late_plain + cfg.resume_s + cfg.suspend_after_s


def test_modes_set_who_saves_power():
    cfg = PolicyConfig.default()
    assert isinstance(apply_mode("fifo", make_policy("fifo"), "all", cfg), PowerSaving)
    assert not isinstance(apply_mode("fifo", make_policy("fifo"), "mosaic", cfg), PowerSaving)
    assert not apply_mode("mosaic", make_policy("mosaic"), "none", cfg).cfg.power_saving
    assert apply_mode("mosaic", make_policy("mosaic"), "all", cfg).cfg.power_saving
    with pytest.raises(ValueError, match="power_saving"):
        apply_mode("fifo", make_policy("fifo"), "some", cfg)
    none = run_simulation("synthetic:60", "seed", 48, ["mosaic"], None, power_saving="none")
    assert none["power_saving"]["mode"] == "none"
    assert none["policies"]["mosaic"]["node_suspend_hours"] == 0
    assert none["policies"]["mosaic"]["power_saving"] is False


def test_the_runner_refuses_an_unknown_mode(capsys):
    with pytest.raises(SystemExit):
        main(["--trace", "synthetic:10", "--power-saving", "half"])
    assert "--power-saving" in capsys.readouterr().err


def test_a_hold_books_sleeping_nodes_whole_and_gives_them_back():
    from libs.sim.cluster import SimCluster

    c = SimCluster(NODES)
    mask = [i % 2 == 0 for i in range(len(NODES))]
    before = (c.allocated_gpus, c.free_share.copy(), c.host_free_gb.copy(), c.cpus_free.copy())
    with _Held(c, np.array(mask)):
        assert c.allocated_gpus == sum(n.gpu_count for n, m in zip(NODES, mask, strict=True) if m)
        assert all(c.free_whole()[i] == 0 for i, m in enumerate(mask) if m)
    assert c.allocated_gpus == before[0]
    assert (c.free_share == before[1]).all() and (c.host_free_gb == before[2]).all()
    assert (c.cpus_free == before[3]).all()


def test_a_gang_wider_than_any_node_asks_for_node_sized_pieces():
    spec = job("g", 0.0, 60.0, gpus=20.0).spec
    pieces = _per_node(spec, 8)
    assert [p.gpus for p in pieces] == [8.0, 8.0, 4.0]
    assert sum(p.cpus for p in pieces) == pytest.approx(spec.cpus)
    assert _per_node(job("s", 0.0, 60.0, gpus=4.0).spec, 8)[0].gpus == 4.0


def test_mosaic_sim_takes_power_saving_and_load_basis(tmp_path, capsys):
    import json

    from libs.client.cli import main as cli

    args = ["sim", "--trace", "synthetic", "--gpus", "32", "--max-jobs", "40"]
    args += ["--policies", "fifo", "--load", "0.8", "--load-basis", "effective"]
    assert cli([*args, "--power-saving", "all", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["power_saving"]["mode"] == "all" and r["load"]["basis"] == "effective"
    assert r["policies"]["fifo"]["power_saving"] is True
    assert cli([*args, "--power-saving", "some", "--out", str(tmp_path)]) == 2
    assert "power_saving" in capsys.readouterr().err
    assert cli([*args[:-2], "--load-basis", "slowest", "--out", str(tmp_path)]) == 2
    assert "load_basis" in capsys.readouterr().err
