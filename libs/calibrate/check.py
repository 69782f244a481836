"""``python -m libs.calibrate.check``: score a policy file on a trace it was not tuned on.

Why: a calibration's holdout is the later part of the same trace, same cluster, same fill seed.
A coefficient set worth adopting must also hold on other traces and seeds. This replays the
baselines, the default config and the file's config on a whole trace (no split) and scores
both configs with the calibration's objective (read from its ``report.json``, or the default
objective), so the figures compare with the report's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from libs.calibrate.evaluate import PEERS
from libs.calibrate.objective import Objective, objective_from_dict
from libs.policy.config import PolicyConfig
from libs.policy_io.policy_file import load_policy_file


def score_policy(
    objective: Objective, cfg: PolicyConfig, run_kwargs: dict[str, Any]
) -> dict[str, Any]:
    """{"default": x, "calibrated": y, "peers": {...}, "terms": {...}} on one whole trace."""
    from libs.sim.runner import run_simulation

    ref = run_simulation(policies=[*PEERS, "mosaic"], out_dir=None, **run_kwargs)["policies"]
    mine = run_simulation(policies=["mosaic"], out_dir=None, base_cfg=cfg, **run_kwargs)
    peers = {n: ref[n] for n in PEERS}
    own = ref["mosaic"]  # the default config's run: the starvation cap
    default, default_terms = objective.score(own, peers, own)
    calibrated, calibrated_terms = objective.score(mine["policies"]["mosaic"], peers, own)
    return {
        "default": default,
        "calibrated": calibrated,
        "peers": {n: objective.score(ref[n], peers, own)[0] for n in PEERS},
        "terms": {"default": default_terms, "calibrated": calibrated_terms},
    }


def objective_from_report(path: Path | None) -> Objective:
    """The objective a calibration recorded in its ``report.json`` (None: the default)."""
    return objective_from_dict(None if path is None else json.loads(path.read_text())["objective"])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m libs.calibrate.check", description=__doc__)
    ap.add_argument("--policy-file", type=Path, required=True)
    ap.add_argument("--report", type=Path, default=None, help="report.json: its objective")
    ap.add_argument("--trace", default="philly")
    ap.add_argument("--cluster", default="seed")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--max-jobs", type=int, default=None)
    ap.add_argument("--load", type=float, default=None)
    ap.add_argument("--load-basis", default="fastest")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--power-saving", default="all", help="mosaic, all or none (as calibrate)")
    ap.add_argument("--out", type=Path, default=None, help="write the scores here (JSON)")
    a = ap.parse_args(argv)
    try:
        cfg = load_policy_file(a.policy_file)
        got = score_policy(
            objective_from_report(a.report),
            cfg,
            {
                "trace": a.trace,
                "cluster": a.cluster,
                "gpus": a.gpus,
                "max_jobs": a.max_jobs,
                "load": a.load,
                "load_basis": a.load_basis,
                "seed": a.seed,
                "power_saving": a.power_saving,
            },
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}")
        return 2
    text = json.dumps(got, indent=2)
    if a.out is not None:
        a.out.write_text(text + "\n")
    print(json.dumps({k: got[k] for k in ("default", "calibrated", "peers")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
