"""Exactness of the replay speed-ups: each fast path must equal the code it replaces.

* ``FifoStore`` schedules exactly the events of an unbounded ``simpy.Store`` (same
  processing order, same event count), so swapping it in cannot move a tie.
* ``HbmController.read`` (per-PC running sums) gives bit-identical finish times and
  PC state to committing the bursts one by one.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import simpy

from kbtrace.replay.hbm import HbmController
from kbtrace.replay.pe import FifoStore


def _store_log(make_store, seed: int) -> tuple[list[tuple], int]:
    rng = random.Random(seed)
    env = simpy.Environment()
    stores = [make_store(env) for _ in range(2)]
    log: list[tuple] = []

    def consumer(cid, st):
        while True:
            item = yield st.get()
            log.append((env.now, "get", cid, item))
            if rng.random() < 0.5:
                yield env.timeout(rng.choice([0, 1, 2]))

    def producer(pid, delays):
        for k, d in enumerate(delays):
            if d:
                yield env.timeout(d)
            st = stores[(pid + k) % 2]
            st.put((pid, k))
            log.append((env.now, "put", pid, k))
            if k % 3 == 0:
                yield env.timeout(0)

    for c in range(3):
        env.process(consumer(c, stores[c % 2]))
    for p in range(3):
        env.process(producer(p, [rng.choice([0, 0, 1, 3]) for _ in range(25)]))
    n = 0
    try:
        while True:
            env.step()
            n += 1
    except simpy.core.EmptySchedule:
        pass
    return log, n


def test_fifo_store_matches_simpy_store_event_for_event():
    for seed in range(40):
        ref = _store_log(simpy.Store, seed)
        got = _store_log(FifoStore, seed)
        assert got == ref, seed


def _hbm_params(rng):
    return SimpleNamespace(pcs_per_pe=rng.choice([1, 2, 8, 16]), burst_bytes=rng.choice([64, 256]),
                           pc_bw_gbps=rng.choice([32.0, 12.5]), efficiency=rng.choice([1.0, 0.77]),
                           switch_penalty_ns=rng.choice([0.0, 3.3]))


def test_hbm_read_equals_burst_by_burst_commits():
    rng = random.Random(3)
    for _ in range(500):
        p = _hbm_params(rng)
        fast, ref = HbmController(0, p), HbmController(0, p)
        t = 0.0
        for _ in range(rng.randint(1, 8)):
            t += rng.choice([0.0, 0.5, 7.0, 100.1])
            addr = rng.randint(0, 1 << 20) * rng.choice([1, 64, 256])
            nb = rng.choice([1, 100, 256, 257, 4096, 9000, 65536])
            if rng.random() < 0.3:      # interleave writes so the turnaround penalty applies
                tail = t + rng.choice([0.0, 5.5])
                assert fast.write_stream(addr, nb, t, tail) == ref.write_stream(addr, nb, t, tail)
                continue
            want = [ref.commit(addr + off, min(p.burst_bytes, nb - off), t, 0)
                    for off in range(0, nb, p.burst_bytes)]
            assert fast.read(addr, nb, t) == want
            assert fast.pc_avail == ref.pc_avail and fast.last_dir == ref.last_dir
