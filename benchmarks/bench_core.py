"""Fast replay against raw SimPy, pure-Python core vs compiled core (issue 22, target 1); not
part of the default test run.

Run:  python benchmarks/bench_core.py [--ops 100000] [--repeats 3] [--fidelity fast|fast-fcfs]
      pytest benchmarks/bench_core.py -m benchmark

gemm over every PE of ``default.yaml`` (M = N = 1024, BM = BN = 32, BK = 64, K for the
ops asked: ops = 1024 * (3 * K / 64 + 2)) is captured once; then, alternating, a fresh
interpreter replays it in fast mode with the pure-Python core (``KBTRACE_PURE_PYTHON=1``)
and one with the default core (compiled when built), ``--repeats`` times each. Each child
also measures raw SimPy (one process yielding ``env.timeout(1)``, timeouts per CPU second)
right before and after its replay. Figures are CPU seconds (``time.process_time``), the
best of the repeats for the replay and the median of all raw samples for SimPy. The target
ratio is replay hops per CPU s over raw timeouts per CPU s (>= 0.5; stretch >= 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from _simpy_rate import raw_rate

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.5


def child(trace: str, out: str, fidelity: str = "fast") -> dict:
    from kbtrace.replay import ReplayOptions, replay
    from kbtrace.replay.fabric.core import status
    from kbtrace.topology import compile_topology

    topo = compile_topology(ROOT / "topologies" / "default.yaml")
    raws = [raw_rate() for _ in range(2)]
    c0 = time.process_time()
    r = replay(trace, topo, ReplayOptions(fidelity=fidelity, out_dir=out))
    cpu = time.process_time() - c0
    raws += [raw_rate() for _ in range(2)]
    return {"core": status()[1], "ops": r.ops, "hops": r.hops, "cpu_s": cpu, "raw": raws}


def run_child(trace: Path, out: Path, pure: bool, fidelity: str = "fast") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KBTRACE_PURE_PYTHON"}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    if pure:
        env["KBTRACE_PURE_PYTHON"] = "1"
    res = subprocess.run([sys.executable, "-W", "ignore", __file__, "--child", str(trace),
                          str(out), fidelity], env=env, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def measure(ops: int, repeats: int, tmp: Path, fidelity: str = "fast") -> dict[str, dict]:
    from kbtrace.capture import capture

    k = 64 * max(1, -(-(ops // 1024 - 2) // 3))
    capture(ROOT / "capture" / "gemm.py", ROOT / "topologies" / "default.yaml",
            {"M": 1024, "N": 1024, "K": k}, tmp / "trace")
    out: dict[str, dict] = {}
    for i in range(repeats):
        for pure in (True, False):
            f = run_child(tmp / "trace", tmp / f"run{i}{pure}", pure, fidelity)
            key = "pure" if pure else f["core"]
            best = out.get(key)
            raws = (best["raw"] if best else []) + f["raw"]
            if best is None or f["cpu_s"] < best["cpu_s"]:
                out[key] = f
            out[key]["raw"] = raws
    return out


def table(res: dict[str, dict]) -> str:
    raw = statistics.median(x for f in res.values() for x in f["raw"])
    lines = [f"raw SimPy: median {raw / 1e6:.2f} M timeouts per CPU s", "",
             "| core | ops | hops | replay CPU s | µs/op | hops per CPU s | × raw SimPy |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for key, f in res.items():
        rate = f["hops"] / f["cpu_s"]
        lines.append(f"| {key} | {f['ops']:,} | {f['hops']:,} | {f['cpu_s']:.2f} | "
                     f"{f['cpu_s'] / f['ops'] * 1e6:.1f} | {rate / 1e6:.3f} M | "
                     f"{rate / raw:.3f} |")
    if "pure" in res and len(res) > 1:
        other = next(k for k in res if k != "pure")
        lines += ["", f"{other} / pure speed-up: {res['pure']['cpu_s'] / res[other]['cpu_s']:.2f}x"]
    return "\n".join(lines)


@pytest.mark.benchmark
def test_core_ratio(tmp_path):
    res = measure(20_000, 1, tmp_path)
    print(table(res))
    assert res["pure"]["hops"] == next(f["hops"] for k, f in res.items() if k != "pure")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fidelity", default="fast", choices=("fast", "fast-fcfs"),
                    help="fast (streams that meet on a link served together) or fast-fcfs")
    ap.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(*a.child)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        print(f"fidelity {a.fidelity}")
        print(table(measure(a.ops, a.repeats, Path(tmp), a.fidelity)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
