"""The executor service: flags → one NodeExecutor per hosted node → serve until stopped."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from urllib.parse import quote

from libs.bus import ServiceContext, common_arg_parser
from libs.bus.nodeargs import add_node_spec_arg, node_specs_from_args
from libs.bus.runtime import env_float
from services.executor.executor import REPORT_INTERVAL_S, NodeExecutor
from services.executor.journal import Journal
from services.executor.local import LocalRunner, RunAs
from services.executor.runners import Runner, SimRunner

NAME = "executor"


def arg_parser() -> argparse.ArgumentParser:
    p = common_arg_parser(NAME)
    p.add_argument(
        "--mode",
        choices=["sim", "local"],
        required=True,
        help="sim: sleep the job's runtime on the Mosaic clock; local: run spec.command",
    )
    add_node_spec_arg(p)
    p.add_argument(
        "--log-dir",
        default=None,
        help="local mode: where each job's output goes (default: a new temporary directory)",
    )
    p.add_argument(
        "--state-dir",
        default=os.environ.get("MOSAIC_EXECUTOR_STATE_DIR") or None,
        help="the journal of running attempts, one subdirectory per node, so a restarted "
        "executor re-adopts them (env MOSAIC_EXECUTOR_STATE_DIR; default: a new temporary "
        "directory, i.e. nothing survives a restart)",
    )
    p.add_argument(
        "--report-interval",
        type=float,
        default=env_float("MOSAIC_EXECUTOR_REPORT_INTERVAL_S", str(REPORT_INTERVAL_S)),
        help="wall seconds between two reports of what runs on executor.<node> "
        "(env MOSAIC_EXECUTOR_REPORT_INTERVAL_S)",
    )
    p.add_argument(
        "--run-as",
        default=os.environ.get("MOSAIC_RUN_AS") or None,
        help="local mode: the user jobs run as (env MOSAIC_RUN_AS; default nobody when the "
        "executor is root, else the executor's own user; never root)",
    )
    p.add_argument(
        "--work-root",
        default=os.environ.get("MOSAIC_EXECUTOR_WORK_ROOT") or None,
        help="local mode: where each job gets its working directory, which must be reachable "
        "by the run-as user (env MOSAIC_EXECUTOR_WORK_ROOT; default: a new temporary directory)",
    )
    return p


def validate(args: argparse.Namespace) -> None:
    node_specs_from_args(args.node_spec)
    if args.report_interval <= 0:
        raise SystemExit("--report-interval must be > 0")
    if args.mode == "local":
        try:
            RunAs.resolve(args.run_as)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None


def _work_root(configured: str | None) -> Path:
    if configured:
        root = Path(configured)
        root.mkdir(parents=True, exist_ok=True)
        return root
    root = Path(tempfile.mkdtemp(prefix="mosaic-jobs-"))
    root.chmod(0o711)  # the run-as user reaches its own directory, lists nobody else's
    return root


async def main(ctx: ServiceContext) -> None:
    args = ctx.args
    nodes = node_specs_from_args(args.node_spec)
    state_dir = getattr(args, "state_dir", None)
    persistent = bool(state_dir)
    state_root = Path(state_dir or tempfile.mkdtemp(prefix="mosaic-executor-state-"))
    runner: Runner
    if args.mode == "sim":
        runner = SimRunner(ctx.clock)
    else:
        log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="mosaic-executor-"))
        work_root = _work_root(getattr(args, "work_root", None))
        run_as = RunAs.resolve(getattr(args, "run_as", None))
        runner = LocalRunner(log_dir, work_root, run_as, extra_env=ctx.clock.env())
        ctx.log.info(
            "local_mode", log_dir=str(log_dir), work_root=str(work_root), run_as=run_as.name
        )
    ctx.log.info("executor_state", state_dir=str(state_root), persistent=persistent)
    interval_s = getattr(args, "report_interval", REPORT_INTERVAL_S)
    executors = [
        NodeExecutor(
            ctx.bus,
            n,
            runner,
            ctx.clock,
            ctx.log,
            journal=Journal(state_root / quote(n.id, safe="._-")),
            report_interval_s=interval_s,
            keep_on_stop=persistent,
        )
        for n in nodes
    ]
    try:
        for e in executors:
            await e.start()
        await ctx.stop.wait()
    finally:
        for e in executors:
            await e.shutdown()
