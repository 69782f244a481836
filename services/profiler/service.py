"""The profiler's shell: lifecycle events in, the learnt table out to KV ``profiles``.

What it does: replays the lifecycle stream from its start (an ephemeral consumer, as the other
read models do, so the jobs' specs are known again after a restart), follows ``telemetry.*``
for the power of the GPUs each running job holds, turns each ``Completed`` into an observation
(``services.profiler.observations``), looks up the GPU model of the node it ran on (KV
``nodes``), feeds the learning rule (``libs.policy.profile_learning``, the one the
simulator runs) and publishes the whole table as one versioned record
(``proto.profiles.ProfilesRecord``). The placer and the scorer watch that key and schedule with
the newest table (``libs.bus.profile_watch``). An event that does not decode goes to
``dlq.profiler`` (the bus's consumer does that) and the profiler keeps running.

Restarts: the record holds the learner's rows (seeds included) and how far it got (the newest
``Completed`` time counted, and the jobs counted at that time). A restarted profiler takes the
rows back, replays the stream and, until the replay has caught up, counts only completions
after that point: none twice. What it can miss: a completion published out of time order
(older than one already counted) in the moments before a crash. A record that fails to publish
(NATS away) is published with the next observation; the learner already holds it.
"""

from __future__ import annotations

import argparse

from prometheus_client import Counter, Gauge

from libs.bus.connection import Bus
from libs.bus.refusals import refused
from libs.bus.replay import wait_caught_up
from libs.bus.runtime import ServiceContext
from libs.clock import Clock
from libs.policy.profile_learning import LearningConfig, ProfileLearner
from libs.policy.profile_wire import from_rows, to_rows
from libs.policy.profiles import ProfileTable
from proto import subjects
from proto.events import LifecycleEvent
from proto.nodes import NodeSpec, TelemetrySample
from proto.profiles import MAX_LEARNT_IDS, ProfilesRecord, revalidate_profiles
from proto.validation_records import revalidate_node_spec, revalidate_sample
from services.profiler.observations import CompletedJobs, Observation

NAME = "profiler"
OBSERVATIONS = Counter(
    "mosaic_profiler_observations_total",
    "Completed jobs the profiler looked at, by outcome (learnt, replayed, unknown_node).",
    ["outcome"],
)
VERSION = Gauge("mosaic_profiler_table_version", "Version of the last table published.")


class ProfilerService:
    def __init__(
        self, bus: Bus, clock: Clock, log: object, cfg: LearningConfig | None = None
    ) -> None:
        self.bus, self.clock, self.log = bus, clock, log
        self.learner = ProfileLearner(ProfileTable.default(), cfg)
        self.jobs = CompletedJobs()
        self.nodes: dict[str, NodeSpec] = {}
        self.version = 0
        self.learnt_to = 0.0
        self.learnt_ids: set[str] = set()
        self.replaying = True
        self.published = 0  # records put by this process (tests, logs)

    async def start(self) -> None:
        """Take back the published table, follow the nodes, replay the lifecycle stream."""
        self.kv = await self.bus.kv(subjects.KV_PROFILES, ProfilesRecord)
        entry = await self.kv.get(subjects.PROFILES_KEY)
        if entry is not None:
            self._restore(entry.value)
        nodes_kv = await self.bus.kv(subjects.KV_NODES, NodeSpec)
        await nodes_kv.watch(self._on_node)
        await self.bus.subscribe(subjects.TELEMETRY_ALL, TelemetrySample, self._on_sample)
        consumer = await self.bus.consume(
            subjects.STREAM_LIFECYCLE,
            f"{subjects.LIFECYCLE_PREFIX}.>",
            LifecycleEvent,
            self._on_event,
        )
        if not await wait_caught_up(self.bus, consumer, subjects.STREAM_LIFECYCLE):
            self.log.warning("replay_incomplete", hint="counting what comes from now on")
        self.replaying = False

    def _restore(self, rec: ProfilesRecord) -> None:
        if refused(self.bus, "profiles", revalidate_profiles(rec)):
            self.log.warning("profiles_not_restored", hint="learning again from nothing")
            return
        self.learner.restore(from_rows(rec.rows))
        self.version, self.learnt_to = rec.version, rec.learnt_to
        self.learnt_ids = set(rec.learnt_ids)
        self.log.info("profiles_restored", version=rec.version, rows=len(rec.rows))

    async def _on_node(self, key: str, value: NodeSpec | None) -> None:
        if value is None or refused(self.bus, "node", revalidate_node_spec(value, key), key=key):
            self.nodes.pop(key, None)
        else:
            self.nodes[key] = value

    async def _on_sample(self, sample: TelemetrySample) -> None:
        """Power per GPU of the jobs running on the sample's node (checked against its spec:
        a forged 1 MW reading must not become a profile)."""
        node = self.nodes.get(sample.node)
        if node is None:
            return
        if refused(self.bus, "telemetry", revalidate_sample(sample, node), node=sample.node):
            return
        self.jobs.sample(sample)

    async def _on_event(self, ev: LifecycleEvent) -> None:
        obs = self.jobs.apply(ev)
        if obs is not None:
            await self.learn(obs)

    def _counted(self, obs: Observation) -> bool:
        """Whether a replayed completion was counted before the restart."""
        if not self.replaying:
            return False
        return obs.time < self.learnt_to or (
            obs.time == self.learnt_to and obs.job_id in self.learnt_ids
        )

    async def learn(self, obs: Observation) -> None:
        if self._counted(obs):
            OBSERVATIONS.labels("replayed").inc()
            return
        node = self.nodes.get(obs.node)
        if node is None:
            OBSERVATIONS.labels("unknown_node").inc()
            self.log.info("profile_observation_skipped", job=obs.job_id, node=obs.node)
            return
        model = node.gpu_model
        self.learner.observe(model, obs.workload_class, obs.framework, obs.speed, obs.power_w)
        if obs.time > self.learnt_to:
            self.learnt_to, self.learnt_ids = obs.time, set()
        if len(self.learnt_ids) < MAX_LEARNT_IDS:
            self.learnt_ids.add(obs.job_id)
        OBSERVATIONS.labels("learnt").inc()
        self.log.info(
            "profile_observed", job=obs.job_id, model=model, workload_class=obs.workload_class,
            framework=obs.framework, speed=round(obs.speed, 4),
        )  # fmt: skip
        await self.publish()

    def record(self) -> ProfilesRecord:
        return ProfilesRecord(
            version=self.version + 1,
            time=self.clock.now(),
            learnt_to=self.learnt_to,
            learnt_ids=tuple(sorted(self.learnt_ids)),
            rows=to_rows(self.learner.learnt),
        )

    async def publish(self) -> None:
        """Put the whole table; a failure is logged, the next observation publishes again."""
        rec = self.record()
        try:
            await self.kv.put(subjects.PROFILES_KEY, rec)
        except Exception as exc:
            self.log.warning("profiles_publish_failed", error=repr(exc))
            return
        self.version = rec.version
        self.published += 1
        VERSION.set(rec.version)


def config_from_args(args: argparse.Namespace) -> LearningConfig:
    d = LearningConfig()
    return LearningConfig(
        alpha=getattr(args, "alpha", d.alpha),
        min_samples=getattr(args, "min_samples", d.min_samples),
        outlier_factor=getattr(args, "outlier_factor", d.outlier_factor),
    )


def validate(args: argparse.Namespace) -> None:
    """A bad flag is a usage error naming it, before connecting."""
    config_from_args(args)


async def main(ctx: ServiceContext) -> None:
    """``python -m services.profiler``: run until ``ctx.stop``."""
    service = ProfilerService(ctx.bus, ctx.clock, ctx.log, config_from_args(ctx.args))
    await service.start()
    ctx.log.info("profiler_started", version=service.version)
    await ctx.stop.wait()
