"""The baseline the replay benchmarks measure against, in the same run: raw SimPy."""

from __future__ import annotations

import time
from collections.abc import Callable

import simpy


def raw_rate(n: int = 200_000, clock: Callable[[], float] = time.process_time) -> float:
    """Timeouts per second of ``clock`` (default: CPU seconds) of one SimPy process yielding
    ``env.timeout(1)``."""
    env = simpy.Environment()

    def proc(env):
        for _ in range(n):
            yield env.timeout(1)

    env.process(proc(env))
    t0 = clock()
    env.run()
    return n / (clock() - t0)
