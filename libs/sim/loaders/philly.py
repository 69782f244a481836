"""Microsoft Philly (ATC'19) jobs as published with Sia (SOSP'23): ``sia_philly_jobs.csv.gz``.

The file gives submit time, duration, GPU count and virtual cluster (VC) for 82,247 jobs; all
other scheduler fields are filled by the shared seeded rules. The VC becomes the tenant, since a
VC is Philly's unit of quota and sharing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from libs.sim.loaders._csv import column, read_csv
from libs.sim.loaders.assemble import assemble
from libs.sim.loaders.fill import MAX_GPUS, Filler, reference_runtime_note
from libs.sim.trace import Trace

FILE = Path("philly-derived") / "sia_philly_jobs.csv.gz"


def load_philly(traces_dir: Path, *, seed: int = 0) -> Trace:
    path = traces_dir / FILE
    cols, rows = read_csv(path, ("timestamp", "duration", "num_gpus", "cluster"))
    n_rows = len(rows)
    try:
        stamp = np.array(column(rows, cols["timestamp"]), dtype="datetime64[s]").astype(np.int64)
        duration = np.array(column(rows, cols["duration"]), dtype=float)
        gpus = np.array(column(rows, cols["num_gpus"]), dtype=float)
    except ValueError as exc:
        raise ValueError(f"{path}: unparsable value: {exc}") from None
    vc = column(rows, cols["cluster"])

    bad_duration = ~(duration > 0)
    too_big = gpus > MAX_GPUS
    bad_gpus = ~(gpus >= 1) | (gpus != np.floor(gpus))
    keep = ~(bad_duration | too_big | bad_gpus)
    idx = np.flatnonzero(keep)
    start = int(stamp.min()) if n_rows else 0

    f = Filler(seed)
    f.note(
        f"philly: {n_rows} rows read; dropped {int(bad_duration.sum())} with duration <= 0, "
        f"{int((too_big & ~bad_duration).sum())} with more than {MAX_GPUS} GPUs, "
        f"{int((bad_gpus & ~bad_duration & ~too_big).sum())} with a GPU count that is not a "
        f"positive whole number; {len(idx)} kept"
    )
    f.note("philly: submit_s = timestamp - earliest timestamp in the file (trace start)")
    f.note("philly: tenant = the job's virtual cluster (vc-<hash>)")
    f.note(reference_runtime_note("Philly (12 GB and 24 GB GPUs, models undisclosed)"))
    ids = [f"philly-{i}" for i in idx.tolist()]
    tenants = [f"vc-{vc[i]}" for i in idx.tolist()]
    return assemble(
        name="philly",
        source="philly",
        filler=f,
        ids=ids,
        submit_s=(stamp[idx] - start).astype(float),
        gpus=gpus[idx],
        runtime_s=duration[idx],
        tenants=tenants,
    )
