"""The predecessor's all-reduce figures next to kbtrace's (README: Replay -> All-reduce).

LRAB (capture/allreduce.py) on topologies/default.yaml with 6 SIPs wired as a 3 x 2 torus
(``--set system.sips.count=6 --set system.sips.topology=torus_2d --set system.sips.w=3
--set system.sips.h=2``), PE 0 of each of the 16 cubes per SIP holding one f16 shard:
64 KiB per PE in each IPCQ buffer kind, and the centre vs the corner root at 96 KiB per PE
(ADR-0032; commitlog.md sections 12-13). Captured on the 6-SIP system, replayed in the
chosen fidelity; prints a markdown table: reference, kbtrace, ratio.

    python scripts/allreduce_reference.py [--fidelity fast|flit] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import kbtrace
from kbtrace.replay import ReplayOptions
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]
SIX_TORUS = {"system.sips.count": 6, "system.sips.topology": "torus_2d", "system.sips.w": 3,
             "system.sips.h": 2}
#: (label, workload parameters, reference us)
CASES = [
    ("64 KiB/PE, buffer tcm", {"n_elem": 32768, "buffer_kind": "tcm"}, 12.0),
    ("64 KiB/PE, buffer hbm", {"n_elem": 32768, "buffer_kind": "hbm"}, 21.4),
    ("64 KiB/PE, buffer sram", {"n_elem": 32768, "buffer_kind": "sram"}, 24.3),
    ("96 KiB/PE, tcm, centre root", {"n_elem": 49152, "root": "centre"}, 17.2),
    ("96 KiB/PE, tcm, corner root", {"n_elem": 49152, "root": "corner"}, 22.0),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fidelity", default="fast", choices=("fast", "flit"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra topology override (sensitivity), e.g. pe.math.simd_lanes=256")
    a = ap.parse_args()
    over = dict(SIX_TORUS)
    for kv in a.set:
        k, v = kv.split("=", 1)
        over[k] = v
    topo = compile_topology(ROOT / "topologies" / "default.yaml", overrides=over)
    print(f"| case (LRAB, 6 SIPs 3x2 torus, default.yaml, {a.fidelity}) | reference us | "
          f"kbtrace us | kbtrace / reference |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, params, ref) in enumerate(CASES):
            tr = kbtrace.capture(ROOT / "capture" / "allreduce.py", topo, params,
                                 out_dir=Path(tmp) / f"t{i}")
            run = kbtrace.replay(tr, topo, ReplayOptions(fidelity=a.fidelity,
                                                          out_dir=Path(tmp) / f"r{i}"))
            us = run.makespan_ns / 1000
            print(f"| {label} | {ref:.1f} | {us:.2f} | {us / ref:.2f} |", flush=True)


if __name__ == "__main__":
    main()
