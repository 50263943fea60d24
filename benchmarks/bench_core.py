"""Fast replay against raw SimPy, pure-Python core vs compiled core (issue 22, target 1); not
part of the default test run.

Run:  python benchmarks/bench_core.py [--ops 100000] [--repeats 3] [--fidelity fast|fast-fcfs]
                                     [--huge-pages on|off|ab]
      pytest benchmarks/bench_core.py -m benchmark

gemm over every PE of ``default.yaml`` (M = N = 1024, BM = BN = 32, BK = 64, K for the
ops asked: ops = 1024 * (3 * K / 64 + 2)) is captured once; then, alternating, a fresh
interpreter replays it in fast mode with the pure-Python core (``KBTRACE_PURE_PYTHON=1``)
and one with the default core (compiled when built), ``--repeats`` times each. Each child
also measures raw SimPy (one process yielding ``env.timeout(1)``, timeouts per CPU second)
right before and after its replay. Figures are CPU seconds (``time.process_time``), the
best of the repeats for the replay and the median of all raw samples for SimPy. The target
ratio is replay hops per CPU s over raw timeouts per CPU s (>= 0.5; stretch >= 1).

Each child first puts pymalloc's arenas on huge pages as the ``kbtrace`` command does
(``kbtrace._hugepages.install``), so that it measures what a user gets; ``--huge-pages off``
runs the children without (``KBTRACE_HUGE_PAGES=0``), and ``--huge-pages ab`` alternates the
compiled core without and with them instead of the pure-Python and compiled cores (each
child's figures are printed to stderr as it ends, for the pairs).
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
HUGE_ENV = "KBTRACE_HUGE_PAGES"       # kbtrace._hugepages.ENV (not imported: PYTHONPATH)


def child(trace: str, out: str, fidelity: str = "fast") -> dict:
    from kbtrace._hugepages import install
    huge = install()             # as the kbtrace command (KBTRACE_HUGE_PAGES=0: off)
    from kbtrace.replay import ReplayOptions, replay
    from kbtrace.replay.fabric.core import status
    from kbtrace.topology import compile_topology

    topo = compile_topology(ROOT / "topologies" / "default.yaml")
    raws = [raw_rate() for _ in range(2)]
    c0 = time.process_time()
    r = replay(trace, topo, ReplayOptions(fidelity=fidelity, out_dir=out))
    cpu = time.process_time() - c0
    raws += [raw_rate() for _ in range(2)]
    return {"core": status()[1], "huge_pages": huge, "ops": r.ops, "hops": r.hops, "cpu_s": cpu,
            "raw": raws}


def run_child(trace: Path, out: Path, pure: bool, fidelity: str = "fast",
              huge: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("KBTRACE_PURE_PYTHON", HUGE_ENV)}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    if pure:
        env["KBTRACE_PURE_PYTHON"] = "1"
    if not huge:
        env[HUGE_ENV] = "0"
    res = subprocess.run([sys.executable, "-W", "ignore", __file__, "--child", str(trace),
                          str(out), fidelity], env=env, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def measure(ops: int, repeats: int, tmp: Path, fidelity: str = "fast",
            huge_pages: str = "on") -> dict[str, dict]:
    """Best child per core (``huge_pages`` on / off), or per huge-page setting (``ab``)."""
    from kbtrace.capture import capture

    k = 64 * max(1, -(-(ops // 1024 - 2) // 3))
    capture(ROOT / "capture" / "gemm.py", ROOT / "topologies" / "default.yaml",
            {"M": 1024, "N": 1024, "K": k}, tmp / "trace")
    out: dict[str, dict] = {}
    kinds = ([(False, False), (False, True)] if huge_pages == "ab"
             else [(True, huge_pages == "on"), (False, huge_pages == "on")])
    for i in range(repeats):
        for pure, huge in kinds:
            f = run_child(tmp / "trace", tmp / f"run{i}{pure}{huge}", pure, fidelity, huge)
            print(json.dumps({"repeat": i, **f}), file=sys.stderr, flush=True)
            key = "pure" if pure else f["core"]
            if huge_pages == "ab":
                key += f", huge pages {'on' if huge else 'off'} ({f['huge_pages']})"
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
    if len(res) == 2 and "pure" not in res:       # --huge-pages ab
        off, on = res.values()
        lines += ["", f"huge pages on / off, best of each: {on['cpu_s'] / off['cpu_s']:.3f}"]
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
    ap.add_argument("--huge-pages", default="on", choices=("on", "off", "ab"),
                    help="pymalloc's arenas on huge pages in the children as in the kbtrace "
                         "command (on), not (off), or compiled core without / with alternating "
                         "(ab)")
    ap.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(*a.child)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        print(f"fidelity {a.fidelity}, huge pages {a.huge_pages}")
        print(table(measure(a.ops, a.repeats, Path(tmp), a.fidelity, a.huge_pages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
