"""Chronus (SoCC'21) deadline traces: Philly jobs with hard, soft or no deadlines.

The only public trace with explicit deadlines. Its time unit is the MINUTE (the Chronus
simulator counts 60 units per hour); everything here is converted to seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from libs.sim.loaders._csv import column, read_csv
from libs.sim.loaders.assemble import assemble
from libs.sim.loaders.fill import MAX_GPUS, Filler, reference_runtime_note
from libs.sim.trace import Trace

DIR = Path("philly-derived") / "chronus-deadline"
VARIANTS: dict[str, str] = {
    "slo": "trace_job_Philly_SLO.csv",
    "mix1": "trace_job_Philly_MIX1.csv",
    "mix2": "trace_job_Philly_MIX2.csv.gz",
}
MINUTE_S = 60.0
BEST_EFFORT_MAX_PRIORITY = 4
COLUMNS = (
    "job_id",
    "user",
    "num_gpu",
    "submit_time",
    "model_name",
    "duration",
    "expect_time_list",
    "best_effort",
    "job_type",
)


def load_chronus(traces_dir: Path, *, variant: str = "slo", seed: int = 0) -> Trace:
    v = variant.strip().lower()
    if v not in VARIANTS:
        raise ValueError(f"unknown chronus variant {variant!r}; known: {', '.join(VARIANTS)}")
    path = traces_dir / DIR / VARIANTS[v]
    cols, rows = read_csv(path, COLUMNS)
    n_rows = len(rows)
    try:
        gpus = np.array(column(rows, cols["num_gpu"]), dtype=float)
        submit_min = np.array(column(rows, cols["submit_time"]), dtype=float)
        duration_min = np.array(column(rows, cols["duration"]), dtype=float)
        best = np.array(column(rows, cols["best_effort"]), dtype=int) == 1
        # the first deadline of a list is the one that earns the full value
        first_deadline_min = np.array(
            [e.split("-", 1)[0] for e in column(rows, cols["expect_time_list"])], dtype=float
        )
    except ValueError as exc:
        raise ValueError(f"{path}: unparsable value: {exc}") from None
    job_type = column(rows, cols["job_type"])

    no_gpu = ~(gpus >= 1)
    too_big = gpus > MAX_GPUS
    bad_duration = ~(duration_min > 0)
    bad_deadline = ~best & ~(first_deadline_min > 0)
    keep = ~(no_gpu | too_big | bad_duration | bad_deadline)
    idx = np.flatnonzero(keep)

    f = Filler(seed)
    types = {t: job_type.count(t) for t in sorted(set(job_type))}
    f.note(
        f"chronus:{v}: {n_rows} rows ({', '.join(f'{t} {c}' for t, c in types.items())}); "
        f"dropped {int(no_gpu.sum())} with 0 GPUs, {int((too_big & ~no_gpu).sum())} with more "
        f"than {MAX_GPUS} GPUs, {int((bad_duration & ~no_gpu & ~too_big).sum())} with duration "
        f"<= 0, {int((bad_deadline & ~no_gpu & ~too_big & ~bad_duration).sum())} with a "
        f"deadline <= 0; {len(idx)} kept"
    )
    f.note("chronus: times are in minutes in the file; submit, duration, deadline x 60 -> seconds")
    f.note(
        "chronus: deadline = submit + first entry of expect_time_list (relative to submit); "
        "for soft jobs the later, lower-value deadlines are dropped; best_effort=1 -> no deadline"
    )
    f.note("chronus: every model (alexnet, vgg16, resnet101, mobilenet_v2, inception_v3) -> cnn")
    f.note("chronus: tenant = the job's Philly VC (user vc_<hash> -> vc-<hash>)")
    f.note(
        f"chronus: best-effort jobs get priority min(drawn, {BEST_EFFORT_MAX_PRIORITY}); "
        "strict/soft jobs keep the drawn priority"
    )
    f.note(reference_runtime_note("Chronus (Philly-derived)"))

    submit_s = submit_min[idx] * MINUTE_S
    runtime_s = duration_min[idx] * MINUTE_S
    deadline = np.where(best[idx], np.nan, submit_s + first_deadline_min[idx] * MINUTE_S)
    priority = f.priority(len(idx))
    priority = np.where(best[idx], np.minimum(priority, BEST_EFFORT_MAX_PRIORITY), priority)
    users = column(rows, cols["user"])
    ids_col = column(rows, cols["job_id"])
    return assemble(
        name=f"chronus:{v}",
        source=f"chronus:{v}",
        filler=f,
        ids=[f"chronus-{v}-{ids_col[i]}" for i in idx.tolist()],
        submit_s=submit_s,
        gpus=gpus[idx],
        runtime_s=runtime_s,
        tenants=[users[i].replace("vc_", "vc-", 1) for i in idx.tolist()],
        workload_class=["cnn"] * len(idx),
        priority=priority,
        deadline=deadline,
    )
