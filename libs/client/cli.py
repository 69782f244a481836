"""The ``mosaic`` command line: start a local cluster, submit and inspect jobs, simulate.

Slurm's vocabulary on purpose (``submit`` ~ sbatch, ``queue`` ~ squeue, ``nodes`` ~ sinfo,
``cancel`` ~ scancel): operators already think in it. Every error is one clear line on stderr
and a non-zero exit (2 for bad input or a refused job, 1 for anything else), never a traceback.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from libs.calibrate.cli import register as register_calibrate
from libs.client.api import DEFAULT_GATEWAY, ClientError, GatewayUnreachable
from libs.client.cli_bench import register as register_bench
from libs.client.cli_cordon import register as register_cordon
from libs.client.cli_explain import explain
from libs.client.cli_policy import register as register_policy
from libs.client.cli_profiles import register as register_profiles
from libs.client.cli_services import register as register_services
from libs.client.cli_sim import register as register_sim
from libs.client.cli_tenants import client_for, register
from libs.client.errors import Refused, Unavailable, UsageProblem
from libs.client.specs import FlagError, build_spec, server_now
from libs.client.supervisor import StackError
from libs.client.tables import jobs_table, nodes_table

app = typer.Typer(
    name="mosaic",
    help="Mosaic: a scheduler for heterogeneous GPU clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)
register(app)  # the global --token option and `mosaic tenant ...`
register_cordon(app)  # `mosaic cordon NODE` and `mosaic uncordon NODE` (issue 13)
register_bench(app)  # `mosaic bench placer`
register_profiles(app)  # `mosaic profiles` (issue 15)
app.command()(explain)  # `mosaic explain JOB`
register_calibrate(app)  # `mosaic calibrate` (issue 15)
register_policy(app)  # `mosaic policy [--at HH:MM]` (issue 16)
register_services(app)  # `mosaic services`, `mosaic service apply|rm` (issue 16)
register_sim(app)  # `mosaic sim`
GatewayOpt = Annotated[str, typer.Option("--gateway", envvar="MOSAIC_GATEWAY", help="gateway URL")]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("mosaic-scheduler")
    except Exception:
        return "0.1.0 (not installed)"


# --- mosaic up -------------------------------------------------------------------------------
@app.command()
def up(
    demo: Annotated[bool, typer.Option("--demo", help="also run the demo workload")] = False,
    nodes: Annotated[
        int | None, typer.Option("--nodes", help="the seed mix scaled to about N nodes")
    ] = None,
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="cluster JSON file (groups and/or nodes)")
    ] = None,
    clock_factor: Annotated[
        float, typer.Option("--clock-factor", help="Mosaic time speed-up")
    ] = 60.0,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="NATS state and logs")] = Path(
        ".mosaic"
    ),
    port: Annotated[int, typer.Option("--port", help="gateway HTTP port")] = 8080,
    duration: Annotated[
        float | None, typer.Option("--duration", help="stop after S wall seconds")
    ] = None,
    no_live: Annotated[
        bool, typer.Option("--no-live", help="periodic summary lines instead of the live view")
    ] = False,
    rate: Annotated[float, typer.Option("--rate", help="demo jobs per wall second")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="demo workload seed")] = 0,
    keep_state: Annotated[
        bool, typer.Option("--keep-state", help="keep the previous run's streams")
    ] = False,
    nats_cluster: Annotated[
        int, typer.Option("--nats-cluster", help="NATS servers in one JetStream cluster (R=N)")
    ] = 1,
    policy_file: Annotated[
        Path | None, typer.Option("--policy-file", help="policy.json every service runs")
    ] = None,
) -> None:
    """Start NATS, every service and a simulated cluster; Ctrl-C stops everything."""
    from libs.client.up import UpOptions, run_up

    if clock_factor <= 0:
        raise UsageProblem(f"--clock-factor must be > 0, got {clock_factor}")
    if rate <= 0:
        raise UsageProblem(f"--rate must be > 0, got {rate}")
    if nats_cluster not in (1, 3, 5):
        raise UsageProblem(f"--nats-cluster must be 1, 3 or 5, got {nats_cluster}")
    opts = UpOptions(
        nodes=_cluster(nodes, cluster),
        data_dir=data_dir.resolve(),
        clock_factor=clock_factor,
        port=port,
        demo=demo,
        demo_rate_per_s=rate,
        seed=seed,
        duration_s=duration,
        live=not no_live and out.is_terminal,
        keep_state=keep_state,
        nats_cluster=nats_cluster,
        policy_file=_checked_policy_file(policy_file),
    )
    code = asyncio.run(run_up(opts, out))
    raise typer.Exit(code)


def _checked_policy_file(path: Path | None) -> Path | None:
    """``path`` once it loads (a bad field stops here, not in every service's log)."""
    if path is not None:
        from libs.policy_io.policy_file import load_policy_file

        try:
            load_policy_file(path)
        except ValueError as exc:
            raise UsageProblem(str(exc)) from None
    return path


def _cluster(nodes: int | None, cluster: Path | None) -> list:
    from libs.policy import inventory
    from libs.policy_io.cluster_file import load_cluster_file

    if nodes is not None and cluster is not None:
        raise UsageProblem("give --nodes or --cluster, not both")
    if cluster is not None:
        try:
            return load_cluster_file(cluster.read_bytes())
        except OSError as exc:
            raise UsageProblem(f"--cluster {cluster}: {exc.strerror}") from None
        except ValueError as exc:  # msgspec errors are ValueErrors too
            raise UsageProblem(f"--cluster {cluster}: {exc}") from None
    if nodes is not None:
        if nodes < 1:
            raise UsageProblem(f"--nodes must be >= 1, got {nodes}")
        # the seed mix averages 6.8 GPUs per node (0.4*8 + 0.3*4 + 0.3*8)
        return inventory.seed_cluster(max(1, round(nodes * 6.8)))
    return inventory.demo_cluster()


# --- mosaic submit ---------------------------------------------------------------------------
@app.command()
def submit(
    gpus: Annotated[float, typer.Option("--gpus", help="GPUs (0.5 = half a GPU)")] = 1.0,
    gpu_mem: Annotated[float, typer.Option("--gpu-mem", help="GPU memory per GPU, GB")] = 8.0,
    mem: Annotated[str, typer.Option("--mem", help="host memory, e.g. 128G or 512M")] = "16G",
    cpus: Annotated[float, typer.Option("--cpus")] = 4.0,
    constraint: Annotated[
        list[str] | None,
        typer.Option("--constraint", "-C", help="allowed GPU models (repeat or comma list)"),
    ] = None,
    priority: Annotated[int, typer.Option("--priority", help="0-9, >= 7 is high")] = 5,
    deadline: Annotated[
        str | None, typer.Option("--deadline", help="30m, 2h, 1d from now, or unix time")
    ] = None,
    workload_class: Annotated[str, typer.Option("--class", help="workload class")] = "other",
    elastic: Annotated[str | None, typer.Option("--elastic", help="MIN:MAX GPUs")] = None,
    checkpointable: Annotated[bool, typer.Option("--checkpointable")] = False,
    energy_sensitivity: Annotated[float, typer.Option("--energy-sensitivity")] = 0.0,
    runtime: Annotated[
        str, typer.Option("--runtime", help="estimated runtime on the reference GPU")
    ] = "1h",
    tenant: Annotated[str, typer.Option("--tenant")] = "default",
    job_id: Annotated[str | None, typer.Option("--id", help="job id (default: assigned)")] = None,
    kind: Annotated[str, typer.Option("--kind", help="training or inference")] = "training",
    command: Annotated[str | None, typer.Option("--command")] = None,
    latency_p99_ms: Annotated[
        float | None, typer.Option("--latency-p99-ms", help="p99 target (shares only within it)")
    ] = None,
    solo_latency_p99_ms: Annotated[
        float | None, typer.Option("--solo-latency-p99-ms", help="p99 alone on a GPU")
    ] = None,
    gateway: GatewayOpt = DEFAULT_GATEWAY,
) -> None:
    """Submit a job (like sbatch); prints its id."""
    try:
        spec = build_spec(
            gpus=gpus,
            gpu_mem=gpu_mem,
            mem=mem,
            cpus=cpus,
            constraint=constraint,
            priority=priority,
            deadline=deadline,
            workload_class=workload_class,
            elastic=elastic,
            checkpointable=checkpointable,
            energy_sensitivity=energy_sensitivity,
            runtime=runtime,
            tenant=tenant,
            job_id=job_id,
            kind=kind,
            command=command,
            latency_p99_ms=latency_p99_ms,
            solo_latency_p99_ms=solo_latency_p99_ms,
            now=lambda: server_now(gateway),
        )
    except FlagError as exc:
        raise UsageProblem(str(exc)) from None
    try:
        resp = client_for(gateway).submit(spec)
    except GatewayUnreachable:
        raise
    except ClientError as exc:
        if exc.status in (400, 403):
            raise Refused(f"job refused: {exc.one_line()}") from None
        raise
    note = " (duplicate: already submitted)" if resp.duplicate else ""
    out.print(f"{resp.job.id}{note}", highlight=False)


# --- mosaic queue / nodes / cancel / show ----------------------------------------------------
@app.command()
def queue(
    all_: Annotated[bool, typer.Option("--all", "-a", help="finished jobs too")] = False,
    state: Annotated[str | None, typer.Option("--state", help="only this state")] = None,
    gateway: GatewayOpt = DEFAULT_GATEWAY,
) -> None:
    """Jobs like squeue: ID, TENANT, STATE, PRIO, GPUS, NODE, REASON."""
    jobs = client_for(gateway).jobs(state)
    if not all_ and state is None:
        jobs = [j for j in jobs if j.state not in ("completed", "failed", "cancelled")]
    out.print(jobs_table(jobs))


@app.command()
def nodes(gateway: GatewayOpt = DEFAULT_GATEWAY) -> None:
    """Nodes like sinfo: NODE, MODEL, GPUS, GPU MEM, HOST MEM, TEMP, WATTS, STATE, POWER, REASON."""
    out.print(nodes_table(client_for(gateway).nodes()))


@app.command()
def cancel(job_id: str, gateway: GatewayOpt = DEFAULT_GATEWAY) -> None:
    """Cancel a job (like scancel)."""
    resp = client_for(gateway).cancel(job_id)
    out.print(f"{resp.get('job_id', job_id)}: {resp.get('status', 'cancelling')}", highlight=False)


@app.command()
def show(job_id: str, gateway: GatewayOpt = DEFAULT_GATEWAY) -> None:
    """One job and its lifecycle events."""
    client = client_for(gateway)
    job = client.job(job_id)
    s = job.spec
    out.print(
        f"[bold]{job.id}[/bold]  tenant {job.tenant}  state {job.state}  node {job.node or '-'}"
    )
    if job.reason:
        out.print(f"reason     {job.reason}", highlight=False)
    out.print(
        f"asks       {s.gpus:g} GPU x {s.gpu_mem_gb:g} GB, host {s.host_mem_gb:g} GB, "
        f"{s.cpus:g} CPUs, class {s.workload_class}, priority {s.priority}, "
        f"runtime {s.est_runtime_s / 60:.0f}m"
        + (f", constraints {','.join(s.constraints)}" if s.constraints else ""),
        highlight=False,
    )
    events = client.get_json(f"/v1/jobs/{job_id}/events").get("events", [])
    table = Table(box=None, header_style="bold")
    for col in ("TIME", "EVENT", "NODE", "REASON"):
        table.add_column(col)
    for e in events:
        t = time.strftime("%H:%M:%S", time.localtime(e.get("time", 0)))
        table.add_row(t, e.get("type", "?"), e.get("node") or "-", e.get("reason") or "")
    out.print(table)


# --- version ---------------------------------------------------------------------------------
@app.command()
def version() -> None:
    """Print the version."""
    out.print(f"mosaic {_version()}", highlight=False)


# --- entry point -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """The console script: run the command; any failure becomes one line on stderr."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="mosaic", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except typer.Exit as exc:
        return exc.exit_code
    except (UsageProblem, Refused) as exc:
        return _fail(str(exc), 2)
    except (Unavailable, StackError) as exc:
        return _fail(str(exc), 1)
    except typer.Abort:
        return _fail("aborted", 130)
    except typer.TyperException as exc:  # click's UsageError / ClickException, as vendored
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":
            return 0  # typer has printed the help already
        hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
        return _fail(exc.format_message() + hint, getattr(exc, "exit_code", 1))
    except ClientError as exc:
        return _fail(exc.one_line(), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as exc:  # the promise: never a traceback
        return _fail(f"{type(exc).__name__}: {exc}", 1)


def _fail(message: str, code: int) -> int:
    err.print(f"error: {message}", highlight=False, markup=False, soft_wrap=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
