"""The slow-GPU / energy guard (the definition): how long a long queued job is held off each
GPU model, so that it waits for a fast (or green) one instead of starting where it would lose
time or waste energy (``PolicyConfig``: ``slow_guard_*``, ``energy_guard_factor``,
``green_*``).

For jobs of at least ``slow_guard_runtime_s``. With g the job's green tolerance (its
``energy_sensitivity``, 0 for high-priority or deadline jobs) and loss the extra runtime on a
model vs the fastest model that can hold it, a model is "worth it" when
1 - energy/energy of the fastest >= (1 - green_worth x g) x (1 - speed/fastest speed) (energy
per unit of work of its class). Held: a slow model (< slow_guard_min_speed x fastest) or a
slower-and-hungrier one that is not worth it, until the job waited energy_guard_factor x
loss; another slow model until it waited the loss, except for a green job (tolerance >=
green_min_tolerance, runtime <= green_max_runtime_s and at least green_min_gpus GPUs,
``scores.is_green``), which takes it at once; and, for a green job that waited less than
green_wait_s, any model over green_energy_slack x the greenest model's energy.

A high-priority job (priority >= ``high_priority``) is never held unless ``guard_holds_high``
(issue 15, item 5: no high-priority wait for a boot while capacity exists). Why: the guard
bets a job's wait against its own longer run, that the fast model frees or boots before the
loss is spent; a high-priority submission asks to start now, and the data said the bet was
most of its wait. At Philly's natural load (seed cluster, 1,024 GPUs, power saving on every
policy) 592 of 14,858 high-priority jobs waited over 60 s; SlowGPU was the last reason of 95
(89 for an A100, median 1,505 s, up to 20 h), and high-priority jobs waited 180k s on SlowGPU
and 76k s on NodeWaking in all. Not held: p99 wait 724 -> 274 s, SlowGPU 0 s and NodeWaking
8k s (the boots they had waited were of fast nodes the guard held them for), mean JCT and
energy unchanged. The job still goes to the fastest model that has room now (the speed weight
grows with its length, ``speed_runtime_scale_s``), so it takes a slower one only when every
faster one is full or asleep. Deadline jobs keep the guard: their promise is the deadline.

Every hold ends after a wait fixed by the job and the model, so the pass computes it once per
queued job (``fast.guard.hold_waits``, compiled, checked bit for bit against ``hold_waits``
here) and then only compares it with the job's wait (``fast.codes.SlowCodes``).
"""

from __future__ import annotations

import numpy as np

from libs.policy.config import PolicyConfig

# the guard's settings vector (``guard_args``), in the order the compiled loop reads it
GUARD_SETTINGS: tuple[str, ...] = (
    "slow_guard_runtime_s",
    "green_min_tolerance",
    "green_max_runtime_s",
    "green_worth",
    "slow_guard_min_speed",
    "energy_guard_factor",
    "green_energy_slack",
    "green_wait_s",
    "guard_holds_high",
    "green_min_gpus",
)


def guard_args(cfg: PolicyConfig) -> np.ndarray:
    """float[len(GUARD_SETTINGS)]: the guard's and the green rules' settings, in that order."""
    return np.array([getattr(cfg, name) for name in GUARD_SETTINGS], dtype=float)


def hold_waits(
    cls, est, prog, prio, deadline, high_priority: float, es, gpus, present, speed, energy, guard
) -> np.ndarray:
    """float[row, model]: the job is held off that model while it has waited less than this
    (-inf: never held). Per row: workload class ``cls``, runtime ``est``, ``prog``ress,
    priority, deadline (NaN: none), energy sensitivity ``es``, ``gpus`` asked; ``present``:
    bool[row, model], that model could hold the row's shape; ``speed``, ``energy``: [model,
    class] speed and energy per unit of work; ``guard``: ``guard_args``."""
    g = dict(zip(GUARD_SETTINGS, np.asarray(guard, dtype=float).tolist(), strict=True))
    sp = speed[:, cls].T
    e = energy[:, cls].T
    anyp = present.any(axis=1)
    fast = np.argmax(np.where(present, sp, -np.inf), axis=1)
    r = np.arange(len(fast))
    best = np.where(anyp, sp[r, fast], 1.0)
    e_fast = np.where(anyp, e[r, fast], 1.0)
    greenest = np.where(present, e, np.inf).min(axis=1, initial=np.inf)
    high = (prio >= high_priority) & (g["guard_holds_high"] == 0.0)
    guarded = (est >= g["slow_guard_runtime_s"]) & anyp & ~high
    rem = est * np.maximum(0.0, 1.0 - prog)
    urgent = (prio >= high_priority) | ~np.isnan(deadline)
    tol = np.where(urgent, 0.0, np.clip(es, 0.0, 1.0))
    green = (
        (tol >= g["green_min_tolerance"])
        & (est <= g["green_max_runtime_s"])
        & (np.asarray(gpus) >= g["green_min_gpus"])
    )
    loss = rem[:, None] / sp - (rem / best)[:, None]
    worth = 1.0 - e / e_fast[:, None] >= (1.0 - g["green_worth"] * tol)[:, None] * (
        1.0 - sp / best[:, None]
    )
    slow = sp < (g["slow_guard_min_speed"] * best)[:, None]
    costly = (slow | ((sp < best[:, None]) & (e > e_fast[:, None]))) & ~worth
    never = -np.inf
    hold = np.where(
        costly,
        g["energy_guard_factor"] * loss,
        np.where(slow & ~green[:, None], loss, never),
    )
    hungry = green[:, None] & (e > g["green_energy_slack"] * greenest[:, None])
    out = np.fmax(hold, np.where(hungry, g["green_wait_s"], never))
    out[~guarded] = never
    return out
