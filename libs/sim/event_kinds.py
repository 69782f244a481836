"""The kinds of event on the engine's heap (``engine.Engine``), one module so the engine and
the parts that push events of their own (power saving, the thermal model, services) agree."""

ARRIVE, FINISH, OOM, RESUBMIT, RESUMED, POWER, TICK, CKPT = 0, 1, 2, 3, 4, 5, 6, 7
SAMPLE = 8  # a thermal sample instant (libs.sim.thermal)
LOAD = 9  # a service's load point, curve end or scale check (libs.sim.serving.SimServices.LOAD)
STOPPED = 10  # a stopped replica's process is gone: its GPUs are free (libs.sim.serving)
