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

from libs.calibrate.evaluate import PEERS, mean_score, open_dir, replay, seed_peers
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
    refs = seed_peers(plan.out, plan.setup, split)  # before the workers: they read the cache
    study = search(plan, on_progress)
    best = study.best_trial
    policy_path = write_policy_file(
        plan.out / POLICY_FILE, config_of(best.params, where=f"trial {best.number}")
    )
    cfg = load_policy_file(policy_path)
    held = [
        replay(plan.setup, split, "holdout", ["mosaic"], cfg, s)["mosaic"]
        for s in plan.setup.fill_seeds
    ]
    parts: dict[str, Any] = {}
    terms: dict[str, Any] = {}
    for part, calibrated_runs in (("train", None), ("holdout", held)):
        own = [ref[part]["mosaic"] for ref in refs]  # the default config's runs
        default, default_terms, default_seeds = mean_score(objective, own, refs, part)
        if calibrated_runs is None:
            calibrated, calibrated_terms = float(best.value), best.user_attrs.get("terms")
            calibrated_seeds = best.user_attrs.get("by_seed", [calibrated])
        else:
            calibrated, calibrated_terms, calibrated_seeds = mean_score(
                objective, calibrated_runs, refs, part
            )
        peer_scores = {
            n: mean_score(objective, [ref[part][n] for ref in refs], refs, part)[0] for n in PEERS
        }
        parts[part] = {
            "default": default,
            "calibrated": calibrated,
            "peers": peer_scores,
            "by_seed": {"seeds": plan.setup.fill_seeds, "default": default_seeds},
        }
        parts[part]["by_seed"]["calibrated"] = calibrated_seeds
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
