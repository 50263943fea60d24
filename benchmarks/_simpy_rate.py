"""The baseline the replay benchmarks measure against, in the same run: raw SimPy."""

from __future__ import annotations

import time

import simpy


def raw_rate(n: int = 200_000) -> float:
    """Timeouts per CPU second of one SimPy process yielding ``env.timeout(1)``."""
    env = simpy.Environment()

    def proc(env):
        for _ in range(n):
            yield env.timeout(1)

    env.process(proc(env))
    t0 = time.process_time()
    env.run()
    return n / (time.process_time() - t0)
