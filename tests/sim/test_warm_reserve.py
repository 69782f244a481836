"""The warm reserve in the engine: a replay in which, without it, long jobs waited for an A100
node to boot while awake T4 GPUs stood idle (the slow-GPU guard holds them for the A100 that
power saving had put to sleep), and with it they start on arrival."""

from __future__ import annotations

import dataclasses

from libs.policy import filters as F
from libs.policy.config import PolicyConfig
from libs.policy.inventory import seed_cluster
from libs.policy.profiles import ProfileTable
from libs.sim.baselines import make_policy
from libs.sim.baselines.mosaic import Mosaic
from libs.sim.engine import Engine
from libs.sim.power_saving import PowerSaving
from tests.sim.helpers import job

PROFILES = ProfileTable.default()
NODES = seed_cluster(48)  # 2 x 8 A100, 4 x 4 V100, 2 x 8 T4
H = 3600.0


def _trace() -> list:
    """A T4 kept busy by one small job at a time (its node stays awake with 7 GPUs free) and,
    every 3 h, a 2-hour 1-GPU job (long enough for the slow-GPU guard to want an A100)."""
    out = [job(f"bg-{k}", 3 * H * k, 3 * H, gpus=1.0, constraints=("t4",)) for k in range(8)]
    out += [job(f"long-{k}", 3 * H * k + 1000.0, 2 * H, gpus=1.0) for k in range(8)]
    return out


class _Watch(Mosaic):
    """Mosaic, noting for each arriving job whether an awake node had room for it then."""

    def attach(self, ctx) -> None:  # type: ignore[override]
        super().attach(ctx)
        self.room_at_arrival: dict[str, bool] = {}

    def enqueued(self, job, now: float) -> None:  # type: ignore[override]
        room = F.fit_now(job.spec, self.core.view, self.cfg)  # asleep nodes are held: excluded
        self.room_at_arrival[job.spec.id] = bool(room.any())
        super().enqueued(job, now)


def _waits(cfg: PolicyConfig) -> dict[str, tuple[float, bool, str]]:
    """job -> (wait s, an awake node had room at arrival, GPU model it ran on)."""
    policy = _Watch(cfg)
    run = Engine(_trace(), NODES, policy, PROFILES).run()
    return {
        j.spec.id: (j.first_start_s - j.submit_s, policy.room_at_arrival[j.spec.id], j.model)
        for j in run.jobs
    }


def test_no_boot_wait_while_awake_capacity_is_idle():
    cfg = PolicyConfig.default()
    before = _waits(dataclasses.replace(cfg, warm_reserve=False))
    after = _waits(cfg)
    longs = [j for j in before if j.startswith("long-")]
    # without the reserve: a long job arrives, an awake T4 has room, and it waits a whole boot
    waited = [j for j in longs if before[j][1] and before[j][0] >= cfg.resume_s]
    assert len(waited) >= len(longs) - 1, before
    # with it: every long job after the first (an A100 then has starts in the reserve's
    # history) that found room awake starts at once, on the A100 it wants
    assert after["long-0"][0] >= cfg.resume_s  # nobody used an A100 before: it slept
    for j in longs[1:]:
        wait, room, model = after[j]
        assert room and wait < 1.0 and model == "a100-80gb", (j, after[j])


def test_baselines_wrapped_for_power_saving_keep_the_same_reserve():
    """``--power-saving all``: the wrapper feeds its baseline's starts to the same reserve, so a
    fifo whose A100 ran a job within the history keeps an A100 node awake."""
    cfg = PolicyConfig.default()
    trace = [job("a", 0.0, 600.0, gpus=8.0, constraints=("a100",))]
    trace += [job("late", 4 * H, 600.0, gpus=8.0, constraints=("a100",))]
    waits = {}
    for on in (False, True):
        policy = PowerSaving(make_policy("fifo"), dataclasses.replace(cfg, warm_reserve=on))
        run = Engine(trace, NODES, policy, PROFILES).run()
        waits[on] = {j.spec.id: j.first_start_s - j.submit_s for j in run.jobs}
    assert waits[False]["late"] >= cfg.resume_s  # every node slept: a boot
    assert waits[True]["late"] == 0.0
