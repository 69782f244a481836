"""``mosaic calibrate`` end to end: split, peers, search, then ``policy.json`` and ``report.json``.

Why the holdout is scored from the written file: the figure the report gives for the later part
of the trace is the one an operator gets by loading ``DIR/policy.json`` (``--policy-file``),
not a value kept in memory that the file might not reproduce.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from libs.calibrate.evaluate import PEERS, baselines_of, open_dir, peers, replay
from libs.calibrate.study import Plan, config_of, done, objective_of, search
from libs.policy_io.policy_file import load_policy_file, policy_diff, write_policy_file

POLICY_FILE = "policy.json"
REPORT_FILE = "report.json"


def calibrate(
    plan: Plan, on_progress: Callable[[int, int, float | None], None] | None = None
) -> dict[str, Any]:
    """Run the calibration ``plan`` describes; the report (also written to ``DIR``)."""
    t0 = time.perf_counter()
    objective = objective_of(plan)
    split = open_dir(plan.out, plan.setup)
    ref = peers(plan.out, plan.setup, split)  # before the workers: they read the cache
    study = search(plan, on_progress)
    best = study.best_trial
    policy_path = write_policy_file(
        plan.out / POLICY_FILE, config_of(best.params, where=f"trial {best.number}")
    )
    cfg = load_policy_file(policy_path)
    held = replay(plan.setup, split, "holdout", ["mosaic"], cfg)["mosaic"]
    parts: dict[str, Any] = {}
    terms: dict[str, Any] = {}
    for part, calibrated_run in (("train", None), ("holdout", held)):
        peers_part = baselines_of(ref[part])
        own = ref[part]["mosaic"]  # the default config's run: the starvation cap
        default, default_terms = objective.score(own, peers_part, own)
        if calibrated_run is None:
            calibrated, calibrated_terms = float(best.value), best.user_attrs.get("terms")
        else:
            calibrated, calibrated_terms = objective.score(calibrated_run, peers_part, own)
        peer_scores = {n: objective.score(ref[part][n], peers_part, own)[0] for n in PEERS}
        parts[part] = {"default": default, "calibrated": calibrated, "peers": peer_scores}
        terms[part] = {"default": default_terms, "calibrated": calibrated_terms}
    report = {
        "objective": objective.as_dict(),
        "train": parts["train"],
        "holdout": parts["holdout"],
        "trials": done(study),
        "wall_s": time.perf_counter() - t0,
        "best_trial": best.number,
        "split": split.as_dict(),
        "setup": plan.setup.as_dict(),
        "workers": plan.workers,
        "terms": terms,
        "policy_file": POLICY_FILE,
        "changed": policy_diff(cfg),
    }
    (plan.out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


def report_path(out: Path) -> Path:
    return out / REPORT_FILE
