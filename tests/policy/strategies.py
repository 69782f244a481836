"""Hypothesis strategies for random heterogeneous clusters and jobs, and the plain node builder
the hand-written policy tests share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proto.jobs import WORKLOAD_CLASSES, JobSpec
from proto.nodes import NodeSpec

MODELS = (("a100-80gb", 80.0), ("v100-32gb", 32.0), ("t4", 16.0), ("h900", 96.0))


def node_spec(
    nid: str,
    gpus: int,
    model: str = "v100-32gb",
    mem: float = 32.0,
    *,
    host: float = 512.0,
    cpus: int = 128,
    idle_w: float = 40.0,
    max_w: float = 300.0,
) -> NodeSpec:
    """One node for a hand-built cluster: ``gpus`` GPUs of ``model`` with ``mem`` GB each."""
    return NodeSpec(
        id=nid,
        gpu_model=model,
        gpu_count=gpus,
        gpu_mem_gb=mem,
        host_mem_gb=host,
        cpus=cpus,
        idle_power_w=idle_w,
        max_power_w=max_w,
    )


@st.composite
def nodes(draw, max_nodes: int = 6) -> list[NodeSpec]:
    n = draw(st.integers(1, max_nodes))
    out = []
    for i in range(n):
        model, mem = draw(st.sampled_from(MODELS))
        g = draw(st.sampled_from([1, 2, 4, 8]))
        out.append(
            NodeSpec(
                id=f"n{i}",
                gpu_model=model,
                gpu_count=g,
                gpu_mem_gb=mem,
                host_mem_gb=float(draw(st.sampled_from([32, 64, 128, 256]))),
                cpus=draw(st.sampled_from([8, 16, 32, 64])),
                idle_power_w=30.0,
                max_power_w=300.0,
            )
        )
    return out


@st.composite
def jobs(draw, prefix: str = "j", max_jobs: int = 12) -> list[JobSpec]:
    n = draw(st.integers(1, max_jobs))
    out = []
    for i in range(n):
        gpus = draw(st.sampled_from([0.25, 0.5, 0.5, 1.0, 1.0, 2.0, 4.0, 8.0]))
        out.append(
            JobSpec(
                id=f"{prefix}{i}",
                tenant=draw(st.sampled_from(["a", "b", "c"])),
                priority=draw(st.integers(0, 9)),
                gpus=gpus,
                gpu_mem_gb=float(draw(st.sampled_from([2, 8, 16, 24, 40, 80]))),
                host_mem_gb=float(draw(st.sampled_from([0, 8, 32, 100]))),
                cpus=float(draw(st.sampled_from([0, 2, 8, 20]))),
                workload_class=draw(st.sampled_from(WORKLOAD_CLASSES)),
                constraints=draw(st.sampled_from([(), (), ("a100",), ("t4", "v100"), ("h900",)])),
                energy_sensitivity=draw(st.floats(0, 1)),
                est_runtime_s=float(draw(st.integers(60, 20000))),
            )
        )
    return out


@st.composite
def busy_view(draw):
    """A cluster view already running some jobs (placed by the default policy), and those jobs
    as ``RunningJob``s with random expected ends: the starting point of scheduler properties."""
    from libs.policy.cluster import ClusterView
    from libs.policy.config import PolicyConfig
    from libs.policy.placement import place, to_allocation
    from libs.policy.profiles import ProfileTable
    from libs.policy.types import Placement, RunningJob

    profiles, cfg = ProfileTable.default(), PolicyConfig.default()
    v = ClusterView.build(draw(nodes(max_nodes=5)))
    running = []
    for spec in draw(jobs(prefix="r", max_jobs=10)):
        p = place(spec, v, profiles, cfg)
        if isinstance(p, Placement):
            v.allocate(to_allocation(spec, p, 0.0))
            end = float(draw(st.integers(1, 20000)))
            running.append(RunningJob(spec, p.node_index, p.gpu_indices, p.gpu_share, end))
    return v, running


def derandomized(
    prop: Any, args: tuple[st.SearchStrategy[Any], ...], examples: int
) -> Callable[[], None]:
    """``prop`` (a ``@given`` property) run again on ``args`` with hypothesis's fixed examples
    and no example database: a test that counts what the property's examples found (that it is
    not vacuous) then counts the same examples on every machine and every run, where the
    random ones of a local run once found 1 plan in 300 (and 12-40 usually)."""
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )(given(*args)(prop.hypothesis.inner_test))
