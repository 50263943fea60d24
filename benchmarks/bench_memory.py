"""Replay memory benchmark (not part of the default test run).

Run:  python benchmarks/bench_memory.py            (prints the table for docs/replay.md)
      pytest benchmarks/bench_memory.py -m benchmark

Peak resident memory of one fast replay (invariants on, default batching) of the gemm
workload on ``topologies/default.yaml`` at three sizes spanning 16x in ops, each in a fresh
Python process so the high-water mark is the replay's own: ``peak`` is the peak RSS after
the replay minus the same once kbtrace is imported and the topology compiled (``VmHWM`` of
``/proc/self/status``: Linux). Traces are captured once, in this process.

What grows with the trace: the ops table and one ``Op`` record per op (the engine needs
every op for dependencies), per-op timing arrays, and caches bounded by the topology
(routes, fast-fabric plans per route and size). What must not: hop rows (finalised and
written per batch) and the busy-window check (``invariants.BusyCheck`` keeps only windows
that can still grow). The test asserts the peak per op stays flat across sizes and names
the bytes per hop, which must stay far below a hop row's size in memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOPO = ROOT / "topologies" / "default.yaml"
SIZES = (512, 1024, 2048)         # gemm M = N (K = 128): 2,048 -> 32,768 ops (16x)

_CHILD = r"""
import json, sys
from kbtrace.replay import ReplayOptions, replay
from kbtrace.topology import compile_topology

def hwm_kib():   # this process's peak RSS (VmHWM; ru_maxrss would carry the parent's over exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

topo = compile_topology(sys.argv[1])
base = hwm_kib()
run = replay(sys.argv[2], topo, ReplayOptions(fidelity="fast", out_dir=sys.argv[3]))
peak = hwm_kib()
print(json.dumps({"ops": run.ops, "hops": run.hops, "base_kib": base, "peak_kib": peak,
                  "wall_s": run.wall_s}))
"""


def measure(tmp: Path) -> list[dict]:
    from kbtrace.capture import capture
    from kbtrace.topology import compile_topology
    topo = compile_topology(TOPO)
    rows = []
    for m in SIZES:
        tr = capture(ROOT / "capture" / "gemm.py", topo, {"M": m, "N": m, "K": 128},
                     tmp / f"gemm{m}")
        out = subprocess.run([sys.executable, "-c", _CHILD, str(TOPO), str(tr.path),
                              str(tmp / f"run{m}")], check=True, capture_output=True, text=True)
        r = json.loads(out.stdout)
        r["m"] = m
        r["grow_mib"] = (r["peak_kib"] - r["base_kib"]) / 1024
        rows.append(r)
    return rows


def main() -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        rows = measure(Path(d))
    print("| gemm M=N | ops | hops | peak RSS growth MiB | KiB/op | B/hop | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        g = r["grow_mib"]
        print(f"| {r['m']} | {r['ops']:,} | {r['hops']:,} | {g:.1f} | {1024 * g / r['ops']:.2f} | "
              f"{2**20 * g / r['hops']:.0f} | {r['wall_s']:.2f} |")
    a, b = rows[-2], rows[-1]
    marg = 2**20 * (b["grow_mib"] - a["grow_mib"])
    print(f"\nmarginal: {marg / (b['ops'] - a['ops']) / 1024:.2f} KiB per added op, "
          f"{marg / (b['hops'] - a['hops']):.0f} B per added hop")
    return rows


@pytest.mark.benchmark
def test_bench_memory():
    rows = main()
    a, b = rows[-2], rows[-1]
    per_op = 2**20 * (b["grow_mib"] - a["grow_mib"]) / (b["ops"] - a["ops"])
    per_hop = 2**20 * (b["grow_mib"] - a["grow_mib"]) / (b["hops"] - a["hops"])
    # a finalised hop row is 12 columns (~80 B); keeping every row's busy interval for a
    # check at the end cost ~140 B per hop at the peak (433 MiB at gemm 2048 before BusyCheck)
    assert per_hop < 200, per_hop
    assert per_op < 8 * 1024, per_op


if __name__ == "__main__":
    main()
