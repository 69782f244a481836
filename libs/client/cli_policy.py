"""``mosaic policy [--at HH:MM | --time ISO]``: the policy in force now and at another time.

Why: Volcano's users file issues because a rule "silently does not fire"; the day/night calendar
(issue 16) changes weights by the hour, so an operator must be able to see what is in force at
any moment without a running stack. The command reads the defaults, ``--policy-file`` and
``--set`` (the simulator's rules), takes "now" from the Mosaic clock (``libs.clock``, the
deployment's ``MOSAIC_CLOCK_*``) and prints what ``libs.policy.daynight.effective_policy`` gives:
the rank weights per load regime, the score each job kind gets, the inference headroom, the
speed weight and the warm reserve; then the calendar.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo

import typer
from rich.console import Console
from rich.table import Table

from libs.policy.calendar import next_switch_s
from libs.policy.config import REGIMES, PolicyConfig
from libs.policy.daynight import effective_policy
from libs.policy.daynight import in_force as period_sets

out = Console()


def moment_at(cfg: PolicyConfig, now_s: float, at: str | None, iso: str | None) -> float | None:
    """The Mosaic time of ``--at HH:MM`` (that time on now's date, in the calendar's time zone)
    or ``--time ISO`` (a time without an offset is in the calendar's zone); None for neither."""
    zone = ZoneInfo(cfg.calendar.timezone)
    if at is not None and iso is not None:
        raise ValueError("--at and --time: give one of them")
    if at is not None:
        try:
            hh, mm = (int(x) for x in at.split(":"))
            clock = dt.time(hh, mm)
        except ValueError:
            raise ValueError(f"--at: {at!r} is not HH:MM (e.g. 21:30)") from None
        date = dt.datetime.fromtimestamp(now_s, zone).date()
        return dt.datetime.combine(date, clock, zone).timestamp()
    if iso is not None:
        try:
            t = dt.datetime.fromisoformat(iso)
        except ValueError:
            raise ValueError(
                f"--time: {iso!r} is not an ISO time (e.g. 2026-12-01T21:30)"
            ) from None
        return (t if t.tzinfo is not None else t.replace(tzinfo=zone)).timestamp()
    return None


def in_force(cfg: PolicyConfig, time_s: float, label: str) -> dict[str, Any]:
    """What ``effective_policy`` puts in force at ``time_s``, as plain data: the names and
    values the live placer's wait decisions carry (``daynight.in_force``, ``mosaic explain``)."""
    eff, period = effective_policy(cfg, time_s)
    zone = ZoneInfo(cfg.calendar.timezone)
    return {
        "label": label,
        "time_s": time_s,
        "local_time": dt.datetime.fromtimestamp(time_s, zone).isoformat(timespec="minutes"),
        "period": period or "(calendar off)",
        "weights": {r: eff.weights(r).as_dict() for r in REGIMES},
        **period_sets(eff),
        "next_switch_s": next_switch_s(cfg.calendar, time_s) if cfg.calendar.enabled else None,
    }


def report(cfg: PolicyConfig, now_s: float, other_s: float | None) -> dict[str, Any]:
    """Now, the other moment if given, and the calendar."""
    moments = [in_force(cfg, now_s, "now")]
    if other_s is not None:
        moments.append(in_force(cfg, other_s, "at"))
    cal = cfg.calendar.as_dict()
    cal.pop("active")
    cal["night"]["hours"] = cfg.calendar.night_hours()
    return {"moments": moments, "calendar": cal}


def render(rep: dict[str, Any]) -> None:
    for m in rep["moments"]:
        t = Table(
            title=f"{m['label']}: {m['local_time']}  period {m['period']}", title_justify="left"
        )
        for col in ("REGIME", "FAIR_SHARE", "ENERGY", "DEADLINE", "PRIORITY"):
            t.add_column(col, justify="left" if col == "REGIME" else "right")
        for r, w in m["weights"].items():
            t.add_row(r, *(f"{w[k]:.3f}" for k in ("fair_share", "energy", "deadline", "priority")))
        out.print(t)
        out.print(
            f"  score added: inference {m['inference_boost']:+.3f}, training "
            f"{m['training_boost']:+.3f}; inference headroom {m['headroom_share']:.0%} of GPUs; "
            f"w_speed {m['w_speed']:.3f}; warm reserve {m['warm_reserve_frac']:.0%}"
        )
    cal = rep["calendar"]
    state = "on" if cal["enabled"] else "off (--set calendar.enabled=true)"
    out.print(f"calendar {state}, time zone {cal['timezone']}")
    for name in ("day", "night"):
        p = cal[name]
        out.print(
            f"  {name} {p['hours']}: inference {p['inference_boost']:+.3f}, training "
            f"{p['training_boost']:+.3f}, headroom {p['headroom_share']:.0%}, speed weight "
            f"x{p['speed_weight_factor']:g}"
        )


def _config(policy_file: Path | None, sets: list[str]) -> PolicyConfig:
    from libs.policy_io.overrides import apply_overrides
    from libs.policy_io.policy_file import load_policy_file

    base = load_policy_file(policy_file) if policy_file is not None else PolicyConfig.default()
    return apply_overrides(sets, base)[0] if sets else base


def policy(
    at: Annotated[
        str | None, typer.Option("--at", help="also show this hour (HH:MM) today")
    ] = None,
    time: Annotated[str | None, typer.Option("--time", help="also show this ISO time")] = None,
    policy_file: Annotated[
        Path | None, typer.Option("--policy-file", help="policy.json (default: the defaults)")
    ] = None,
    sets: Annotated[
        list[str] | None, typer.Option("--set", help="KEY=VALUE override (repeatable)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="plain data")] = False,
) -> None:
    """The effective policy now and at --at/--time: rank weights, day/night shifts, calendar."""
    from libs.clock import Clock

    try:
        cfg = _config(policy_file, sets or [])
        now_s = Clock.from_env().now()
        rep = report(cfg, now_s, moment_at(cfg, now_s, at, time))
    except ValueError as exc:
        typer.echo(f"mosaic policy: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(rep, indent=2))
    else:
        render(rep)


def register(app: typer.Typer) -> None:
    app.command("policy")(policy)
