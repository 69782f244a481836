"""The executor service: flags → one NodeExecutor per hosted node → serve until stopped."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
from pathlib import Path
from urllib.parse import quote

from libs.bus import ServiceContext, common_arg_parser
from libs.bus.nodeargs import add_node_spec_arg, node_specs_from_args
from libs.bus.runtime import env_float
from libs.bus.tasks import cancel_and_wait
from proto.validation import MAX_CHECKPOINT_COST_S
from services.executor.executor import REPORT_INTERVAL_S, NodeExecutor
from services.executor.journal import Journal
from services.executor.local import LocalRunner, RunAs
from services.executor.power import PowerHooks
from services.executor.runners import Runner, SimRunner
from services.executor.stepping import participate

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
    add_power_args(p)
    add_checkpoint_args(p)
    return p


def add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    """Checkpoint-preemption (issue 14; services.executor.checkpoint)."""
    p.add_argument(
        "--checkpoint-cost-s",
        type=float,
        default=env_float("MOSAIC_EXECUTOR_CHECKPOINT_COST_S", "-1"),
        help="sim mode: Mosaic seconds a checkpoint takes, the job holding its GPUs, unless the "
        "command says (env MOSAIC_EXECUTOR_CHECKPOINT_COST_S; default: the policy's "
        "preempt.checkpoint_cost_s, 30, as in the simulator)",
    )
    p.add_argument(
        "--checkpoint-root",
        default=os.environ.get("MOSAIC_EXECUTOR_CHECKPOINT_ROOT") or None,
        help="local mode: where each job gets its checkpoint directory, the same for all its "
        "attempts (MOSAIC_CHECKPOINT_DIR); shared storage lets an attempt resume on another "
        "node (env MOSAIC_EXECUTOR_CHECKPOINT_ROOT; default WORK_ROOT/checkpoints)",
    )


def add_power_args(p: argparse.ArgumentParser) -> None:
    """Node power (issue 13; services.executor.power) and the stepped clock's name."""
    p.add_argument(
        "--boot-s",
        type=float,
        default=env_float("MOSAIC_EXECUTOR_BOOT_S", "-1"),
        help="Mosaic seconds a woken node takes to boot (env MOSAIC_EXECUTOR_BOOT_S; default: "
        "the policy's resume_s, as in the simulator)",
    )
    p.add_argument(
        "--suspend-command",
        default=os.environ.get("MOSAIC_POWER_SUSPEND_CMD", ""),
        help="operator hook that really suspends the node, e.g. 'systemctl suspend' (env "
        "MOSAIC_POWER_SUSPEND_CMD; default none: suspend changes the reported state only)",
    )
    p.add_argument(
        "--wake-command",
        default=os.environ.get("MOSAIC_POWER_WAKE_CMD", ""),
        help="operator hook that wakes the node, e.g. an IPMI or wake-on-LAN call (env "
        "MOSAIC_POWER_WAKE_CMD; default none); MOSAIC_NODE names the node",
    )
    p.add_argument(
        "--step-name",
        default=os.environ.get("MOSAIC_STEP_PARTICIPANT", NAME),
        help="stepped clock only: this process's participant name (clock.ack.<name>; env "
        "MOSAIC_STEP_PARTICIPANT; must be 'executor' or start with 'executor.')",
    )


def validate(args: argparse.Namespace) -> None:
    node_specs_from_args(args.node_spec)
    if args.report_interval <= 0:
        raise SystemExit("--report-interval must be > 0")
    cost_s = args.checkpoint_cost_s
    if cost_s != -1 and not (math.isfinite(cost_s) and 0 <= cost_s <= MAX_CHECKPOINT_COST_S):
        raise SystemExit(f"--checkpoint-cost-s must be 0-{MAX_CHECKPOINT_COST_S:g}, got {cost_s}")
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
        ckpt_root = getattr(args, "checkpoint_root", None)
        runner = LocalRunner(
            log_dir,
            work_root,
            run_as,
            extra_env=ctx.clock.env(),
            checkpoint_root=Path(ckpt_root) if ckpt_root else None,
        )
        ctx.log.info(
            "local_mode", log_dir=str(log_dir), work_root=str(work_root), run_as=run_as.name
        )
    ctx.log.info("executor_state", state_dir=str(state_root), persistent=persistent)
    interval_s = getattr(args, "report_interval", REPORT_INTERVAL_S)
    boot_s = getattr(args, "boot_s", -1.0)
    cost_s = getattr(args, "checkpoint_cost_s", -1.0)
    hooks = PowerHooks(
        suspend=getattr(args, "suspend_command", "") or "",
        wake=getattr(args, "wake_command", "") or "",
    )
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
            boot_s=None if boot_s is None or boot_s < 0 else boot_s,
            power_hooks=hooks,
            checkpoint_cost_s=cost_s if cost_s is not None and cost_s >= 0 else None,
        )
        for n in nodes
    ]
    stepping: asyncio.Task[None] | None = None
    try:
        for e in executors:
            await e.start()
        if ctx.clock.stepped and executors:
            name = getattr(args, "step_name", NAME) or NAME
            stepping = asyncio.create_task(participate(executors, name), name="steps")
        await ctx.stop.wait()
    finally:
        await cancel_and_wait(stepping)
        for e in executors:
            await e.shutdown()
