"""The telemetry service: put each hosted NodeSpec into KV ``nodes``, then publish
``telemetry.<node>`` every ``--interval-s`` wall seconds (plain NATS: the latest sample wins).

The sim backend follows the ledger (KV watch) so busy GPUs look busy, and its nodes' executor
reports (``executor.<node>``) so an asleep node's GPUs read as off, in samples flagged
``asleep`` (issue 13: the placer does not take them, or the node's silence, for a failure). The
nvml backend reads the machine and ignores both: an asleep machine publishes nothing at all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from libs.bus import ServiceContext, common_arg_parser
from libs.bus.nodeargs import add_node_spec_arg, node_specs_from_args
from libs.bus.refusals import refused
from proto import subjects
from proto.ledger import Allocation
from proto.nodes import ExecutorReport, NodeSpec
from proto.validation_records import revalidate_allocation
from services.telemetry import metrics
from services.telemetry.backends import (
    GpuBackend,
    HotSpot,
    NvmlGpuBackend,
    NvmlUnavailable,
    SimulatedGpuBackend,
)

NAME = "telemetry"


def arg_parser() -> argparse.ArgumentParser:
    p = common_arg_parser(NAME)
    p.add_argument(
        "--backend",
        choices=["sim", "nvml"],
        required=True,
        help="sim: model GPUs from the ledger; nvml: read this machine's GPUs (no fallback)",
    )
    add_node_spec_arg(p, required=False)
    p.add_argument("--node-id", default=None, help="nvml: node id (default: the host name)")
    p.add_argument("--interval-s", type=float, default=5.0, help="wall seconds between samples")
    p.add_argument("--seed", type=int, default=0, help="sim: random seed")
    p.add_argument(
        "--hot",
        action="append",
        default=[],
        metavar="[NODE:]GPU:TEMP",
        help="sim: pin a GPU at a temperature, e.g. 0:90 (repeatable)",
    )
    return p


def build_backend(args: argparse.Namespace) -> GpuBackend:
    """The backend the flags ask for; ValueError (a usage error) on bad flags, NvmlUnavailable
    when nvml is asked for and cannot run."""
    if args.interval_s <= 0:
        raise ValueError(f"--interval-s must be > 0, got {args.interval_s}")
    if args.backend == "sim":
        nodes = node_specs_from_args(args.node_spec)
        if not nodes:
            raise ValueError("--backend sim needs at least one --node-spec")
        hot = [HotSpot.parse(h) for h in args.hot]
        return SimulatedGpuBackend(nodes, seed=args.seed, hot=hot)
    if args.node_spec:
        raise ValueError(
            "--backend nvml reads the node from the machine: use --node-id, not --node-spec"
        )
    if args.hot:
        raise ValueError("--hot only applies to --backend sim")
    return NvmlGpuBackend(args.node_id)


def validate(args: argparse.Namespace) -> None:
    """Build the backend before connecting, so a bad flag or a missing driver is a clear
    message and a non-zero exit, not a log line from a running service."""
    try:
        args.gpu_backend = build_backend(args)
    except NvmlUnavailable as exc:
        raise ValueError(str(exc)) from None


async def main(ctx: ServiceContext) -> None:
    backend: GpuBackend = getattr(ctx.args, "gpu_backend", None) or build_backend(ctx.args)
    await run_telemetry(ctx, backend, ctx.args.interval_s)


async def run_telemetry(ctx: ServiceContext, backend: GpuBackend, interval_s: float) -> None:
    nodes_kv = await ctx.bus.kv(subjects.KV_NODES, NodeSpec)
    for spec in backend.node_specs():
        await nodes_kv.put(spec.id, spec)
        ctx.log.info(
            "node_registered",
            node=spec.id,
            gpu_model=spec.gpu_model,
            gpus=spec.gpu_count,
            backend=backend.name,
        )
    watch = None
    if isinstance(backend, SimulatedGpuBackend):
        ledger: dict[str, Allocation] = {}
        ledger_kv = await ctx.bus.kv(subjects.KV_LEDGER, Allocation)
        sim = backend

        hosted = {n.id: n for n in sim.nodes}

        async def on_ledger(job_id: str, alloc: Allocation | None) -> None:
            """An unsound allocation (infinite memory: every later sample would carry it and
            no reader could decode one) counts as absent."""
            errs = [] if alloc is None else revalidate_allocation(alloc, hosted.get(alloc.node))
            if alloc is None or refused(ctx.bus, "allocation", errs, key=job_id):
                ledger.pop(job_id, None)
            else:
                ledger[job_id] = alloc
            sim.set_allocations(ledger.values())

        watch = await ledger_kv.watch(on_ledger)

        async def on_report(report: ExecutorReport) -> None:
            if report.node in hosted:
                sim.set_asleep(report.node, report.power.state == "asleep")

        for node_id in hosted:
            await ctx.bus.subscribe(subjects.executor_report(node_id), ExecutorReport, on_report)
    try:
        while not ctx.stop.is_set():
            try:
                now = ctx.clock.now()
                if isinstance(backend, SimulatedGpuBackend):
                    samples = backend.sample(now)  # cheap, and shares state with the watch
                else:
                    samples = await asyncio.to_thread(backend.sample, now)  # NVML calls block
                for s in samples:
                    metrics.record(s)
                    await ctx.bus.publish(subjects.telemetry(s.node), s, durable=False)
            except Exception as exc:  # a failed read or publish: say so, try next interval
                ctx.log.warning("sample_failed", error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stop.wait(), interval_s)
    finally:
        if watch is not None:
            await watch.stop()
        close = getattr(backend, "close", None)
        if close is not None:
            close()
