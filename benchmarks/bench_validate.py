"""Cost of replay's trace validation (``kbtrace.replay.validate``) on a large gemm trace.

Captures gemm (M=N=2048, K=5120: ~1M ops, golden off) on small.yaml once, then times, in
the same process, reading the ops columns replay reads, ``validate_ops`` on them, and
``load_ops`` (replay's own per-op conversion, the baseline the validator is compared to).
Prints one Markdown row per measurement; ratios are against ``load_ops`` of the same run.

    PYTHONPATH=src python benchmarks/bench_validate.py [--m 2048 --k 5120] [--keep DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.benchmark


def _best(fn, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(m: int, k: int, keep: Path | None = None) -> dict[str, float]:
    from kbtrace._io import read_parquet_lean
    from kbtrace.capture import capture
    from kbtrace.replay.ops import COLUMNS, load_ops
    from kbtrace.replay.validate import validate_ops
    from kbtrace.topology import compile_topology
    topo = compile_topology(ROOT / "topologies" / "small.yaml")
    tmp = keep or Path(tempfile.mkdtemp())
    tdir = tmp / f"gemm{m}x{k}"
    if not (tdir / "trace.json").is_file():
        capture(ROOT / "capture" / "gemm.py", topo, {"M": m, "N": m, "K": k}, tdir, golden=False)
    table = read_parquet_lean(tdir / "ops.parquet", list(COLUMNS))
    read_s = _best(lambda: read_parquet_lean(tdir / "ops.parquet", list(COLUMNS)), 1)
    val_s = _best(lambda: validate_ops(table, topo, {}))
    load_s = _best(lambda: load_ops(table), 1)
    return {"ops": table.num_rows, "read_s": read_s, "validate_s": val_s, "load_ops_s": load_s}


def test_validate_is_cheap(tmp_path):
    r = measure(512, 1024, tmp_path)
    assert r["validate_s"] < r["load_ops_s"], r


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--keep", type=Path, default=None)
    a = ap.parse_args()
    r = measure(a.m, a.k, a.keep)
    print("| ops | read ops.parquet s | validate_ops s | load_ops s | validate / load_ops |")
    print("|---|---|---|---|---|")
    print(f"| {r['ops']:,} | {r['read_s']:.2f} | {r['validate_s']:.3f} | {r['load_ops_s']:.2f} "
          f"| {r['validate_s'] / r['load_ops_s']:.3f} |")
