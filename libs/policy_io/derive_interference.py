"""Derive ``libs/policy/data/interference.json`` from the public co-location measurements in
../shared/traces (kept out of libs.policy, which reads no trace files). Run:
``python -m libs.policy_io.derive_interference [TRACES_DIR] [OUT_JSON]``.

What is derived: the slowdown of a job of workload class A while a job of class B shares its
GPU, ``slowdown(A | B)`` = A's speed alone / A's speed beside B (1.0 = no interference), per
ordered pair of ``proto.jobs.WORKLOAD_CLASSES``, from two sources. Only measurements are
written; pairs nobody measured are estimated at run time by ``libs.policy.interference``.

1. Lucid (ASPLOS'23), ``lucid-colocation/colocate_info.csv``: 1,388 pairs of single-GPU
   training jobs packed on one GPU; ``speed1``/``speed2`` is each job's speed beside the other,
   normalised to running alone. slowdown = 1 / speed. Each row gives two ordered measurements
   (job 1 beside job 2, job 2 beside job 1). Lucid's jobs are small (their solo GPU use is
   ``single_data.csv``'s 20-100%), which is the regime of fractional jobs.
2. Gavel (OSDI'20), ``gavel/simulation_throughputs.json``: both jobs' throughputs when two
   whole-GPU jobs space-share one GPU (k80, p100, v100, scale factor 1, consolidated). Two jobs
   that each wanted the whole GPU lose about half their speed to the share itself, which is
   not interference: a fractional job asked for its share. So a pair is read through the
   *shares*: with normalised throughputs x_a, x_b (each over its isolated figure), the pair
   does S = x_a + x_b of a GPU's work; if speed grows linearly with the share a job gets (an
   assumption), each job runs at 1/S of what its share alone would give, so
   slowdown(A | B) = slowdown(B | A) = max(1, 1 / S). Pairs with a zero throughput (Gavel
   could not co-locate them, mostly memory) are counted as ``infeasible`` and left out: GPU
   memory is a separate, hard filter.

Model names -> classes: ResNet, MobileNet, EfficientNet, VGG, DCGAN, CycleGAN -> cnn; LSTM,
Gavel's LM -> rnn; Transformer -> transformer; NeuMF, Gavel's Recommendation ->
recommendation; PointNet, PPO, TD3, A3C -> other. No source measured inference.

Per ordered class pair and source: the mean of its measurements; the pair's figure is the mean
of the sources that measured it (each source weighs the same, so Lucid's 2,776 ordered rows do
not drown Gavel's), floored at 1.0 (a measured speed-up beside another job is noise or cache
luck, not something to plan on).
"""

from __future__ import annotations

import ast
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

DEFAULT_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "policy" / "data" / "interference.json"

LUCID_CLASS = {
    "ResNet18": "cnn",
    "MobileNetV2": "cnn",
    "MobileNetV3": "cnn",
    "EfficientNet": "cnn",
    "VGG": "cnn",
    "DCGAN": "cnn",
    "LSTM": "rnn",
    "NeuMF": "recommendation",
    "PointNet": "other",
    "PPO": "other",
    "TD3": "other",
    "BERT": "transformer",
}
GAVEL_PREFIX_CLASS = (
    ("ResNet", "cnn"),
    ("CycleGAN", "cnn"),
    ("LM", "rnn"),
    ("Transformer", "transformer"),
    ("Recommendation", "recommendation"),
    ("A3C", "other"),
)
GAVEL_GPUS = ("k80", "p100", "v100")

Samples = dict[tuple[str, str], list[float]]


def gavel_class(job_type: str) -> str:
    for prefix, cls in GAVEL_PREFIX_CLASS:
        if job_type.startswith(prefix):
            return cls
    raise ValueError(f"gavel: no workload class for job type {job_type!r}")


def lucid_samples(path: Path) -> Samples:
    out: Samples = defaultdict(list)
    with path.open() as f:
        for row in csv.DictReader(f):
            a, b = LUCID_CLASS[row["model1"]], LUCID_CLASS[row["model2"]]
            out[(a, b)].append(1.0 / float(row["speed1"]))
            out[(b, a)].append(1.0 / float(row["speed2"]))
    return out


def gavel_samples(path: Path) -> tuple[Samples, int]:
    """(ordered samples, pairs left out as infeasible)."""
    data = json.loads(path.read_text())
    out: Samples = defaultdict(list)
    infeasible = 0
    for gpu in GAVEL_GPUS:
        for key, entry in data[gpu].items():
            job_a, sf_a = ast.literal_eval(key)
            iso_a = entry["null"]
            if sf_a != 1 or not iso_a:
                continue
            for other, pair in entry.items():
                if other == "null":
                    continue
                job_b, sf_b = ast.literal_eval(other)
                if sf_b != 1:
                    continue
                iso_b = data[gpu][repr((job_b, 1))]["null"]
                tput_a, tput_b = pair
                if tput_a <= 0 or tput_b <= 0 or not iso_b:
                    infeasible += 1
                    continue
                combined = tput_a / iso_a + tput_b / iso_b
                out[(gavel_class(job_a), gavel_class(job_b))].append(max(1.0, 1.0 / combined))
    return out, infeasible


def derive(traces: Path) -> dict:
    lucid = lucid_samples(traces / "lucid-colocation" / "colocate_info.csv")
    gavel, infeasible = gavel_samples(traces / "gavel" / "simulation_throughputs.json")
    pairs: dict[str, dict] = {}
    for a, b in sorted(set(lucid) | set(gavel)):
        sources = {}
        for name, samples in (("lucid", lucid), ("gavel", gavel)):
            xs = samples.get((a, b))
            if xs:
                sources[name] = {"mean": round(sum(xs) / len(xs), 4), "n": len(xs)}
        mean = sum(s["mean"] for s in sources.values()) / len(sources)
        pairs[f"{a}|{b}"] = {"slowdown": round(max(1.0, mean), 4), "sources": sources}
    return {
        "what": "slowdown of class A beside class B on one GPU (A alone / A beside B), "
        "measured pairs only; libs.policy.interference estimates the rest",
        "method": "libs/policy_io/derive_interference.py docstring",
        "gavel_infeasible_pairs": infeasible,
        "pairs": pairs,
    }


def main(argv: list[str]) -> None:
    traces = Path(argv[0]) if argv else DEFAULT_TRACES
    out = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    out.write_text(json.dumps(derive(traces), indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
