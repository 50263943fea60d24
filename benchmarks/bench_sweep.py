"""Sweep wall time, ``-j 2`` against ``-j 1`` (issue 22, target 7); not part of the default
test run.

Run:  python benchmarks/bench_sweep.py [--repeats 2]
      pytest benchmarks/bench_sweep.py -m benchmark

Three sweeps over ``small.yaml`` (4 points each: ``cube.hbm.pc_bw_gbps`` in 8, 16, 32, 64),
each run with ``jobs=1`` and ``jobs=2``, alternating, best wall time of ``--repeats``:

* ``tiny``: gemm M = N = K = 128 (128 ops per point): worker start-up would dominate, so
  ``-j 2`` must run the points here (never slower than ``-j 1``);
* ``10k``: gemm M = N = 512, K = 1280 (15,872 ops per point), a captured trace;
* ``capture``: two gemm workloads (BM 16 / 32, M = N = 512, K = 1024) captured by the
  sweep, then replayed: the captures run here and in the worker at once.

``-j 2`` is this process plus one worker (``_sweepsafe.Pool``). Each row also gives the CPU
seconds the sweep used (this process and its workers, reaped) and the mean load average
over its runs: on a machine where other jobs hold the cores, a second process gains little
wall time, and the CPU columns show whether the work itself grew.

Wall time on a shared machine depends on the neighbours: the load average is printed with
the figures (2 cores; a load above 2 means ``-j 2`` competes for them).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = str(ROOT / "topologies" / "small.yaml")
GRID = {"cube.hbm.pc_bw_gbps": [8, 16, 32, 64]}


def configs(tmp: Path) -> dict[str, dict]:
    from kbtrace.capture import capture
    out = {}
    for name, params in (("tiny", {"M": 128, "N": 128, "K": 128}),
                         ("10k", {"M": 512, "N": 512, "K": 1280})):
        d = tmp / f"trace-{name}"
        capture(ROOT / "capture" / "gemm.py", SMALL, params, d)
        out[name] = {"traces": [str(d)], "topologies": [SMALL], "grid": GRID}
    out["capture"] = {"workloads": [{"path": str(ROOT / "capture" / "gemm.py"),
                                     "params": {"M": 512, "N": 512, "K": 1024},
                                     "grid": {"BM": [16, 32]}}],
                      "topologies": [SMALL], "grid": {"cube.hbm.pc_bw_gbps": [8, 32]}}
    return out


def _cpu() -> float:
    """CPU seconds of this process and of its reaped children (the sweep's workers)."""
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime


def measure(repeats: int, tmp: Path) -> list[tuple[str, float, float, float, float, float]]:
    """Per sweep: best wall time of -j 1 and -j 2, the CPU seconds each used (this process
    and its workers) and the mean 1-minute load average over its runs."""
    from kbtrace.replay.sweep import run_sweep
    rows = []
    for name, cfg in configs(tmp).items():
        best = {1: float("inf"), 2: float("inf")}
        cpu = {1: float("inf"), 2: float("inf")}
        loads = []
        for r in range(repeats):
            for jobs in (1, 2):
                out = tmp / f"{name}-{jobs}-{r}"
                loads.append(os.getloadavg()[0])
                c0, t0 = _cpu(), time.perf_counter()
                res = run_sweep(cfg, out, jobs=jobs)
                wall, used = time.perf_counter() - t0, _cpu() - c0
                if wall < best[jobs]:
                    best[jobs], cpu[jobs] = wall, used
                assert res.ok, res.failed
                shutil.rmtree(out)
        rows.append((name, best[1], best[2], cpu[1], cpu[2], sum(loads) / len(loads)))
    return rows


def table(rows: list[tuple[str, float, float, float, float, float]]) -> str:
    load = os.getloadavg()
    lines = [f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on "
             f"{os.cpu_count()} cores (a load above 2 means -j 2 competes for them)", "",
             "| sweep | -j 1 s | -j 2 s | speed-up | -j 1 CPU s | -j 2 CPU s | load |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {n} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {ca:.2f} | {cb:.2f} | {ld:.1f} |"
              for n, a, b, ca, cb, ld in rows]
    return "\n".join(lines)


@pytest.mark.benchmark
def test_sweep_jobs(tmp_path):
    rows = measure(1, tmp_path)
    print(table(rows))
    assert len(rows) == 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        print(table(measure(a.repeats, Path(tmp))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
