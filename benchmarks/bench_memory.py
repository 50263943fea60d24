"""Replay memory benchmark (not part of the default test run).

Run:  python benchmarks/bench_memory.py [--fidelity fast|fast-fcfs|flit]   (the table for docs/replay.md)
      pytest benchmarks/bench_memory.py -m benchmark

Peak resident memory of one fast replay (invariants on, default batching) of the gemm
workload on ``topologies/default.yaml`` at three sizes spanning 16x in ops, each in a fresh
Python process so the high-water mark is the replay's own: ``peak`` is the peak RSS after
the replay minus the same once kbtrace is imported and the topology compiled (``VmHWM`` of
``/proc/self/status``: Linux). Traces are captured once, in this process.

What grows with the trace: the ops table and one ``Op`` record per op (the engine needs
every op for dependencies) and per-op timing arrays. What must not: hop rows (finalised and
written per batch), the busy-window check (``invariants.BusyCheck`` keeps only windows
that can still grow), and the route caches (routes and fast-fabric plans per route and
size: bounded by ``FastFabric.HELD_MAX`` and ``ROUTES_MAX``, whatever the number of distinct
routes). The test asserts the peak per added op and per added hop on two ladders:

* ``gemm`` (M = N = 512, 1024, 2048): 2,048 -> 32,768 ops over the same 512 routes;
* ``all_gather`` (peers = 8, 32, 128; every PE gathers that many 2 KiB blocks from other
  PEs' slices): 4,096 -> 65,536 ops over 2,304 -> 33,024 distinct routes. Before the route
  cache was bounded this ladder grew by ~86 KiB per op (3 GiB at 32,768 loads).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _cli import parser

ROOT = Path(__file__).resolve().parents[1]
TOPO = ROOT / "topologies" / "default.yaml"
LADDERS = {   # workload -> (label, params) per size
    "gemm": [(f"M=N={m}", {"M": m, "N": m, "K": 128}) for m in (512, 1024, 2048)],
    "all_gather": [(f"peers={g}", {"peers": g}) for g in (8, 32, 128)],
}

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
run = replay(sys.argv[2], topo, ReplayOptions(fidelity=sys.argv[4], out_dir=sys.argv[3]))
peak = hwm_kib()
print(json.dumps({"ops": run.ops, "hops": run.hops, "base_kib": base, "peak_kib": peak,
                  "wall_s": run.wall_s}))
"""


def measure(tmp: Path, workload: str, fidelity: str = "fast") -> list[dict]:
    from kbtrace.capture import capture
    from kbtrace.topology import compile_topology
    topo = compile_topology(TOPO)
    rows = []
    for label, params in LADDERS[workload]:
        tr = capture(ROOT / "capture" / f"{workload}.py", topo, params, tmp / label)
        out = subprocess.run([sys.executable, "-c", _CHILD, str(TOPO), str(tr.path),
                              str(tmp / f"run-{label}"), fidelity], check=True, capture_output=True,
                             text=True)
        r = json.loads(out.stdout)
        r["label"] = label
        r["grow_mib"] = (r["peak_kib"] - r["base_kib"]) / 1024
        rows.append(r)
    return rows


def marginal(rows: list[dict]) -> tuple[float, float]:
    """Bytes of peak growth per added op and per added hop between the two largest sizes."""
    a, b = rows[-2], rows[-1]
    grow = 2**20 * (b["grow_mib"] - a["grow_mib"])
    return grow / (b["ops"] - a["ops"]), grow / (b["hops"] - a["hops"])


def main(fidelity: str = "fast") -> dict[str, list[dict]]:
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for wl in LADDERS:
            out[wl] = rows = measure(Path(d), wl, fidelity)
            print(f"\n| {wl} | ops | hops | peak RSS growth MiB | KiB/op | B/hop | wall s |")
            print("|---|---|---|---|---|---|---|")
            for r in rows:
                g = r["grow_mib"]
                print(f"| {r['label']} | {r['ops']:,} | {r['hops']:,} | {g:.1f} | "
                      f"{1024 * g / r['ops']:.2f} | {2**20 * g / r['hops']:.0f} | "
                      f"{r['wall_s']:.2f} |")
            per_op, per_hop = marginal(rows)
            print(f"\nmarginal: {per_op / 1024:.2f} KiB per added op, {per_hop:.0f} B per added hop")
    return out


@pytest.mark.benchmark
def test_bench_memory():
    for wl, rows in main().items():
        per_op, per_hop = marginal(rows)
        # a finalised hop row is 12 columns (~80 B); keeping every row's busy interval for a
        # check at the end cost ~140 B per hop at the peak (433 MiB at gemm 2048 before
        # BusyCheck); an unbounded route cache cost ~86 KiB per all_gather op
        assert per_hop < 200, (wl, per_hop)
        assert per_op < 4 * 1024, (wl, per_op)


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--fidelity", default="fast", choices=("fast", "fast-fcfs", "flit"),
                    help="replay fidelity of every size (default fast, kbtrace's default)")
    main(ap.parse_args().fidelity)
