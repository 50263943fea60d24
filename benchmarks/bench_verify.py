"""CPU cost per op of ``kbtrace verify`` at model scale (issue 22, target 2's verify stage);
not part of the default test run.

Run:  python benchmarks/bench_verify.py [--ops 100000] [--topology default] [--repeats 3]
                                        [--out DIR] [--against SRC ...]
      pytest benchmarks/bench_verify.py -m benchmark

Makes one run (``kbtrace run`` of gemm i32 over every PE of the topology, fast-fcfs, no
report: the sizes of ``bench_e2e.gemm_params``), or reuses the one under ``--out``, then
times ``verify(run)`` in fresh interpreters: this checkout's ``src`` and each ``--against``
source tree (e.g. ``git archive <commit> src | tar -x -C /tmp/old``), alternating, so load
changes hit all of them alike. Figures per tree: CPU µs per op (``time.process_time`` of
the ``verify`` call, best and median of ``--repeats``) and the same in raw SimPy timeouts
per op (the baseline of ``bench_e2e``, sampled between the children; median used).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _simpy_rate import raw_rate
from bench_e2e import gemm_params

ROOT = Path(__file__).resolve().parents[1]
_CHILD = """
import json, sys, time
from kbtrace.analysis.verifier import verify
t0 = time.process_time()
r = verify(sys.argv[1])
print(json.dumps({"cpu_s": time.process_time() - t0, "ops": r.n_ops, "ok": r.ok}))
"""


def make_run(ops: int, topology: str, out: Path) -> Path:
    """The run directory of the gemm giving ``ops`` ops (made with this checkout's src)."""
    runs = sorted((out / "runs").glob("*")) if (out / "runs").is_dir() else []
    if runs:
        return runs[0]
    cmd = [sys.executable, "-m", "kbtrace", "run", "gemm", "-t", topology]
    for k, v in gemm_params(ops).items():
        cmd += ["-p", f"{k}={v}"]
    cmd += ["--fidelity", "fast-fcfs", "--no-report", "--no-attribute", "-o", str(out)]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                   stdout=subprocess.DEVNULL)
    return sorted((out / "runs").glob("*"))[0]


def time_verify(src: Path, run: Path) -> dict:
    res = subprocess.run([sys.executable, "-c", _CHILD, str(run)], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(src)})
    return json.loads(res.stdout.strip().splitlines()[-1])


def measure(run: Path, trees: list[Path], repeats: int) -> tuple[dict[str, list[dict]], list[float]]:
    figs: dict[str, list[dict]] = {str(t): [] for t in trees}
    raws = [raw_rate()]
    for _ in range(repeats):
        for t in trees:
            figs[str(t)].append(time_verify(t, run))
            raws.append(raw_rate())
    return figs, raws


def table(figs: dict[str, list[dict]], raws: list[float]) -> str:
    raw = statistics.median(raws)
    lines = [f"raw SimPy: {raw / 1e6:.2f} M timeouts per CPU s (median of {len(raws)}, "
             f"{min(raws) / 1e6:.2f}-{max(raws) / 1e6:.2f})",
             "| source | ops | CPU µs/op best | median | timeouts/op (median) | verdict |",
             "|---|---:|---:|---:|---:|---|"]
    for src, rows in figs.items():
        us = sorted(r["cpu_s"] / r["ops"] * 1e6 for r in rows)
        med = statistics.median(us)
        lines.append(f"| {src} | {rows[0]['ops']:,} | {us[0]:.1f} | {med:.1f} | "
                     f"{med * 1e-6 * raw:.0f} | {'PASS' if all(r['ok'] for r in rows) else 'FAIL'} |")
    return "\n".join(lines)


@pytest.mark.benchmark
def test_verify_cost_per_op(tmp_path):
    run = make_run(20_000, "default", tmp_path)
    figs, raws = measure(run, [ROOT / "src"], 1)
    (row,) = figs[str(ROOT / "src")]
    assert row["ok"] and row["ops"] >= 20_000
    assert row["cpu_s"] / row["ops"] * statistics.median(raws) < 150   # timeouts per op


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--topology", default="default")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="run root to make or reuse (default: temporary)")
    ap.add_argument("--against", nargs="*", default=[],
                    help="other kbtrace source trees (their src directory) to alternate with")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.out) if a.out else Path(tmp)
        run = make_run(a.ops, a.topology, out)
        trees = [ROOT / "src", *(Path(p).resolve() for p in a.against)]
        figs, raws = measure(run, trees, a.repeats)
    print(f"verify of {run.name}")
    print(table(figs, raws))
    return 0


if __name__ == "__main__":
    sys.exit(main())
