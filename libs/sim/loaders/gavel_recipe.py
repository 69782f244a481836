"""Gavel-recipe traces: jobs generated the way Gavel's simulator generates them, seeded.

Why: Gavel's published JCTs (OSDI'20, continuous multi-GPU experiments) come from jobs it
generates on the fly, not from a trace file; to set our figures beside them we generate jobs by
the same recipe. The recipe, as read in stanford-futuredata/gavel (commit c4fa400):
``scheduler/scheduler.py`` ``_sample_arrival_time_delta`` (Poisson arrivals: exponential gaps
of mean ``3600 / rate`` s, the first job at 0), ``scheduler/utils.py`` ``_generate_scale_factor``
(GPUs: 1 with probability 0.70, 2 with 0.10, 4 with 0.15, 8 with 0.05), ``_generate_duration``
(the run time on a V100: ``60 x 10^U(3, 4)`` s with probability 0.2, else ``60 x 10^U(1.5, 3)``)
and ``generate_job`` (a job type drawn uniformly from ``scheduler/job_table.py``'s 26 templates;
a multi-GPU job draws again until the type is one of the 19 distributed ones; its steps are the
duration x its V100 throughput). The throughputs are Gavel's measured table,
``simulation_throughputs.json`` (the isolated ``null`` entries): a job's runtime on a GPU type
is ``steps / throughput`` there, ``TraceJob.runtime_by_model``. Implemented here from that
description with numpy streams of our own (one per field), so the jobs are Gavel's
distributions, not Gavel's random sequence.

What the recipe does not say and we set: every job has the same priority and no deadline
(Gavel's default run: weight 1, no SLO), one tenant, every job checkpointable (Gavel preempts
any job at a round's end) and none elastic (its scale factor is fixed); GPU memory is drawn
by the shared fill rule and capped at the smallest GPU the job has a throughput on; a type
without a throughput for the job's scale factor (e.g. ResNet-50 at batch 128 on 2+ K80s) is
left out of its allowed GPU models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from libs.sim.loaders.assemble import assemble
from libs.sim.loaders.fill import Filler, _stream
from libs.sim.loaders.gavel import GPU_TYPES, load_throughputs, workload_class
from libs.sim.trace import REFERENCE_MODEL, Trace
from proto.gpus import CATALOG

# scheduler/job_table.py: (model, batch sizes, distributed) in Gavel's order
TEMPLATES: tuple[tuple[str, tuple[int, ...] | None, bool], ...] = (
    ("ResNet-18", (16, 32, 64, 128, 256), True),
    ("ResNet-50", (16, 32, 64, 128), True),
    ("Transformer", (16, 32, 64, 128, 256), True),
    ("LM", (5, 10, 20, 40, 80), True),
    ("Recommendation", (512, 1024, 2048, 4096, 8192), False),
    ("A3C", None, False),
    ("CycleGAN", None, False),
)
JOB_TYPES: tuple[str, ...] = tuple(
    name if sizes is None else f"{name} (batch size {b})"
    for name, sizes, _ in TEMPLATES
    for b in (sizes or (0,))
)
DISTRIBUTED: frozenset[str] = frozenset(
    name if sizes is None else f"{name} (batch size {b})"
    for name, sizes, dist in TEMPLATES
    if dist
    for b in (sizes or (0,))
)
SCALE_FACTORS: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
LONG_SHARE = 0.2  # of jobs: duration 60 x 10^U(3, 4) s, the rest 60 x 10^U(1.5, 3) s
LONG_LOG10_MIN = (3.0, 4.0)
SHORT_LOG10_MIN = (1.5, 3.0)
REFERENCE_GPU = "v100"  # Gavel's reference worker type: durations are V100 run times
PRIORITY = 5  # one class for every job (Gavel's default weight 1)
TENANT = "gavel-recipe"
DEFAULT_JOBS = 1000
CLUSTER = "v100=36,p100=36,k80=36"  # Gavel's simulated cluster (36 GPUs of each type)
GPUS_PER_NODE = 8  # 4 x 8 + 1 x 4 GPUs per type: every scale factor fits one node


@dataclass(frozen=True, slots=True)
class Recipe:
    """``gavel:rate=6,jobs=1000,seed=1``: jobs per hour, how many, the seed (default: the
    run's), and ``multi=0`` for single-GPU jobs only (Gavel's generate_multi_gpu_jobs off)."""

    rate_per_h: float
    jobs: int = DEFAULT_JOBS
    seed: int = 0
    multi_gpu: bool = True

    @classmethod
    def parse(cls, text: str, default_seed: int = 0) -> Recipe:
        fields: dict[str, str] = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            if not sep or key not in ("rate", "jobs", "seed", "multi"):
                raise ValueError(
                    f"gavel recipe: {part.strip()!r} is not KEY=VALUE with KEY one of rate, "
                    "jobs, seed, multi (e.g. gavel:rate=6,jobs=1000,seed=1)"
                )
            if key in fields:
                raise ValueError(f"gavel recipe: {key} given twice")
            fields[key] = value.strip()
        if "rate" not in fields:
            raise ValueError("gavel recipe: rate (jobs per hour) is required, e.g. rate=6")
        rate = _number("rate", fields["rate"], float)
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"gavel recipe: rate must be a positive number, got {rate}")
        jobs = _number("jobs", fields.get("jobs", str(DEFAULT_JOBS)), int)
        if jobs <= 0:
            raise ValueError(f"gavel recipe: jobs must be > 0, got {jobs}")
        seed = _number("seed", fields.get("seed", str(default_seed)), int)
        multi = fields.get("multi", "1")
        if multi not in ("0", "1"):
            raise ValueError(f"gavel recipe: multi must be 0 or 1, got {multi!r}")
        return cls(rate_per_h=rate, jobs=jobs, seed=seed, multi_gpu=multi == "1")


def _number(name: str, text: str, kind: type) -> float | int:
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"gavel recipe: {name} must be a number, got {text!r}") from None


@dataclass(frozen=True, slots=True)
class GeneratedJob:
    """One job of the recipe: arrival (s), type, GPUs, runtime per Gavel GPU type (s)."""

    arrival_s: float
    job_type: str
    scale_factor: int
    runtime_s: dict[str, float]


def generate(recipe: Recipe, tputs: dict[str, dict[tuple[str, int], float]]) -> list[GeneratedJob]:
    """The recipe's jobs, in arrival order (module docstring); ``tputs`` as ``load_throughputs``
    returns it."""
    n, seed = recipe.jobs, recipe.seed
    gaps = _stream(seed, "gavel_recipe.arrival").exponential(3600.0 / recipe.rate_per_h, n)
    arrival = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    if recipe.multi_gpu:
        u = _stream(seed, "gavel_recipe.scale_factor").random(n)
        edges = np.cumsum([p for _, p in SCALE_FACTORS])[:-1]
        sf = np.array([s for s, _ in SCALE_FACTORS])[np.searchsorted(edges, u, side="right")]
    else:
        sf = np.ones(n, dtype=int)
    d_rng = _stream(seed, "gavel_recipe.duration")
    long = d_rng.random(n) < LONG_SHARE
    lo = np.where(long, LONG_LOG10_MIN[0], SHORT_LOG10_MIN[0])
    hi = np.where(long, LONG_LOG10_MIN[1], SHORT_LOG10_MIN[1])
    duration = 60.0 * 10.0 ** d_rng.uniform(lo, hi)
    t_rng = _stream(seed, "gavel_recipe.job_type")
    every = np.array(JOB_TYPES)
    dist = np.array([t for t in JOB_TYPES if t in DISTRIBUTED])
    single = t_rng.integers(0, len(every), n)
    multi = t_rng.integers(0, len(dist), n)  # uniform over the distributed types, as redrawing
    ref = tputs[REFERENCE_GPU]
    out: list[GeneratedJob] = []
    for i in range(n):
        s = int(sf[i])
        jt = str(every[single[i]] if s == 1 else dist[multi[i]])
        steps = duration[i] * ref[(jt, s)]
        runtime = {
            g: float(steps / table[(jt, s)]) for g, table in tputs.items() if (jt, s) in table
        }
        out.append(GeneratedJob(float(arrival[i]), jt, s, runtime))
    return out


def load_gavel_recipe(text: str, *, traces_dir: Path, seed: int, throughputs: Path | None) -> Trace:
    """The recipe ``text`` (``Recipe.parse``) as a trace, its throughputs from ``throughputs``
    or ``traces_dir/gavel/simulation_throughputs.json``."""
    recipe = Recipe.parse(text, default_seed=seed)
    tput_path = throughputs or traces_dir / "gavel" / "simulation_throughputs.json"
    tputs = load_throughputs(tput_path)
    jobs = generate(recipe, tputs)
    f = Filler(recipe.seed)
    f.note(
        f"gavel recipe: {recipe.jobs} jobs, Poisson arrivals at {recipe.rate_per_h:g} jobs/h, "
        f"seed {recipe.seed}; Gavel's scale factors {dict(SCALE_FACTORS)}"
        + ("" if recipe.multi_gpu else " (off: single-GPU jobs only)")
        + f", durations on a V100 60 x 10^U{LONG_LOG10_MIN} s ({LONG_SHARE:.0%}) else "
        f"60 x 10^U{SHORT_LOG10_MIN} s, job type uniform over Gavel's {len(JOB_TYPES)} "
        f"templates ({len(DISTRIBUTED)} distributed ones for multi-GPU jobs)"
    )
    f.note(
        f"gavel recipe: runtime on a GPU type = steps / isolated throughput of "
        f"{tput_path.name}; a type without one for the job is not among its allowed models"
    )
    f.note(f"gavel recipe: priority {PRIORITY} and no deadline for every job, one tenant")
    f.note(
        "gavel recipe: every job checkpointable (Gavel preempts at round ends), none elastic "
        "(a job keeps its scale factor)"
    )
    n = len(jobs)
    gpus = np.array([float(j.scale_factor) for j in jobs])
    by_model = [{GPU_TYPES[g]: r for g, r in j.runtime_s.items()} for j in jobs]
    every = set(GPU_TYPES.values())
    constraints = [() if set(rt) == every else tuple(sorted(rt)) for rt in by_model]
    mem = f.gpu_mem_gb(gpus, np.zeros(n, dtype=bool))
    mem = np.minimum(mem, [min(CATALOG[m].mem_gb for m in rt) for rt in by_model])
    tag = f"r{recipe.rate_per_h:g}s{recipe.seed}"
    trace = assemble(
        name=f"gavel:{text}",
        source="gavel-recipe",
        filler=f,
        ids=[f"gavel-{tag}-{i}" for i in range(n)],
        submit_s=np.array([j.arrival_s for j in jobs]),
        gpus=gpus,
        runtime_s=np.array([rt[REFERENCE_MODEL] for rt in by_model]),
        tenants=[TENANT] * n,
        workload_class=[workload_class(j.job_type) for j in jobs],
        priority=np.full(n, PRIORITY),
        deadline=np.full(n, np.nan),
        constraints=constraints,
        gpu_mem_gb=mem,
        runtime_by_model=by_model,
    )
    fixed = tuple(
        msgspec.structs.replace(
            j, spec=msgspec.structs.replace(j.spec, checkpointable=True, elastic=None)
        )
        for j in trace.jobs
    )
    return msgspec.structs.replace(trace, jobs=fixed)


def gavel_trace_lines(recipe: Recipe, tputs: dict[str, dict[tuple[str, int], float]]) -> list[str]:
    """The recipe's jobs in Gavel's own 10-field ``.trace`` layout (``scheduler/utils.py``
    ``parse_trace``; ``loaders.gavel`` reads it too), so Gavel's simulator can replay the very
    jobs we replay. Steps are whole (Gavel parses them as int); the command fields, which a
    simulation does not run, are placeholders; weight 1, no SLO (-1)."""
    ref = tputs[REFERENCE_GPU]
    lines = []
    for j in generate(recipe, tputs):
        steps = max(1, round(j.runtime_s[REFERENCE_GPU] * ref[(j.job_type, j.scale_factor)]))
        fields = (j.job_type, "-", "-", "-", "0", str(steps), str(j.scale_factor), "1", "-1")
        lines.append("\t".join(fields) + f"\t{j.arrival_s:.6f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m libs.sim.loaders.gavel_recipe rate=6,jobs=1000,seed=1 > jobs.trace``: the
    recipe's jobs in Gavel's ``.trace`` layout, for Gavel's ``simulate_scheduler_with_trace``."""
    import sys

    from libs.sim.loaders import DEFAULT_TRACES_DIR

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m libs.sim.loaders.gavel_recipe RECIPE (e.g. rate=6,seed=1)")
        return 2
    tputs = load_throughputs(DEFAULT_TRACES_DIR / "gavel" / "simulation_throughputs.json")
    print("\n".join(gavel_trace_lines(Recipe.parse(args[0]), tputs)))
    return 0


__all__ = [
    "CLUSTER",
    "GPUS_PER_NODE",
    "JOB_TYPES",
    "GeneratedJob",
    "Recipe",
    "gavel_trace_lines",
    "generate",
    "load_gavel_recipe",
]


if __name__ == "__main__":
    raise SystemExit(main())
