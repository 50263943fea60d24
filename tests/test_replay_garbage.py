"""A fast replay makes no cyclic garbage per transfer.

The replay raises the collector's first threshold to a million allocations, so garbage held
in reference cycles lives until a rare full collection and grows the peak with the trace.
An HBM write's bursts booked ahead (``HbmController.write_stream``) and its completion
(``heads.HbmWrite``) referred to each other until the write was freed (all_gather on
default.yaml, 65,536 ops: peak RSS growth 299 -> 244-252 MiB once dropped; 2.57-2.62 ->
1.80-1.96 KiB per added op)."""

from __future__ import annotations

import gc
from collections import Counter

from kbtrace.capture import capture
from kbtrace.replay import ReplayOptions, replay
from kbtrace.topology import compile_topology
from test_replay_util import TOPO_DIR

ROOT = TOPO_DIR.parent


def test_hbm_writes_leave_no_cyclic_garbage(tmp_path):
    topo = compile_topology(TOPO_DIR / "small.yaml")
    tr = capture(ROOT / "capture" / "all_gather.py", topo, {}, tmp_path / "trace")
    garbage: list[Counter] = []

    def progress(_p):       # called once the simulation ends, before the sim is freed
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            garbage.append(Counter(type(o).__name__ for o in gc.garbage))
        finally:
            gc.garbage.clear()
            gc.set_debug(0)

    was_enabled = gc.isenabled()
    gc.collect()            # (what earlier tests left: their simulations are cycles too)
    gc.disable()
    try:
        run = replay(tr.path, topo, ReplayOptions(fidelity="fast", out_dir=tmp_path / "run"),
                     progress=progress)
    finally:
        if was_enabled:
            gc.enable()
    assert run.ops == 2048
    assert garbage, "progress was never called"
    assert all(c["HbmWrite"] == 0 and c["_Ev"] == 0 for c in garbage), garbage
