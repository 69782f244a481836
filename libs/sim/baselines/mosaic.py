"""``mosaic``: the simulator drives ``libs.policy.core.Scheduler``, the live placer's scheduler.

Nothing of Mosaic's policy is here. This adapter only translates the engine's calls into the
scheduler's events and its decisions back: an arrival or a retry is ``queue_job`` (a retried job
keeps its original submit time as ``enqueued_at``, so aging is not reset by a failure), a start
is ``start_job`` (a gang's per-node allocations joined into its one record,
``proto.ledger.join_parts``), an end ``end_job``, a node that finished booting
``node_resumed``; the pass is
``schedule_pass`` and the power step ``power_step``, called by the engine in the order the live
placer's ``tick`` calls them. The engine does the energy accounting.

Profiles (issue 15): the scheduler may be given a table wrong by up to ±``profile_error``
(``libs.sim.profile_error``; the engine keeps running the truth) and, with
``profile_learning``, learns from each completed attempt by the live profiler's rule
(``libs.policy.profile_learning``, ``libs.sim.profile_feed``).
"""

from __future__ import annotations

from collections.abc import Collection

from libs.policy.config import MOVE_RULES, PolicyConfig
from libs.policy.core import Scheduler
from libs.policy.types import PendingJob
from libs.policy.warmup import warm_up
from libs.sim.baselines.base import BasePolicy
from libs.sim.cluster import SimCluster
from libs.sim.moves import SimMove
from libs.sim.profile_feed import ProfileFeed
from libs.sim.state import Assignment, SimContext, SimJob
from proto.ledger import join_parts, node_allocations


class Mosaic(BasePolicy):
    name = "mosaic"

    def __init__(
        self,
        cfg: PolicyConfig | None = None,
        *,
        profile_error: float = 0.0,
        profile_learning: bool = False,
        profile_seed: int = 0,
    ):
        self.cfg = cfg or PolicyConfig.default()
        self.feed = ProfileFeed(profile_error, profile_learning, profile_seed)
        pc = self.cfg.preempt
        # no move rule on (``config.MOVE_RULES``): the engine asks nothing per instant; the
        # live placer's tick would find nothing to do either
        if not any(getattr(pc, rule) for rule in MOVE_RULES):
            self.move_step = None  # type: ignore[assignment]
            self.next_move_s = None  # type: ignore[assignment]

    def attach(self, ctx: SimContext) -> None:
        super().attach(ctx)
        # the pass's compiled loops are loaded now, not inside the replay's first passes
        warm_up(self.cfg, ctx.profiles)
        cluster: SimCluster = ctx.cluster  # type: ignore[assignment]
        table = self.feed.attach(ctx.profiles, cluster.nodes, cluster.models)
        self.core = Scheduler(cluster.nodes, cfg=self.cfg, profiles=table)
        self.view = self.core.view
        cluster.policy_view = self.view
        self.resume_s = self.cfg.resume_s
        self.by_id: dict[str, SimJob] = {}

    def can_ever_place(self, job: SimJob) -> bool:
        return self.core.can_ever_place(job.spec)

    def enqueued(self, job: SimJob, now: float) -> None:
        self.by_id[job.spec.id] = job
        pj = PendingJob(
            job.spec, enqueued_at=job.submit_s, attempt=job.attempts + 1, progress=job.progress
        )
        if job.preempted_at_s >= 0:  # moved: it waits with a resume deadline
            pj = self.core.moved_job(pj, job.preempted_at_s)
        self.core.queue_job(pj)

    def cancelled(self, job: SimJob, now: float) -> None:
        """A waiting job left the queue (a replica the scaler stopped, ``libs.sim.serving``)."""
        self.core.cancel_job(job.spec.id, now)

    def started(self, job: SimJob, now: float) -> None:
        # one node, or a gang's parts (the engine holds one allocation per node)
        self.core.start_job(job.spec.id, join_parts(job.allocs), job.spec, now)
        self.feed.started(job)

    def ended(self, job: SimJob, now: float) -> None:
        self.core.end_job(job.spec.id, now)
        if (table := self.feed.ended(job, now)) is not None:
            self.core.use_profiles(table)

    def profile_report(self) -> dict | None:
        """What the profile experiment did (None: the exact table, no learning)."""
        return self.feed.report(self.core.profiles)

    def schedule(
        self, queue: Collection[SimJob], view: SimCluster, running: Collection[SimJob], now: float
    ) -> list[Assignment]:
        return [
            (self.by_id[p.job.spec.id], list(node_allocations(p.allocation)))
            for p in self.core.schedule_pass(now)
        ]

    def move_step(self, now: float) -> list[SimMove]:
        """The moves the scheduler decides now (``core.Scheduler.preempt_step``), as the
        engine applies them (``libs.sim.moves``)."""
        return [
            (self.by_id[m.job_id], m.kind, m.reason, m.shrink_to)
            for m in self.core.preempt_step(now)
        ]

    def next_move_s(self, now: float) -> float | None:
        return self.core.next_move_s(now)

    def next_pass_s(self) -> float | None:
        """When the engine should run a pass even without an event (the next backfill)."""
        return self.core.next_pass_s()

    def power_step(self, now: float) -> tuple[list[str], list[str], float | None]:
        """(node ids to suspend, node ids to resume, when to ask again or None)."""
        step = self.core.power_step(now)
        if not step.suspend and not step.resume:  # most steps: no list to build
            return [], [], step.next_s
        ids = self.view.node_ids
        return [ids[i] for i in step.suspend], [ids[i] for i in step.resume], step.next_s

    def power_resumed(self, node_id: str, now: float) -> None:
        self.core.node_resumed(node_id, now)
