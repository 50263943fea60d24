"""Replay throughput and fidelity benchmark (not part of the default test run).

Run:  python benchmarks/bench_replay.py            (prints the tables for docs/replay.md)
      pytest benchmarks/bench_replay.py -m benchmark

1. Raw SimPy event rate: one process yielding ``env.timeout(1)`` N times (timeouts/s),
   measured in the same process as the replays, so ratios hold on noisy machines.
2. Throughput: hops/s of ``fast`` and ``flit`` on the gemm workload at three sizes
   spanning >10x in ops; cost per hop must stay flat (linear growth).
3. Fidelity: every workload in ``capture/`` plus a contention scenario (8 PEs reading
   one PE's HBM slice), flit vs fast: makespan, makespan error, median per-op error,
   speed-up (flit wall / fast wall).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import pytest
import simpy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from kbtrace.capture import capture  # noqa: E402
from kbtrace.replay import ReplayOptions, replay  # noqa: E402
from kbtrace.replay.compare import compare_runs  # noqa: E402
from kbtrace.topology import compile_topology  # noqa: E402

TOPO = ROOT / "topologies" / "small.yaml"
SIZES = (128, 256, 416)           # gemm M = N; ops grow ~ M*N: 128 -> 1,352 ops ... 10.6x


def raw_simpy_rate(n: int = 300_000) -> float:
    env = simpy.Environment()

    def proc(env):
        for _ in range(n):
            yield env.timeout(1)

    env.process(proc(env))
    t0 = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t0)


def contention_trace(topo, n_pe: int = 8, rounds: int = 4, nbytes: int = 65536):
    from test_replay_util import SynthTrace, hbm, load
    rows = []
    for p in range(n_pe):
        for r in range(rounds):
            rows.append(load(hbm(0, 0, 0, topo, (p * rounds + r) * nbytes), nbytes, pe=p,
                             program=p, seq=r))
    return SynthTrace(rows, "hot_slice_8pe")


def _replay(trace, topo, fid, out):
    return replay(trace, topo, ReplayOptions(fidelity=fid, out_dir=str(out)))


def throughput(tmp: Path, topo) -> list[tuple[str, int, int, int, float, float]]:
    rows = []
    for m in SIZES:
        tr = capture(ROOT / "capture" / "gemm.py", topo, {"M": m, "N": m, "K": 128},
                     tmp / f"gemm{m}")
        for fid in ("fast", "flit"):
            r = _replay(tr, topo, fid, tmp / f"gemm{m}-{fid}")
            rows.append((fid, m, r.ops, r.hops, r.wall_s, r.hops / r.wall_s))
    return rows


def fidelity(tmp: Path, topo) -> list[tuple[str, float, float, float, float, float]]:
    rows = []
    traces = {w.stem: capture(w, topo, {}, tmp / w.stem)
              for w in sorted((ROOT / "capture").glob("*.py"))}
    traces["hot_slice_8pe"] = contention_trace(topo)
    for name, tr in traces.items():
        flit = _replay(tr, topo, "flit", tmp / f"{name}-flit")
        fast = _replay(tr, topo, "fast", tmp / f"{name}-fast")
        ag = compare_runs(fast, flit)
        rows.append((name, flit.makespan_ns, fast.makespan_ns, ag.makespan_err, ag.median_op_err,
                     ag.speedup))
    return rows


def main() -> dict:
    topo = compile_topology(TOPO)
    raw = raw_simpy_rate()
    with tempfile.TemporaryDirectory() as d:
        tp = throughput(Path(d), topo)
        fi = fidelity(Path(d), topo)
    print(f"raw SimPy: {raw:,.0f} timeouts/s (one process)\n")
    print("| mode | gemm M=N | ops | hops | wall s | hops/s | x raw SimPy rate | us/hop |")
    print("|---|---|---|---|---|---|---|---|")
    for fid, m, ops, hops, wall, rate in tp:
        print(f"| {fid} | {m} | {ops:,} | {hops:,} | {wall:.2f} | {rate:,.0f} | {rate / raw:.2f} | "
              f"{1e6 * wall / hops:.2f} |")
    print("\n| workload | flit makespan ns | fast makespan ns | makespan err | median op err | "
          "speed-up |")
    print("|---|---|---|---|---|---|")
    for name, a, b, me, oe, sp in fi:
        print(f"| {name} | {a:,.1f} | {b:,.1f} | {100 * me:.2f}% | {100 * oe:.2f}% | {sp:.1f}x |")
    return {"raw": raw, "throughput": tp, "fidelity": fi}


@pytest.mark.benchmark
def test_bench_replay():
    res = main()
    fast = [r for r in res["throughput"] if r[0] == "fast"]
    per_hop = [r[4] / r[3] for r in fast]
    assert max(per_hop) < 2.0 * min(per_hop)          # linear: cost per hop stays flat
    for name, _a, _b, me, oe, _sp in res["fidelity"]:
        assert me <= 0.02 and oe <= 0.05, name
    gemm = next(r for r in res["fidelity"] if r[0] == "gemm")
    assert gemm[5] >= 10.0


if __name__ == "__main__":
    main()
