"""fast mode's link booking (``replay.fabric.booking.fit_rate``) always terminates.

The case below was met replaying gemm (M = N = 512, K = 2,496, i32) on default.yaml: the
stream's last 2.5e-11 of work waited at t ~ 4.7e5 ns, where a double cannot advance by
less than ~5.8e-11 ns, so the serving loop appended zero-length pieces forever and the
replay grew past 5 GiB in seconds. It runs in a child with a 1 GiB address-space limit so
that a regression fails here instead of eating the machine's memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

_CHILD = """
import json, resource
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from kbtrace.replay.fabric.booking import fit_rate, steps_of
ln = steps_of([467246.3, 467305.3], [0.5423728813559322, 0.0])
got = fit_rate(ln, 467267.1, 467287.89999999997, 1.0, 15.0, 467300.89999999997, 1.0, 16.0)
print(json.dumps({"got": got, "lt": ln.times(), "lr": ln.shares()}))
"""


def test_fit_rate_finishes_work_below_the_clock_resolution():
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    # starts when its head arrives, at the 0.4576 the link spares until 467305.3, then the
    # whole link: 17.4 ns x 0.4576 + 8.04 ns x 1.0 = 16 ns of work
    assert out["got"] == [467287.89999999997, 467290.08518518513, 467313.33728813555]
    assert out["lt"] == [467246.3, 467287.89999999997, 467305.3, 467313.33728813555]
    assert out["lr"] == [0.5423728813559322, 1.0, 1.0, 0.0]
