"""Replay throughput and fidelity benchmark (not part of the default test run).

Run:  python benchmarks/bench_replay.py            (prints the tables for docs/replay.md)
      pytest benchmarks/bench_replay.py -m benchmark

1. Raw SimPy event rate: one process yielding ``env.timeout(1)`` N times (timeouts/s),
   measured in the same process as the replays, so ratios hold on noisy machines.
2. Throughput: hops/s of ``fast`` and ``flit`` on the gemm workload at three sizes
   spanning >10x in ops; cost per hop must stay flat (linear growth). Issue 4 target:
   ``fast`` hops/s >= 0.5x the raw SimPy rate.

Every figure is the best of ``REPEATS`` runs (the raw rate too), because the machine is
shared and a single run is easily slowed 2x by other processes; best-of-N measures the
code, not the neighbours. The raw rate is sampled before the replays *and after every fast
replay* (``RAW_SAMPLES``; the figure is the best sample): slow periods on this machine last
seconds and hit the tight SimPy loop harder than a replay (measured: 0.66 M vs 1.89 M
timeouts/s in two processes whose replays took the same 217 ms), so a raw rate taken only
in one window could make the ratio look up to 3x better than it is. ``wall`` is ``Run.wall_s`` (open trace -> outputs written, including
invariant checks and the Parquet writes).
3. Where a fast replay's time goes (largest size): trace reading + spill and the op records fed per program (``OpSource._read`` / ``records``), fabric booking
   (``FastFabric.send``), hop-row finalisation + Parquet (``Recorder.flush``), the
   per-batch busy-window check (``BusyCheck.add``, called from ``flush`` and reported
   apart), the end-of-run invariants (``invariants.check``), and the rest (PE pipeline
   stations, HBM, tile plans, SimPy), each timed by wrapping the function; with the
   bound the 0.5x target implies per op.
4. Floor (largest size): an idealised replay that models nothing -- one SimPy timeout per
   op, the run's explicit hop rows appended as tuples and its transfers as one compact
   record each (counts taken from the real run's ``hops.parquet``), expanded with numpy and
   written with the same Parquet options. What the 0.5x budget leaves after it is what the
   whole model (PE pipeline, fabric booking, HBM, plans, crit / queue, invariants) may cost.
5. Fidelity: every workload in ``capture/`` plus a contention scenario (8 PEs reading
   one PE's HBM slice), flit vs fast: makespan, makespan error, median per-op error,
   speed-up (flit wall / fast wall).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import simpy
from _cli import parser
from _simpy_rate import raw_rate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from kbtrace.capture import capture  # noqa: E402
from kbtrace.replay import ReplayOptions, replay  # noqa: E402
from kbtrace.replay.compare import compare_runs  # noqa: E402
from kbtrace.topology import compile_topology  # noqa: E402

TOPO = ROOT / "topologies" / "small.yaml"
SIZES = (256, 512, 832)           # gemm M = N; ops grow ~ M*N: 512 -> 5,408 ops: 10.6x
REPEATS = {"fast": 7, "flit": 2}  # best of N runs per figure
RAW_REPEATS = 5
TARGET_RATIO = 0.5                # issue 4: fast hops/s >= 0.5x raw SimPy timeouts/s
FLOOR_RATIO = 0.08                # regression floor (before the speed-ups: 0.04-0.07)


RAW_SAMPLES: list[float] = []     # every raw rate measured in this process


def raw_simpy_rate(n: int = 300_000, repeats: int = RAW_REPEATS) -> float:
    """Best of ``repeats``: timeouts/s of one process yielding ``env.timeout(1)``
    (each sample is kept in ``RAW_SAMPLES``)."""
    best = max(raw_rate(n, time.perf_counter) for _ in range(repeats))
    RAW_SAMPLES.append(best)
    return best


def contention_trace(topo, n_pe: int = 8, rounds: int = 4, nbytes: int = 65536):
    from test_replay_util import SynthTrace, hbm, load
    rows = []
    for p in range(n_pe):
        for r in range(rounds):
            rows.append(load(hbm(0, 0, 0, topo, (p * rounds + r) * nbytes), nbytes, pe=p,
                             program=p, seq=r))
    return SynthTrace(rows, "hot_slice_8pe")


def _replay(trace, topo, fid, out):
    r = replay(trace, topo, ReplayOptions(fidelity=fid, out_dir=str(out)))
    if fid == "fast":
        raw_simpy_rate(100_000, repeats=1)      # sample the baseline in the same window
    return r


def throughput(tmp: Path, topo) -> list[tuple[str, int, int, int, float, float]]:
    rows = []
    for m in SIZES:
        tr = capture(ROOT / "capture" / "gemm.py", topo, {"M": m, "N": m, "K": 128},
                     tmp / f"gemm{m}")
        for fid in ("fast", "flit"):
            runs = [_replay(tr, topo, fid, tmp / f"gemm{m}-{fid}") for _ in range(REPEATS[fid])]
            r = min(runs, key=lambda r: r.wall_s)
            rows.append((fid, m, r.ops, r.hops, r.wall_s, r.hops / r.wall_s))
    return rows


def _fabric_class():
    """The fast fabric class replay uses: the compiled twin where it is built (wrapping the
    ``.py`` module's class then timed nothing, and the booking showed up as "rest")."""
    from kbtrace.replay.fabric.core import status
    return status()[0]


PHASES = (("trace read + spill", "kbtrace.replay.source", "OpSource", "_read"),
          ("op records (fed per program)", "kbtrace.replay.source", "OpSource", "records"),
          ("fabric booking", None, _fabric_class, "send"),
          ("hop rows + Parquet", "kbtrace.replay.recorder", "Recorder", "flush"),
          ("busy windows", "kbtrace.replay.invariants", "BusyCheck", "add"),
          ("end-of-run invariants", "kbtrace.replay.invariants", None, "check"))
INSIDE = {"busy windows": "hop rows + Parquet"}   # timed inside the other: subtract it there


def phase_breakdown(tmp: Path, topo, m: int = SIZES[-1]) -> tuple[dict[str, float], int, int]:
    """Best-of-N fast replay of gemm ``m`` with the ``PHASES`` functions timed (seconds);
    ``rest`` = wall minus the phases. Returns (phases of the best run, ops, hops)."""
    import importlib
    acc: dict[str, float] = {}
    saved = []

    def timed(label, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[label] = acc.get(label, 0.0) + time.perf_counter() - t0
        return wrapper

    for label, mod, cls, name in PHASES:
        if callable(cls):
            owner = cls()
        else:
            owner = importlib.import_module(mod)
            owner = getattr(owner, cls) if cls else owner
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, timed(label, getattr(owner, name)))
    try:
        tr = capture(ROOT / "capture" / "gemm.py", topo, {"M": m, "N": m, "K": 128}, tmp / f"gemm{m}")
        best: tuple[float, dict[str, float]] | None = None
        for _ in range(REPEATS["fast"]):
            acc.clear()
            r = _replay(tr, topo, "fast", tmp / f"phases{m}")
            if best is None or r.wall_s < best[0]:
                best = (r.wall_s, dict(acc))
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    wall, ph = best
    for inner, outer in INSIDE.items():
        ph[outer] -= ph.get(inner, 0.0)
    ph["rest: PE pipeline, HBM, plans, SimPy"] = wall - sum(ph.values())
    ph["wall"] = wall
    return ph, r.ops, r.hops


def row_kinds(hops: pa.Table) -> tuple[int, int, int]:
    """(explicit rows, transfers, rows the transfers expand to) of a fast run's hop table.

    Link rows and the terminal row of a data transfer (``hbm`` / ``sram`` / ``pcie`` /
    ``fabric`` with bytes at the destination) come from one compact record per transfer;
    engine rows and control messages are explicit tuples."""
    stage = np.asarray(hops.column("stage").cast(pa.string()).to_pylist())
    link = hops.column("link_idx").to_numpy()
    nb = hops.column("nbytes").to_numpy()
    terminal = (link < 0) & (nb > 0) & np.isin(stage, ["hbm", "sram", "pcie", "fabric"])
    compact_rows = int((link >= 0).sum() + terminal.sum())
    return hops.num_rows - compact_rows, int(terminal.sum()), compact_rows


def skeleton_floor(n_ops: int, n_x: int, n_c: int, n_crows: int,
                   repeats: int = REPEATS["fast"]) -> float:
    """Best-of-N wall (s) of a replay that models nothing (see module docstring, 4.)."""
    from kbtrace import schema
    from kbtrace._io import ROW_GROUP_SIZE, _pq_opts
    per_x = [n_x * (i + 1) // n_ops - n_x * i // n_ops for i in range(n_ops)]
    per_c = [n_c * (i + 1) // n_ops - n_c * i // n_ops for i in range(n_ops)]
    k = max(1, round(n_crows / max(n_c, 1)))      # rows per transfer
    best = float("inf")
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            env = simpy.Environment()
            x: list[tuple] = []
            c: list[tuple] = []

            def ops(env, x, c):
                for i in range(n_ops):
                    yield env.timeout(1.0)
                    t = env.now
                    for _ in range(per_x[i]):
                        x.append((i, -1, 1, 3, -1, t, t + 1.0, 1.0, 0.0, 0))
                    for _ in range(per_c[i]):
                        c.append((len(x), i, -1, 0, t, t, t + 2.0, k))

            env.process(ops(env, x, c))
            env.run()
            X = np.fromiter((v for r in x for v in r), np.float64, count=10 * len(x))
            X = X.reshape(-1, 10)
            C = np.fromiter((v for r in c for v in r), np.float64, count=8 * len(c))
            C = C.reshape(-1, 8)
            rep = np.repeat(np.arange(len(c)), C[:, 7].astype(np.int64))
            cols = []
            for f, i in zip(schema.HOPS, (0, None, 1, 2, 3, 4, 5, 6, 7, 8, None, 9), strict=True):
                v = np.concatenate((X[:, i] if i is not None else np.zeros(len(x)),
                                    C[:, 7][rep] if i != 2 else np.ones(len(rep))))
                if pa.types.is_dictionary(f.type):
                    cols.append(pa.DictionaryArray.from_arrays(
                        pa.array(v.astype(np.int16)), pa.array(list(schema.STAGES))))
                else:
                    cols.append(pa.array(v.astype(f.type.to_pandas_dtype())))
            tab = pa.Table.from_arrays(cols, schema=schema.HOPS)
            pq.write_table(tab, Path(d) / "h.parquet", row_group_size=ROW_GROUP_SIZE,
                           **_pq_opts(tab.schema))
            best = min(best, time.perf_counter() - t0)
    return best


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


def marginal_us_per_hop(rows) -> list[float]:
    """Wall added per hop between consecutive sizes (µs): flat when cost grows linearly.

    (Total µs/hop also carries the fixed per-run cost -- opening the trace, writing four
    Parquet files and run.json, ~5 ms -- which weighs most at the smallest size.)
    """
    return [1e6 * (b[4] - a[4]) / (b[3] - a[3]) for a, b in zip(rows, rows[1:], strict=False)]


def main() -> dict:
    topo = compile_topology(TOPO)
    raw_simpy_rate()
    with tempfile.TemporaryDirectory() as d:
        tp = throughput(Path(d), topo)
        ph, ph_ops, ph_hops = phase_breakdown(Path(d), topo)
        n_x, n_c, n_crows = row_kinds(pq.read_table(Path(d) / f"phases{SIZES[-1]}" /
                                                    "hops.parquet"))
        floor = skeleton_floor(ph_ops, n_x, n_c, n_crows)
        fi = fidelity(Path(d), topo)
    raw = max(RAW_SAMPLES)
    print(f"raw SimPy: {raw:,.0f} timeouts/s (one process; best of {len(RAW_SAMPLES)} samples "
          f"taken before and between the replays, lowest {min(RAW_SAMPLES):,.0f})\n")
    print("| mode | gemm M=N | ops | hops | wall s | hops/s | x raw SimPy rate | us/hop |")
    print("|---|---|---|---|---|---|---|---|")
    for fid, m, ops, hops, wall, rate in tp:
        print(f"| {fid} | {m} | {ops:,} | {hops:,} | {wall:.3f} | {rate:,.0f} | {rate / raw:.3f} | "
              f"{1e6 * wall / hops:.2f} |")
    for fid in ("fast", "flit"):
        mg = marginal_us_per_hop([r for r in tp if r[0] == fid])
        print(f"\n{fid}: marginal us/hop between sizes: {', '.join(f'{x:.2f}' for x in mg)}", end="")
    print()
    budget = ph_hops / (TARGET_RATIO * raw)       # wall the target allows for this trace
    print(f"\nfast gemm {SIZES[-1]} ({ph_ops:,} ops, {ph_hops:,} hops): where the time goes "
          f"(the {TARGET_RATIO}x target allows {1e3 * budget:.0f} ms in all)\n")
    print("| phase | ms | share | us/op | us/hop |")
    print("|---|---|---|---|---|")
    for label, sec in ph.items():
        print(f"| {label} | {1e3 * sec:.1f} | {100 * sec / ph['wall']:.0f}% | "
              f"{1e6 * sec / ph_ops:.2f} | {1e6 * sec / ph_hops:.2f} |")
    model = ph["wall"] - floor
    print(f"\nfloor (a replay that models nothing: {ph_ops:,} SimPy timeouts, {n_x:,} explicit "
          f"rows, {n_c:,} compact transfers -> {n_crows:,} rows, same Parquet write): "
          f"{1e3 * floor:.1f} ms = {ph_hops / floor / raw:.2f}x raw. The {TARGET_RATIO}x target "
          f"leaves {1e6 * (budget - floor) / ph_ops:.1f} us/op for the model; it costs "
          f"{1e6 * model / ph_ops:.1f} us/op now ({model / (budget - floor):.1f}x over).")
    print("\n| workload | flit makespan ns | fast makespan ns | makespan err | median op err | "
          "speed-up |")
    print("|---|---|---|---|---|---|")
    for name, a, b, me, oe, sp in fi:
        print(f"| {name} | {a:,.1f} | {b:,.1f} | {100 * me:.2f}% | {100 * oe:.2f}% | {sp:.1f}x |")
    return {"raw": raw, "throughput": tp, "fidelity": fi, "phases": ph, "floor": floor}


@pytest.mark.benchmark
def test_bench_replay():
    res = main()
    fast = [r for r in res["throughput"] if r[0] == "fast"]
    marginal = marginal_us_per_hop(fast)
    assert max(marginal) < 2.0 * min(marginal), marginal   # linear: marginal cost per hop flat
    gaps = []
    for name, _a, _b, me, oe, _sp in res["fidelity"]:
        assert oe <= 0.05, name
        assert me <= 0.02, (name, me)       # issue 4: makespan within 2% (all_gather 0.94%)
    gemm = next(r for r in res["fidelity"] if r[0] == "gemm")
    assert gemm[5] >= 10.0
    ratio = fast[-1][5] / res["raw"]                  # largest size: start-up amortised
    assert ratio >= FLOOR_RATIO, f"fast {ratio:.3f}x raw SimPy rate, below the floor {FLOOR_RATIO}"
    if ratio < TARGET_RATIO:
        gaps.append(f"fast replay at {ratio:.2f}x the raw SimPy rate < {TARGET_RATIO}x")
    if gaps:
        pytest.xfail("issue 4 targets not met (known gaps, see docs/replay.md): " + "; ".join(gaps))


if __name__ == "__main__":
    parser(__doc__).parse_args()
    main()
