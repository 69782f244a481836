"""``warm_up`` loads every compiled loop a replay's passes use: in a fresh process, a replay
after it loads no further kernel (numba compiles or loads per set of argument types, so a path
the warm-up misses shows as a new signature)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent(
    """
    import json
    import numba
    from libs.policy import fast as K
    from libs.policy.warmup import warm_up
    from libs.sim.runner import run_simulation

    def signatures():
        return {
            name: sorted(map(str, f.signatures))
            for name, f in vars(K).items()
            if isinstance(f, numba.core.dispatcher.Dispatcher)
        }

    warm_up()
    before = signatures()
    run_simulation("synthetic:1500", "v100=24,t4=24,a100=24", None, ["mosaic"], None)
    after = signatures()
    print(json.dumps({k: sorted(set(v) - set(before.get(k, []))) for k, v in after.items()}))
    """
)


def test_a_replay_after_warm_up_loads_no_further_kernel():
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    new = json.loads(out.stdout.strip().splitlines()[-1])
    assert {k: v for k, v in new.items() if v} == {}
