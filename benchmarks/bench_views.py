"""The headline views: ``_pe_segments`` and ``_busy_islands`` materialised by DuckDB (the SQL
files) vs by their numpy twins (``kbtrace.analysis.islands``), in one process, alternating.

Run:  python benchmarks/bench_views.py [RUN_DIR] [--repeats N]
      pytest benchmarks/bench_views.py -m benchmark

Without RUN_DIR, gemm M = N = 1,024, K = 2,048 (BM = BN = 32, BK = 64, i32: 100,352 ops,
~2.9 M hops) is captured and replayed on ``topologies/default.yaml`` (``fast-fcfs``) into a
temporary directory first. Prints each mode's wall seconds per repeat and the ratio of the
medians; both modes must give the same rows (checked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest

VIEWS = ("_pe_segments", "_busy_islands")
PARAMS = ["M=1024", "N=1024", "K=2048", "BM=32", "BN=32", "BK=64", "dtype=i32"]


def measure(run_dir: Path, repeats: int) -> dict[str, list[float]]:
    from kbtrace.analysis import islands
    from kbtrace.analysis import run as run_mod
    from kbtrace.analysis.run import open_run

    res: dict[str, list[float]] = {"sql": [], "numpy": []}
    rows: dict[str, list] = {}
    try:
        for _ in range(repeats):
            for mode in ("sql", "numpy"):
                run_mod.TWINS = dict(islands.TWINS) if mode == "numpy" else {}
                with open_run(run_dir) as r:
                    t = time.perf_counter()
                    r.materialize(VIEWS)
                    res[mode].append(time.perf_counter() - t)
                    rows[mode] = [r.con.sql(f"SELECT count(*), min(t0_ns), max(t1_ns) FROM {v}")
                                  .fetchall() for v in VIEWS]
    finally:
        run_mod.TWINS = dict(islands.TWINS)
    assert rows["sql"] == rows["numpy"], "the twins' rows differ from the views'"
    return res


def make_run(root: Path) -> Path:
    from kbtrace.analysis.main import run_workload
    s = run_workload("gemm", topology="default", params=PARAMS, fidelity="fast-fcfs",
                     out=root, verify_data=False, make_report=False, attribute=False)
    return s.run_dir


def report(res: dict[str, list[float]], hops: int) -> str:
    sql, num = statistics.median(res["sql"]), statistics.median(res["numpy"])
    return (f"{hops:,} hops: DuckDB {', '.join(f'{x:.2f}' for x in res['sql'])} s, numpy twins "
            f"{', '.join(f'{x:.2f}' for x in res['numpy'])} s; median ratio {sql / num:.1f}x")


def _hops(run_dir: Path) -> int:
    import json
    return int(json.loads((run_dir / "run.json").read_text())["hops"])


@pytest.mark.benchmark
def test_twins_faster_than_sql(tmp_path):
    run_dir = make_run(tmp_path)
    res = measure(run_dir, 1)
    print(report(res, _hops(run_dir)))
    assert min(res["numpy"]) < min(res["sql"])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", type=Path)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = a.run or make_run(Path(tmp))
        print(report(measure(run_dir, a.repeats), _hops(run_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
