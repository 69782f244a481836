"""The executor service: flags → one NodeExecutor per hosted node → serve until stopped."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from libs.bus import ServiceContext, common_arg_parser
from libs.bus.nodeargs import add_node_spec_arg, node_specs_from_args
from services.executor.executor import NodeExecutor
from services.executor.runners import LocalRunner, Runner, SimRunner

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
    return p


def validate(args: argparse.Namespace) -> None:
    node_specs_from_args(args.node_spec)


async def main(ctx: ServiceContext) -> None:
    nodes = node_specs_from_args(ctx.args.node_spec)
    runner: Runner
    if ctx.args.mode == "sim":
        runner = SimRunner(ctx.clock)
    else:
        log_dir = Path(ctx.args.log_dir or tempfile.mkdtemp(prefix="mosaic-executor-"))
        runner = LocalRunner(log_dir)
        ctx.log.info("local_mode", log_dir=str(log_dir))
    executors = [NodeExecutor(ctx.bus, n, runner, ctx.clock, ctx.log) for n in nodes]
    for e in executors:
        await e.start()
    try:
        await ctx.stop.wait()
    finally:
        for e in executors:
            await e.shutdown()
