"""Trace loaders: public GPU-cluster traces (and a seeded synthetic one) as ``Trace`` objects.

``load_trace("philly")`` is the one entry point the simulator, benchmark and CLI use. Real traces
live in ``../shared/traces`` beside the checkout; ``synthetic`` needs no files.
"""

from __future__ import annotations

from pathlib import Path

from libs.sim.trace import Trace

_ROOT = Path(__file__).resolve().parents[3]  # the checkout: libs/sim/loaders/__init__.py -> root
DEFAULT_TRACES_DIR = _ROOT.parent / "shared" / "traces"

NAMES = (
    "philly",
    "chronus[:slo|mix1|mix2]",
    "openb[:variant]",
    "helios",
    "gavel:FILE",
    "gavel:rate=R[,jobs=N][,seed=S][,multi=0|1]",
    "synthetic[:N]",
)


def default_traces_dir() -> Path:
    return DEFAULT_TRACES_DIR


def _resolve_dir(traces_dir: Path | None) -> Path:
    d = Path(traces_dir) if traces_dir is not None else DEFAULT_TRACES_DIR
    if not d.is_dir():
        raise FileNotFoundError(
            f"trace folder not found: {d} (the public traces live in ../shared/traces beside the "
            "checkout); pass traces_dir, or use --trace synthetic, which needs no files"
        )
    return d


def load_trace(
    name: str,
    *,
    traces_dir: Path | None = None,
    seed: int = 0,
    max_jobs: int | None = None,
    throughputs: Path | None = None,
) -> Trace:
    """Load trace ``name`` (see ``NAMES``), fill missing fields with ``seed``, keep the first
    ``max_jobs`` by submit time. Unknown names raise ValueError listing the known ones."""
    kind, _, arg = name.partition(":")
    kind = kind.strip().lower()
    if kind == "synthetic":
        from libs.sim.loaders.synthetic import DEFAULT_JOBS, load_synthetic

        n = int(arg) if arg else (max_jobs if max_jobs is not None else DEFAULT_JOBS)
        trace = load_synthetic(n_jobs=n, seed=seed)
    elif kind == "philly":
        from libs.sim.loaders.philly import load_philly

        trace = load_philly(_resolve_dir(traces_dir), seed=seed)
    elif kind == "chronus":
        from libs.sim.loaders.chronus import load_chronus

        trace = load_chronus(_resolve_dir(traces_dir), variant=arg or "slo", seed=seed)
    elif kind == "openb":
        from libs.sim.loaders.openb import load_openb

        trace = load_openb(_resolve_dir(traces_dir), variant=arg or "default", seed=seed)
    elif kind == "helios":
        from libs.sim.loaders.helios import load_helios

        trace = load_helios(_resolve_dir(traces_dir), seed=seed)
    elif kind == "gavel":
        from libs.sim.loaders.gavel import load_gavel

        if not arg:
            raise ValueError(
                "gavel needs a trace file or a recipe: gavel:FILE (e.g. gavel:small_test) or "
                "gavel:rate=6,jobs=1000,seed=1"
            )
        if "=" in arg and not Path(arg).exists():  # a recipe (libs.sim.loaders.gavel_recipe)
            from libs.sim.loaders.gavel_recipe import load_gavel_recipe

            base = Path(traces_dir) if traces_dir is not None else DEFAULT_TRACES_DIR
            trace = load_gavel_recipe(arg, traces_dir=base, seed=seed, throughputs=throughputs)
        else:
            trace = load_gavel(arg, traces_dir=traces_dir, seed=seed, throughputs=throughputs)
    else:
        raise ValueError(f"unknown trace {name!r}; known: {', '.join(NAMES)}")
    if max_jobs is not None:
        trace = trace.slice(max_jobs=max_jobs)
    return trace


__all__ = ["DEFAULT_TRACES_DIR", "NAMES", "Trace", "default_traces_dir", "load_trace"]
