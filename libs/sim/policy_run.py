"""One policy's replay and its figures, the same set-up for every policy of a comparison.

Why apart from ``runner``: what every policy shares (the jobs and their runtime truth, the
cluster, the failure model, the checkpoint cost, the thermal scenario, the services) is fixed
once, so no policy is replayed with options another did not get; the runner only loops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from libs.sim import bounds as B
from libs.sim import metrics as M
from libs.sim.engine import Engine
from libs.sim.failures import FailureModel
from libs.sim.serving import SimServices
from libs.sim.sharing import SimSharing, fractional_report
from libs.sim.state import SimResult
from libs.sim.thermal import HotNodes, guard_report, sim_thermal_for, without_guard
from proto.nodes import NodeSpec


@dataclass
class PolicyRun:
    """What every policy's replay shares (see the module docstring)."""

    jobs: list
    nodes: Sequence[NodeSpec]
    profiles: Any
    runtimes: np.ndarray
    models: list[str]
    capacity: float
    idle_w: float
    cfg: Any  # Mosaic's PolicyConfig: its checkpoint cost is every policy's
    failures: FailureModel | None
    hot: HotNodes | None
    interference: bool
    loads: list
    tariff_usd_per_kwh: float

    def _engine(self, policy: Any, thermal: Any, sharing: Any, **kw: Any) -> Engine:
        return Engine(
            self.jobs,
            self.nodes,
            policy,
            self.profiles,
            failures=self.failures,
            runtimes=self.runtimes,
            thermal=thermal,
            checkpoint_cost_s=self.cfg.preempt.checkpoint_cost_s,  # one cost for every policy
            sharing=sharing,
            **kw,
        )

    def run(
        self, policy: Any, results: dict, progress: Callable[[float], None] | None
    ) -> tuple[dict, SimResult, dict | None]:
        """Replay ``policy``: its metrics, its raw run, and the thermal guard's report (the
        same run without the guard) when a hot-node scenario is set. Fills
        ``results["bounds"]`` on the first call (the trace's bounds, the same for all)."""
        thermal = sim_thermal_for(policy, self.nodes, self.hot)
        sharing = SimSharing() if self.interference else None  # shared GPUs run slower
        served = SimServices(self.loads, self.profiles, sharing) if self.loads else None
        engine = self._engine(policy, thermal, sharing, progress=progress, services=served)
        if not results["bounds"]:
            mem = {}
            for n in self.nodes:  # the most memory per GPU each model has anywhere
                mem[n.gpu_model] = max(mem.get(n.gpu_model, 0.0), n.gpu_mem_gb)
            results["bounds"] = B.compute(
                engine.jobs, self.models, self.capacity, self.idle_w, self.profiles, mem
            )
        run = engine.run()
        services = None
        if served is not None:  # the training figures count training jobs only
            services = served.report(run.jobs, self.capacity, run.t_end_s - run.t0_s)
            run = dataclasses.replace(run, jobs=[j for j in run.jobs if not j.spec.service])
        m = M.compute(run, self.tariff_usd_per_kwh)
        if services is not None:
            m["services"] = services
        m["bound_violations"] = B.check(run, m, results["bounds"])
        m["power_saving"] = getattr(policy, "power_step", None) is not None and (
            getattr(getattr(policy, "cfg", None), "power_saving", True)
        )
        if (profiles := getattr(policy, "profile_report", lambda: None)()) is not None:
            m["profiles"] = profiles  # --profile-error / --profile-learning (issue 15)
        if thermal is not None:
            m["thermal"] = thermal.totals.as_dict()
        m["fractional"] = fractional_report(run.jobs, sharing)
        guard = None
        off = without_guard(policy) if self.hot is not None and thermal is not None else None
        if off is not None:  # the same run without the guard: what the guard avoided
            off_thermal = sim_thermal_for(off, self.nodes, self.hot)
            self._engine(off, off_thermal, SimSharing() if self.interference else None).run()
            guard = guard_report(self.hot, self.nodes, thermal, off_thermal)
        return m, run, guard
