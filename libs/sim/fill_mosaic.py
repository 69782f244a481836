"""Mosaic in the fill experiment: the real scheduler (``libs.policy.core.Scheduler``) places each
pod, as in the replay adapter (``libs.sim.baselines.mosaic``): queue it, run a pass, read the
placement, report the start; a pod the pass does not place is cancelled (it fails, as in FGD's
experiment). ``mosaic+defrag`` then asks the defragmenter's plan
(``libs.policy.stages.defrag.plan_moves``, the definition the live defragmenter calls) for
moves (its per-node plan, or its compaction rule, ``stages.compact``), applies them (each
moved pod: ``end_job`` then ``start_job`` at its destination, counted as a migration with its
checkpoint cost, ``cfg.defrag.checkpoint_cost_s``) and passes again.

Movable pods: QoS BE and Burstable (``checkpointable`` in ``load_fill_pods``); LS and
Guaranteed never move. The scheduler holds no job without a GPU, so a CPU-only pod is placed by
``stages.frag.cpu_only_node`` (least growth of fragmentation, then least free GPU share) and
reported with
``start_job``, so the scheduler's view counts its CPUs and memory.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from libs.policy.config import PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.daynight import DayNight
from libs.policy.profiles import ProfileTable
from libs.policy.stages.defrag import fits, plan_moves
from libs.policy.stages.frag import Workload, cpu_only_node
from libs.policy.types import PendingJob, RunningJob
from libs.sim.fill_policy import FillPolicy, allocation
from proto.jobs import JobSpec
from proto.ledger import Allocation
from proto.nodes import NodeSpec


class MosaicFill(FillPolicy):
    name = "mosaic"

    def __init__(self, defrag: bool = False) -> None:
        self.defrag = defrag

    def attach(self, nodes: Sequence[NodeSpec], *, seed: int, cfg: PolicyConfig) -> None:
        super().attach(nodes, seed=seed, cfg=cfg)
        self.defrag = self.defrag or cfg.defrag.enabled  # ``--set defrag.enabled=true``
        self.core = Scheduler(nodes, cfg=cfg, profiles=ProfileTable.default())
        self.view = self.core.view  # one ledger: the scheduler's
        self.running: dict[str, RunningJob] = {}
        self.checkpoint_cost_s = 0.0
        self.plans = 0

    def learn(self, work: Workload) -> None:
        """The target workload goes where the score stage reads it: the scheduler's config
        (``frag_workload``, for ``stages.score.s_frag``), as a live operator would set it."""
        super().learn(work)
        self.cfg = dataclasses.replace(self.cfg, frag_workload=work.as_config())
        self.core.cfg = self.cfg
        # the pass reads the config in force from the day/night calendar, built on the config
        # it was given: without a new one the target workload never reached the score
        self.core.daynight = DayNight(self.cfg)

    def place(self, spec: JobSpec, now: float) -> bool:
        if spec.gpus <= 0:
            fit = fits(spec, self.view, self.cfg)
            if not fit.any():
                return False
            n = cpu_only_node(self.view, spec, fit, self.work)
            self._start(allocation(spec, self.view, (n, (), 0.0), now), spec, now)
            return True
        if self._pass(spec, now):
            return True
        if not self.defrag or not self._defragment(spec, now):
            return False
        return self._pass(spec, now)

    def _pass(self, spec: JobSpec, now: float) -> bool:
        self.core.queue_job(PendingJob(spec, enqueued_at=now))
        placed = self.core.schedule_pass(now)
        for p in placed:
            self._start(p.allocation, p.job.spec, now)
        if spec.id in self.running:
            return True
        self.core.cancel_job(spec.id, now)
        return False

    def _start(self, alloc: Allocation, spec: JobSpec, now: float) -> None:
        self.core.start_job(spec.id, alloc, spec, now)
        i = self.view.index[alloc.node]
        self.running[spec.id] = RunningJob(spec, i, alloc.gpu_indices, alloc.gpu_share, math.inf)

    def _defragment(self, spec: JobSpec, now: float) -> bool:
        """Apply the plan's moves for ``spec``; whether there were any."""
        d = self.cfg.defrag
        moves = plan_moves(
            self.view,
            list(self.running.values()),
            [PendingJob(spec, enqueued_at=now)],
            now=now,
            cfg=self.cfg,
            movable=lambda r: r.spec.checkpointable,
            max_moves=d.max_moves,
        )
        self.plans += 1
        for m in moves:
            r = self.running.pop(m.job_id)
            self.core.end_job(m.job_id, now)
            a = Allocation(
                job_id=m.job_id,
                node=m.node_to,
                gpu_indices=m.gpu_indices_to,
                gpu_share=r.gpu_share,
                gpu_mem_gb=r.spec.gpu_mem_gb,
                host_mem_gb=r.spec.host_mem_gb,
                cpus=r.spec.cpus,
                time=now,
                spec=r.spec,
            )
            self._start(a, r.spec, now)
            self.migrations += 1
            self.migrated_gpus += r.gpu_share * len(r.gpu_indices)
            self.checkpoint_cost_s += d.checkpoint_cost_s + m.lost_work_s
        return bool(moves)

    def stats(self) -> dict[str, float]:
        return super().stats() | {"checkpoint_cost_s": self.checkpoint_cost_s}


def fill_config(cfg: PolicyConfig, defrag: bool) -> PolicyConfig:
    """The run's config: ``mosaic+defrag`` switches the defragmenter on."""
    if defrag and not cfg.defrag.enabled:
        return dataclasses.replace(cfg, defrag=dataclasses.replace(cfg.defrag, enabled=True))
    return cfg
