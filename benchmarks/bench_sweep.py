"""Sweeps, ``-j 2`` against ``-j 1`` (issue 22, target 7): wall time, and where the CPU time
goes; not part of the default test run.

Run:  python benchmarks/bench_sweep.py [--repeats 2] [--force-workers] [--sweeps 10k,capture] [--ab]
      pytest benchmarks/bench_sweep.py -m benchmark

Sweeps over ``small.yaml`` (4 points, ``cube.hbm.pc_bw_gbps`` in 8, 16, 32, 64, unless said),
each run with ``jobs=1`` and ``jobs=2``, alternating, best wall time of ``--repeats``:

* ``tiny``: gemm M = N = K = 128 (128 ops per point): worker start-up would dominate, so
  ``-j 2`` must run the points here (never slower than ``-j 1``);
* ``10k``: gemm M = N = 512, K = 1280 (15,872 ops per point), a captured trace;
* ``10k re-run``: the same sweep re-run into its directory: the points go out largest
  first by the CPU seconds each took in the earlier run (``point.json``), not by trace ops
  (which are equal);
* ``10k x 8``: the same trace at 8 points (``pc_bw_gbps`` 8 to 96), a first run: with more
  points than processes the pool balances unequal points better than with 4, one of which
  costs 2.5x each other one;
* ``capture``: two gemm workloads (BM 16 / 32, M = N = 512, K = 1024) captured by the
  sweep (2 points each: 8, 32): captures and points are one set of jobs, each point
  starting once its trace is captured;
* ``10k by ops`` (``--ab``): ``10k`` handed out as before the cost prediction
  (``replay/_sweepcost``): by trace ops alone, so config order for one trace; measured
  alternating with the others, for the A/B in one run.

A first run hands points out largest first by ``_sweepcost.cost`` (trace ops x a contention
factor of the point's topology parameters). ``--sweeps`` picks sweeps by name.

``-j 2`` is this process plus one worker (``_sweepsafe.Pool``). The first table gives the
best wall times, the CPU seconds of those runs (this process and its workers, reaped) and
the mean load average: on a machine where other jobs hold the cores a second process gains
little wall time (and by default none starts where other processes use every core:
``_sweepsafe.free_cores``).

The second table is the check that holds on a loaded machine: ``SweepResult.cpu``
(``replay/_sweepcpu``) of the least-CPU run at each ``-j``. The serial part is this
process's CPU outside jobs (planning, pinning, dispatch, writing the sweep's files); the
jobs are each capture (``c``) and point (``p``) with their own CPU seconds, in the order
``-j 2`` prefers them. From the ``-j 1`` run: Amdahl's bound on 2 cores (serial part + jobs
/ 2) and the speed-up predicted by playing the pool's policy over the measured jobs
(``_sweepcpu.predict``: each free process takes the first ready job; a worker is up after
0.03 s), both against ``-j 1``'s CPU seconds; from the ``-j 2`` run: its CPU in this process
and in the worker, what it spent beyond ``-j 1`` (start-up, cold caches, and jobs slowed by
the other core: shared caches and memory), how the jobs split, and the prediction from its
own job times. ``--force-workers`` starts the worker whatever the load average says.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kbtrace.replay._sweepcpu import SweepCpu

ROOT = Path(__file__).resolve().parents[1]
SMALL = str(ROOT / "topologies" / "small.yaml")
GRID = {"cube.hbm.pc_bw_gbps": [8, 16, 32, 64]}
GRID8 = {"cube.hbm.pc_bw_gbps": [8, 12, 16, 24, 32, 48, 64, 96]}


def configs(tmp: Path) -> dict[str, dict]:
    from kbtrace.capture import capture
    out = {}
    for name, params in (("tiny", {"M": 128, "N": 128, "K": 128}),
                         ("10k", {"M": 512, "N": 512, "K": 1280})):
        d = tmp / f"trace-{name}"
        capture(ROOT / "capture" / "gemm.py", SMALL, params, d)
        out[name] = {"traces": [str(d)], "topologies": [SMALL], "grid": GRID}
    out["10k re-run"] = out["10k"]
    out["10k x 8"] = dict(out["10k"], grid=GRID8)
    out["10k by ops"] = out["10k"]
    out["capture"] = {"workloads": [{"path": str(ROOT / "capture" / "gemm.py"),
                                     "params": {"M": 512, "N": 512, "K": 1024},
                                     "grid": {"BM": [16, 32]}}],
                      "topologies": [SMALL], "grid": {"cube.hbm.pc_bw_gbps": [8, 32]}}
    return out


def _cpu() -> float:
    """CPU seconds of this process and of its reaped children (the sweep's workers)."""
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime


def _busy_s() -> float:
    """CPU seconds every process on the machine has used (``/proc/stat``; 0 where none)."""
    from kbtrace.replay._sweepsafe import _busy_jiffy_s
    return _busy_jiffy_s() or 0.0


@dataclass
class Row:
    """One sweep's figures: best wall time per -j, the CPU seconds of that run (this
    process and its workers), the mean load average, and the least-CPU run's
    ``SweepResult.cpu`` per -j (its decomposition)."""
    name: str
    wall: dict[int, float] = field(default_factory=dict)
    cpu: dict[int, float] = field(default_factory=dict)
    load: float = 0.0
    prof: dict[int, SweepCpu] = field(default_factory=dict)
    #: every run's wall s and the cores other processes used meanwhile, in order
    walls: dict[int, list[tuple[float, float]]] = field(default_factory=dict)


def measure(repeats: int, tmp: Path, force_workers: bool = False,
            names: list[str] | None = None) -> list[Row]:
    """Each sweep (of ``names``, default all but ``10k by ops``) at -j 1 and -j 2,
    alternating, ``repeats`` times; with several sweeps, round by round over them, so that
    the load falls on all alike. ``force_workers``: -j 2 starts its worker whatever other
    processes use (``_sweepsafe.free_cores``), so that a loaded machine still yields the
    -j 2 decomposition (its wall time then means little)."""
    from kbtrace.replay import _sweepsafe, sweep
    from kbtrace.replay.sweep import run_sweep
    if force_workers:
        _sweepsafe.free_cores = lambda: os.cpu_count() or 1
    every = configs(tmp)
    names = names or [n for n in every if n != "10k by ops"]
    rows = {n: Row(n, {1: float("inf"), 2: float("inf")}) for n in names}
    loads: dict[str, list[float]] = {n: [] for n in names}
    predicted = sweep.cost
    for r in range(repeats):
        for name in names:
            cfg, row = every[name], rows[name]
            sweep.cost = _sweepsafe.work if name.endswith("by ops") else predicted
            for jobs in (1, 2):
                rerun = name.endswith("re-run")     # into the sweep's earlier directory
                out = tmp / f"{name}-{jobs}" if rerun else tmp / f"{name}-{jobs}-{r}"
                if rerun and not out.exists():
                    run_sweep(cfg, out, jobs=jobs)  # (untimed: the run it re-runs)
                loads[name].append(os.getloadavg()[0])
                c0, b0, t0 = _cpu(), _busy_s(), time.perf_counter()
                res = run_sweep(cfg, out, jobs=jobs)
                wall, used = time.perf_counter() - t0, _cpu() - c0
                others = max(0.0, _busy_s() - b0 - used) / wall
                row.walls.setdefault(jobs, []).append((round(wall, 2), round(others, 2)))
                if wall < row.wall[jobs]:
                    row.wall[jobs], row.cpu[jobs] = wall, used
                if jobs not in row.prof or res.cpu.total_s < row.prof[jobs].total_s:
                    row.prof[jobs] = res.cpu
                assert res.ok, res.failed
                if not rerun:
                    shutil.rmtree(out)
    sweep.cost = predicted
    for n in names:
        rows[n].load = sum(loads[n]) / len(loads[n])
    return list(rows.values())


def table(rows: list[Row]) -> str:
    """Wall times (what a user waits for; meaningful on an idle machine only)."""
    load = os.getloadavg()
    lines = [f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on "
             f"{os.cpu_count()} cores (a load above 2 means -j 2 competes for them)", "",
             "| sweep | -j 1 s | -j 2 s | speed-up | -j 1 CPU s | -j 2 CPU s | load |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r.name} | {r.wall[1]:.2f} | {r.wall[2]:.2f} | {r.wall[1] / r.wall[2]:.2f}x | "
              f"{r.cpu[1]:.2f} | {r.cpu[2]:.2f} | {r.load:.1f} |" for r in rows]
    lines += ["", "every run's wall s, -j 1 / -j 2 in the order run, with the cores other "
              "processes used meanwhile (/proc/stat; the machine was quiet for a pair where "
              "both are near 0):", ""]
    lines += [f"- {r.name}: " + ", ".join(
        f"{a[0]} ({a[1]}) / {b[0]} ({b[1]}) = {a[0] / b[0]:.2f}x" for a, b in zip(
            r.walls.get(1, []), r.walls.get(2, []), strict=True)) for r in rows]
    return "\n".join(lines)


def cpu_table(rows: list[Row]) -> str:
    """The CPU-time decomposition (least-CPU run of each -j) and the speed-up it predicts
    on 2 idle cores (``_sweepcpu``): checkable on a loaded machine."""
    from kbtrace.replay._sweepcpu import predict
    lines = ["| sweep | -j 1 CPU s | serial s (share) | jobs: CPU s | Amdahl bound | "
             "predicted -j 2 | -j 2 CPU s: here + workers | extra | -j 2 jobs here / worker "
             "| predicted with -j 2's job times |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        one, two = r.prof[1], r.prof[2]
        t1 = one.total_s
        jobs = " ".join(f"{j.kind[0]}{j.index}:{j.cpu_s:.2f}" for j in one.jobs)
        amdahl = t1 / (one.serial_s + one.jobs_s / 2)
        here = sum(j.here for j in two.jobs)
        pred1 = f"{t1 / predict(one, 2):.2f}x"
        if two.workers_s == 0:      # -j 2 started no worker (too little work, or no free core)
            par = "no worker: -j 1's work"
            pred1, pred2 = f"1.00x (with a worker {pred1})", "–"
        else:
            off = two.workers_s - sum(j.cpu_s for j in two.jobs if not j.here)
            par = (f"{two.here_s:.2f} + {two.workers_s:.2f} (outside jobs: "
                   f"{two.serial_s:.2f} + {off:.2f})")
            pred2 = f"{t1 / predict(two, 2):.2f}x"
        lines.append(f"| {r.name} | {t1:.2f} | {one.serial_s:.3f} ({one.serial_s / t1:.1%}) | "
                     f"{one.jobs_s:.2f}: {jobs} | {amdahl:.2f}x | {pred1} | "
                     f"{par} | {two.total_s - t1:+.2f} | {here} / {len(two.jobs) - here} | "
                     f"{pred2} |")
    phases = sorted({k for r in rows for k in r.prof[1].phases})
    lines += ["", "this process's CPU s per phase at -j 1 (jobs run in `capture` and `run`):", "",
              "| sweep | " + " | ".join(phases) + " |", "|---|" + "---:|" * len(phases)]
    lines += [f"| {r.name} | " + " | ".join(f"{r.prof[1].phases.get(k, 0.0):.3f}" for k in phases)
              + " |" for r in rows]
    return "\n".join(lines)


@pytest.mark.benchmark
def test_sweep_jobs(tmp_path):
    rows = measure(1, tmp_path, force_workers=True)
    print(table(rows))
    print(cpu_table(rows))
    assert [r.name for r in rows] == ["tiny", "10k", "10k re-run", "10k x 8", "capture"]
    assert all(r.prof[1].serial_s < 0.2 * r.prof[1].total_s for r in rows[1:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--force-workers", action="store_true",
                    help="start -j 2's worker whatever the load (for the CPU decomposition on a "
                         "loaded machine; its wall times then mean little)")
    ap.add_argument("--sweeps", help="comma-separated sweep names (default: all but "
                    "'10k by ops')")
    ap.add_argument("--ab", action="store_true",
                    help="also '10k by ops' (points handed out by trace ops, as before the "
                         "cost prediction), alternating with the others")
    a = ap.parse_args(argv)
    names = a.sweeps.split(",") if a.sweeps else None
    if a.ab:
        names = [*(names or ["tiny", "10k", "10k re-run", "10k x 8", "capture"]), "10k by ops"]
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(a.repeats, Path(tmp), a.force_workers, names)
        print(table(rows))
        print()
        print(cpu_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
