"""One calibration's fixed setting, and the replays it scores: peers and default once, trials.

Why the peers are cached in ``DIR/peers.json``: the baselines and the default config do not
change between trials, so they are replayed once per part (train, holdout) and every trial,
worker and resumed run reads them from there. The cache is keyed by the setting: a ``DIR``
made for another trace, cluster or split is refused, naming the field, never mixed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from libs.calibrate.split import PARTS, Split, split_by_time
from libs.policy.config import PolicyConfig

PEERS = ("fifo", "drf", "tiresias", "gavel")
SETUP_FILE = "setup.json"
PEERS_FILE = "peers.json"


@dataclass(frozen=True, slots=True)
class Setup:
    """What every replay of one calibration shares (``DIR/setup.json``)."""

    trace: str
    cluster: str
    gpus: int | None = None
    max_jobs: int | None = None
    load: float | None = None
    load_basis: str = "fastest"
    seed: int = 0
    holdout_frac: float = 0.3
    traces_dir: str | None = None
    # who may suspend idle nodes (libs.sim.power_saving): "all", so the energy term compares
    # decisions; the peers of a "mosaic" setting draw idle power Mosaic is allowed to save
    power_saving: str = "all"
    # the share of each coefficient's range searched on each side of its default
    # (space.near_defaults; 1: the whole range)
    radius: float = 1.0
    # fill seeds each config is scored on (seed, seed + 1, ...), the score their mean: one draw
    # of priorities and deadlines is not what a config is fitted to
    train_seeds: int = 1
    objective: dict[str, Any] | None = None  # Objective.as_dict(): trials scored alike

    def __post_init__(self) -> None:
        # checked before setup.json is written: a folder must not keep a setting that cannot run
        from libs.sim.power_saving import check_mode
        from libs.sim.runner import LOAD_BASES

        check_mode(self.power_saving)
        if not (self.radius > 0 and self.radius <= 1):
            raise ValueError(f"--radius must be in (0, 1], got {self.radius}")
        if self.load_basis not in LOAD_BASES:
            raise ValueError(f"--load-basis must be one of {LOAD_BASES}, got {self.load_basis!r}")
        if self.train_seeds < 1:
            raise ValueError(f"--train-seeds must be >= 1, got {self.train_seeds}")
        if self.max_jobs is not None and self.max_jobs < 2:
            raise ValueError(f"--max-jobs must be >= 2 (one job on each side), got {self.max_jobs}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def fill_seeds(self) -> list[int]:
        """The fill seeds every config is scored on, the setting's own first."""
        return [self.seed + i for i in range(self.train_seeds)]


def replay(
    setup: Setup,
    split: Split,
    part: str,
    policies: list[str],
    cfg: PolicyConfig | None,
    seed: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Each policy's metrics on ``part`` of the trace (Mosaic with ``cfg``, None: defaults),
    filled with ``seed`` (None: the setting's own)."""
    from libs.sim.runner import run_simulation

    res = run_simulation(
        setup.trace,
        setup.cluster,
        setup.gpus or 0,
        policies,
        None,
        seed=setup.seed if seed is None else seed,
        max_jobs=setup.max_jobs,
        load=setup.load,
        load_basis=setup.load_basis,
        traces_dir=Path(setup.traces_dir) if setup.traces_dir else None,
        base_cfg=cfg,
        window_s=split.window(part),
        power_saving=setup.power_saving,
    )
    return res["policies"]


def compute_split(setup: Setup) -> Split:
    """The time split of the setup's trace (loaded as the replays load it)."""
    from libs.sim.loaders import load_trace

    tr = load_trace(
        setup.trace,
        traces_dir=Path(setup.traces_dir) if setup.traces_dir else None,
        seed=setup.seed,
        max_jobs=setup.max_jobs,
    )
    return split_by_time(tr, setup.holdout_frac)


def open_dir(out: Path, setup: Setup) -> Split:
    """Make or reopen calibration folder ``out`` for ``setup``; its split.

    A folder made with another setting raises ValueError naming each field that differs.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / SETUP_FILE
    mine = setup.as_dict()
    if path.exists():
        saved = json.loads(path.read_text())
        theirs = saved.get("setup", {})
        diff = [k for k in mine if theirs.get(k) != mine[k]]
        if diff:
            shown = ", ".join(f"{k}: {theirs.get(k)!r} there, {mine[k]!r} now" for k in diff)
            raise ValueError(f"{out} was made with another setting ({shown}); use a new --out")
        return Split(**saved["split"])
    split = compute_split(setup)
    path.write_text(json.dumps({"setup": mine, "split": split.as_dict()}, indent=2) + "\n")
    return split


def peers(
    out: Path, setup: Setup, split: Split, seed: int | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """{part: {policy: metrics}} of the baselines and default Mosaic, replayed once, filled
    with ``seed`` (None: the setting's own, in ``PEERS_FILE``; another in its own file)."""
    own = seed is None or seed == setup.seed
    path = out / (PEERS_FILE if own else f"peers.seed{seed}.json")
    if path.exists():
        return json.loads(path.read_text())
    got = {part: replay(setup, split, part, [*PEERS, "mosaic"], None, seed) for part in PARTS}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(got) + "\n")
    tmp.replace(path)  # a run killed mid-write leaves no half file
    return got


def baselines_of(part_runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The peers' runs of one part (default Mosaic is not a peer)."""
    return {k: v for k, v in part_runs.items() if k in PEERS}


def seed_peers(out: Path, setup: Setup, split: Split) -> list[dict[str, dict[str, Any]]]:
    """``peers`` of each of the setting's fill seeds, in ``Setup.fill_seeds`` order."""
    return [peers(out, setup, split, s) for s in setup.fill_seeds]


def mean_score(
    objective: Any, runs: list[dict[str, Any]], refs: list[dict[str, Any]], part: str
) -> tuple[float, dict[str, Any], list[float]]:
    """(mean score, the first seed's terms, each seed's score) of one config's ``runs`` (one
    per fill seed) against each seed's peers ``refs`` (``seed_peers``) on ``part``."""
    scores: list[float] = []
    first: dict[str, Any] = {}
    for i, (run, ref) in enumerate(zip(runs, refs, strict=True)):
        score, terms = objective.score(run, baselines_of(ref[part]), ref[part]["mosaic"])
        scores.append(score)
        if i == 0:
            first = terms
    return sum(scores) / len(scores), first, scores
