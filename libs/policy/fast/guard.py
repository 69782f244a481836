"""The slow/energy guard's compiled loops: each queued job's hold per GPU model (``_hold_row``,
the rule of ``stages.guard.hold_waits``) and the slow-model codes a pass reads from them."""

from __future__ import annotations

import numpy as np

from libs.policy.fast.compile import compiled
from libs.policy.stages.guard import GUARD_SETTINGS

_G = {name: i for i, name in enumerate(GUARD_SETTINGS)}
_RUNTIME, _MIN_TOL, _MAX_RUNTIME = (
    _G["slow_guard_runtime_s"],
    _G["green_min_tolerance"],
    _G["green_max_runtime_s"],
)
_WORTH, _MIN_SPEED, _FACTOR = (
    _G["green_worth"],
    _G["slow_guard_min_speed"],
    _G["energy_guard_factor"],
)
_SLACK, _WAIT = _G["green_energy_slack"], _G["green_wait_s"]
_HOLDS_HIGH, _MIN_GPUS = _G["guard_holds_high"], _G["green_min_gpus"]


@compiled
def _code_from_waits(r, waits, waited, cache, kept):
    """Row ``r``'s slow-model code after ``waited`` seconds (bit m: ``waits[r, m] > waited``),
    into ``cache[r]``, and the window it holds for, into ``kept[r]``: (code, since = waited,
    until = the smallest threshold still ahead, inf if none)."""
    code = 0
    until = np.inf
    for m in range(waits.shape[1]):
        w = waits[r, m]
        if w > waited:
            code += np.int64(1) << m
            if w < until:
                until = w
    cache[r] = code
    kept[r, 0] = code
    kept[r, 1] = waited
    kept[r, 2] = until


@compiled
def row_codes(rows, shape_of, shape_dead, cache, kept, waits, enq, now):
    """Fill ``cache[r]`` (the slow-model code) of each row of ``rows`` whose shape is not dead
    and whose cache is empty: from its kept window where that still holds (``since <= now -
    enq < until``), else from its hold waits (``_code_from_waits``). Return the rows whose
    hold waits are not known yet (NaN), in the order given: the caller computes them and
    asks ``codes_from_waits``."""
    out = np.empty(len(rows), dtype=np.int64)
    n = 0
    for r in rows:
        if shape_dead[shape_of[r]] or cache[r] >= 0:
            continue
        waited = now - enq[r]
        if kept[r, 1] <= waited and waited < kept[r, 2]:  # NaN (never computed): no
            cache[r] = np.int64(kept[r, 0])
        elif waits.shape[1] == 0 or not np.isnan(waits[r, 0]):
            _code_from_waits(r, waits, waited, cache, kept)
        else:
            out[n] = r
            n += 1
    return out[:n]


@compiled
def codes_from_waits(rows, waits, enq, now, cache, kept):
    """``_code_from_waits`` of each row of ``rows`` (their hold waits now known)."""
    for r in rows:
        _code_from_waits(r, waits, now - enq[r], cache, kept)


@compiled
def _hold_row(
    c,
    est,
    prog,
    prio,
    deadline,
    high_priority,
    es,
    gpus,
    present,
    speed,
    energy,
    out,
    guard,
):
    """One job's row of ``hold_waits`` into ``out`` (per model): ``c`` its workload class,
    ``present`` the models that could hold its shape. ``guard``: the settings
    (``stages.guard.guard_args``, in ``GUARD_SETTINGS`` order). The one loop ``hold_waits``
    and ``hold_waits_table`` use: the rule of ``stages.guard.hold_waits``."""
    guard_runtime = guard[_RUNTIME]
    green_min_tol = guard[_MIN_TOL]
    green_max_runtime = guard[_MAX_RUNTIME]
    green_worth = guard[_WORTH]
    slow_min_speed = guard[_MIN_SPEED]
    guard_factor = guard[_FACTOR]
    green_slack = guard[_SLACK]
    green_wait = guard[_WAIT]
    n_models = len(present)
    anyp = False
    fast = 0
    best_sp = -np.inf
    greenest = np.inf
    for m in range(n_models):
        if present[m]:
            anyp = True
            if speed[m, c] > best_sp:  # the first fastest (lowest index)
                best_sp = speed[m, c]
                fast = m
            if energy[m, c] < greenest:
                greenest = energy[m, c]
    best = speed[fast, c] if anyp else 1.0
    e_fast = energy[fast, c] if anyp else 1.0
    high = prio >= high_priority and guard[_HOLDS_HIGH] == 0.0
    if not (est >= guard_runtime and anyp) or high:
        for m in range(n_models):
            out[m] = -np.inf
        return
    left = 1.0 - prog
    if left < 0.0:  # np.maximum(0.0, left): a NaN stays NaN
        left = 0.0
    rem = est * left
    tol = 0.0
    if not (prio >= high_priority or not np.isnan(deadline)):
        tol = es  # np.clip(es, 0.0, 1.0): a NaN stays NaN
        if tol < 0.0:
            tol = 0.0
        elif tol > 1.0:
            tol = 1.0
    green = tol >= green_min_tol and est <= green_max_runtime and gpus >= guard[_MIN_GPUS]
    for m in range(n_models):
        sp = speed[m, c]
        e = energy[m, c]
        loss = rem / sp - rem / best
        worth = 1.0 - e / e_fast >= (1.0 - green_worth * tol) * (1.0 - sp / best)
        slow = sp < slow_min_speed * best
        costly = (slow or (sp < best and e > e_fast)) and not worth
        if costly:
            hold = guard_factor * loss
        elif slow and not green:
            hold = loss
        else:
            hold = -np.inf
        hungry = green and e > green_slack * greenest
        other = green_wait if hungry else -np.inf
        # np.fmax: a NaN never holds
        if np.isnan(hold) or (other > hold):  # other > NaN is False
            hold = other
        out[m] = hold


@compiled
def hold_waits(
    cls,
    est,
    prog,
    prio,
    deadline,
    high_priority,
    es,
    gpus,
    present,
    speed,
    energy,
    guard,
):
    """``fast.codes.hold_waits`` per row (``_hold_row``), the same float operations in the
    same order (every one elementwise; the only reductions are a first arg-max and a min,
    which are exact)."""
    n, n_models = present.shape
    out = np.empty((n, n_models))
    for i in range(n):
        _hold_row(
            cls[i],
            est[i],
            prog[i],
            prio[i],
            deadline[i],
            high_priority,
            es[i],
            gpus[i],
            present[i],
            speed,
            energy,
            out[i],
            guard,
        )
    return out


@compiled
def hold_waits_table(
    table,
    rows,
    high_priority,
    present,
    speed,
    energy,
    guard,
):
    """``hold_waits`` of rows of a queue's table (``queue.COLUMNS`` order: prio, es, enq,
    est, prog, deadline, gpus, cls, tenant), read in place; ``present[i]``: row ``rows[i]``'s
    models."""
    out = np.empty((len(rows), present.shape[1]))
    for i in range(len(rows)):
        r = rows[i]
        _hold_row(
            np.int64(table[r, 7]),
            table[r, 3],
            table[r, 4],
            table[r, 0],
            table[r, 5],
            high_priority,
            table[r, 1],
            table[r, 6],
            present[i],
            speed,
            energy,
            out[i],
            guard,
        )
    return out
