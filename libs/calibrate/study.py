"""The search: an optuna study over ``space.BOUNDS``, resumable, in parallel processes.

Why optuna's TPE and not CMA-ES (docs/calibration.md says more): the space mixes ints
(``preempt.protect_priority``) with floats on log and linear scales, and each trial is a whole
replay, so a budget is tens of trials, not the thousands CMA-ES's covariance needs in 43
dimensions; TPE works from the first few, handles ints and log scales natively, and optuna's
journal storage lets several processes share one study in a plain file and a killed run
resume from it.

``DIR/study.journal`` holds every trial; ``--trials N`` is the study's total, so a run resumed
with the same ``DIR`` continues the count (trial numbers go on from where they stopped; a trial
cut off by the kill is marked failed and does not count). The study's first trial is the
defaults, so the best trial is never worse than the defaults on the train part.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from libs.calibrate import space
from libs.calibrate.evaluate import Setup, mean_score, open_dir, replay, seed_peers
from libs.calibrate.objective import Objective, objective_from_dict
from libs.policy.config import PolicyConfig
from libs.policy_io.overrides import apply_values

STUDY = "calibrate"
JOURNAL = "study.journal"


@dataclass(frozen=True, slots=True)
class Plan:
    """One invocation: the shared setting, the folder, how many trials in all, how many
    worker processes, and the sampler's seed."""

    setup: Setup
    out: Path
    trials: int
    workers: int = 1
    sampler_seed: int = 0

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise ValueError(f"--trials must be >= 1, got {self.trials}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")


def _storage(out: Path) -> Any:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(out / JOURNAL)))


def open_study(out: Path, seed: int) -> Any:
    """The study of folder ``out`` (made on first use, its first trial the defaults)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=STUDY,
        storage=_storage(out),
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=seed),
        load_if_exists=True,
    )
    if not study.trials:
        study.enqueue_trial(space.default_params())
    return study


def counted(study: Any) -> int:
    """Trials that count towards ``--trials``: finished, or running now."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)
    return len(study.get_trials(deepcopy=False, states=states))


def done(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def fail_stale(study: Any) -> int:
    """Mark trials left running by a killed run as failed (no other run uses ``DIR`` now)."""
    from optuna.trial import TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
    return len(stale)


def suggest(trial: Any, bounds: dict[str, space.Bound] | None = None) -> dict[str, float | int]:
    """A point of the space from ``trial`` (ints as ints; log or linear as declared), within
    ``bounds`` (``space.near_defaults``; None: ``space.BOUNDS``)."""
    out: dict[str, float | int] = {}
    for name, b in (space.BOUNDS if bounds is None else bounds).items():
        if space.kind_of(name) is int:
            out[name] = trial.suggest_int(name, int(b.low), int(b.high), log=b.log)
        else:
            out[name] = trial.suggest_float(name, b.low, b.high, log=b.log)
    return out


def config_of(params: dict[str, float | int], where: str) -> PolicyConfig:
    """The config a point of the space stands for."""
    return apply_values(space.to_values(params), where=where)


def _work(plan: Plan, worker: int, after_trial: Callable[[], None] | None = None) -> int:
    """One worker: ask, replay the train part, tell, until the study holds ``plan.trials``;
    the number of trials it ran. ``after_trial`` is called after each (one worker, inline)."""
    objective = objective_of(plan)
    split = open_dir(plan.out, plan.setup)
    refs = seed_peers(plan.out, plan.setup, split)
    probe = open_study(plan.out, plan.sampler_seed)
    # a seed per worker and per history: two workers, or a resumed run, do not draw the same
    seed = plan.sampler_seed * 1000 + worker * 100_003 + len(probe.trials)
    study = open_study(plan.out, seed)
    bounds = space.near_defaults(plan.setup.radius)
    ran = 0
    while counted(study) < plan.trials:
        trial = study.ask()
        cfg = config_of(suggest(trial, bounds), where=f"trial {trial.number}")
        runs = [
            replay(plan.setup, split, "train", ["mosaic"], cfg, s)["mosaic"]
            for s in plan.setup.fill_seeds
        ]
        score, terms, by_seed = mean_score(objective, runs, refs, "train")
        trial.set_user_attr("terms", terms)
        trial.set_user_attr("by_seed", by_seed)
        study.tell(trial, score)
        ran += 1
        if after_trial is not None:
            after_trial()
    return ran


def search(plan: Plan, on_progress: Callable[[int, int, float | None], None] | None) -> Any:
    """Run the workers until the study holds ``plan.trials`` trials; the study.

    ``on_progress(done, total, best)`` is called about once a second (from this process)."""
    study = open_study(plan.out, plan.sampler_seed)
    fail_stale(study)

    def report() -> None:
        if on_progress is not None:
            best = _best_value(study)
            on_progress(done(study), plan.trials, best)

    report()
    if plan.workers == 1:
        _work(plan, 0, report)
    else:
        ctx = get_context("spawn")  # a fresh interpreter per worker: no forked numba state
        with ProcessPoolExecutor(max_workers=plan.workers, mp_context=ctx) as pool:
            futures = [pool.submit(_work, plan, w) for w in range(plan.workers)]
            while not all(f.done() for f in futures):
                time.sleep(1.0)
                report()
            for f in futures:
                f.result()  # a worker's error is the run's error
    report()
    return study


def _best_value(study: Any) -> float | None:
    try:
        return float(study.best_value)
    except ValueError:  # no finished trial yet
        return None


def objective_of(plan: Plan) -> Objective:
    return objective_from_dict(plan.setup.objective)
