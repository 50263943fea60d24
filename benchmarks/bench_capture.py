"""Capture throughput (ops/s) on the gemm workload next to the raw greenlet switch-pair rate.

Run:  python benchmarks/bench_capture.py            (prints a JSON line)
      python benchmarks/bench_capture.py --no-scale (without the ~100 k-op capture)
      pytest benchmarks/bench_capture.py -m benchmark
Targets, both rates measured here: issue 3, capture kernel ops/s >= 0.15 x greenlet switch
pairs/s (asserted); issue 22, >= 0.3 x, and the whole capture <= 3x its kernel phase
(reported: ``meets_issue22``).

The switch-pair rate is sampled before every capture and once after the last (issue 22: a
single sample made the ratio swing 0.09-0.27 on a shared machine), so both sides are
best-of-N over the same stretch of time; ``switch_samples`` lists them all. Figures (best
of ``REPEATS`` captures each; the box is shared, so the best run is the one least
disturbed by other jobs):

* ``kernel_ops_per_s`` -- the kernel phase: greenlets run the kernels, every tl.* call is
  validated (sanitizers, deadlock detection) and recorded; loads return real values.
  This is the capture throughput the target applies to (asserted).
* ``drain_ops_per_s`` -- expanding records to rows, the golden executor over every op in
  capture order (out_digest) and the Parquet batches.
* ``total_ops_per_s`` -- the whole ``capture()`` call: build, kernel phase, drain,
  reference check, memory.parquet, trace.json.

``at_scale``: the same phases per op for gemm at ~100 k ops on default.yaml (``SCALE_PARAMS``,
the shape of ``bench_e2e.py``), with CPU µs per op, where the fixed costs no longer hide
the per-op ones.

Each is also given as a ratio to the switch-pair rate (``ratio_*``) and, for the golden
capture, as microseconds per op (``us_per_op``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import greenlet
import pytest

ROOT = Path(__file__).resolve().parents[1]
PARAMS = {"M": 512, "N": 512, "K": 256}
TARGET = 0.15
REPEATS = 7


SWITCH_SAMPLES: list[float] = []   # every switch-pair rate sampled in this process


def switch_pairs_per_s(n: int = 200_000, repeats: int = 3) -> float:
    """Round trips main -> child -> main per second (one 'switch pair'); best of ``repeats``
    (each best is also kept in ``SWITCH_SAMPLES``)."""
    def child() -> None:
        parent = main_g
        while True:
            parent.switch()
    main_g = greenlet.getcurrent()
    g = greenlet.greenlet(child)
    g.switch()
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            g.switch()
        best = max(best, n / (time.perf_counter() - t0))
    SWITCH_SAMPLES.append(best)
    return best


def capture_ops_per_s(golden: bool, repeats: int = REPEATS) -> dict[str, float]:
    """Best-of-N ops/s of the kernel phase, the drain and the whole capture call on gemm."""
    from kbtrace.capture import capture
    from kbtrace.topology import compile_topology
    topo = compile_topology(ROOT / "topologies" / "small.yaml")
    best = {"kernel": 0.0, "drain": 0.0, "total": 0.0}
    n_ops = 0
    with tempfile.TemporaryDirectory() as d:
        for _ in range(repeats):
            switch_pairs_per_s(100_000, repeats=1)     # sampled in the same stretch of time
            tr = capture(ROOT / "capture" / "gemm.py", topo, params=PARAMS, out_dir=d, golden=golden)
            n_ops = tr.n_ops
            best["kernel"] = max(best["kernel"], n_ops / tr.stats["run_s"])
            best["drain"] = max(best["drain"], n_ops / tr.stats["drain_s"])
            best["total"] = max(best["total"], n_ops / tr.stats["total_s"])
    return {"ops": n_ops, **{f"{k}_ops_per_s": round(v) for k, v in best.items()}}


#: the gemm of ``bench_e2e.py`` at ~100 k ops on default.yaml (i32, 256 PEs): the scale at
#: which ``kbtrace run``'s capture stage is measured; fixed costs (build, numpy references,
#: memory.parquet) dominate the 3,584-op capture above
SCALE_PARAMS = {"M": 1024, "N": 1024, "K": 2048, "BM": 32, "BN": 32, "BK": 64, "dtype": "i32"}


def capture_at_scale(repeats: int = 2) -> dict[str, object]:
    """Best-of-``repeats`` phase times per op (µs, wall) and CPU µs per op of one capture of
    ``SCALE_PARAMS`` on default.yaml, with a switch-pair sample before each capture."""
    from kbtrace.capture import capture
    from kbtrace.topology import compile_topology
    topo = compile_topology(ROOT / "topologies" / "default.yaml")
    best: dict[str, float] = {}
    n_ops = 0
    with tempfile.TemporaryDirectory() as d:
        for _ in range(repeats):
            switch_pairs_per_s(100_000, repeats=1)
            c0 = time.process_time()
            tr = capture(ROOT / "capture" / "gemm.py", topo, params=SCALE_PARAMS, out_dir=d)
            cpu = time.process_time() - c0
            n_ops = tr.n_ops
            got = {"kernel": tr.stats["run_s"], "drain": tr.stats["drain_s"],
                   "total": tr.stats["total_s"], "cpu": cpu}
            best = {k: min(v, best.get(k, v)) for k, v in got.items()}
    return {"ops": n_ops, "us_per_op": {k: round(v / n_ops * 1e6, 2) for k, v in best.items()},
            "total_over_kernel": round(best["total"] / best["kernel"], 2)}


def measure(scale: bool = True) -> dict[str, object]:
    SWITCH_SAMPLES.clear()
    switch_pairs_per_s()
    gold = capture_ops_per_s(golden=True)
    fast = capture_ops_per_s(golden=False)
    at_scale = capture_at_scale() if scale else None
    switch_pairs_per_s()
    sw = max(SWITCH_SAMPLES)
    ratio_kernel = gold["kernel_ops_per_s"] / sw
    total_over_kernel = gold["kernel_ops_per_s"] / gold["total_ops_per_s"]
    return {"greenlet_switch_pairs_per_s": round(sw),
            "switch_samples": [round(x) for x in SWITCH_SAMPLES],
            "total_over_kernel": round(total_over_kernel, 2),
            "meets_issue22": ratio_kernel >= 0.3 and total_over_kernel <= 3.0,
            "gemm_params": PARAMS, "gemm_ops": gold["ops"],
            "golden": gold, "no_golden": fast,
            "ratio_kernel": round(gold["kernel_ops_per_s"] / sw, 4),
            "ratio_drain": round(gold["drain_ops_per_s"] / sw, 4),
            "ratio_total": round(gold["total_ops_per_s"] / sw, 4),
            "ratio_kernel_no_golden": round(fast["kernel_ops_per_s"] / sw, 4),
            "ratio_drain_no_golden": round(fast["drain_ops_per_s"] / sw, 4),
            "ratio_total_no_golden": round(fast["total_ops_per_s"] / sw, 4),
            "us_per_op": {k: round(1e6 / gold[f"{k}_ops_per_s"], 2)
                          for k in ("kernel", "drain", "total")},
            "target_ratio": TARGET,
            **({"at_scale": {**at_scale, "ratio_kernel": round(
                1e6 / at_scale["us_per_op"]["kernel"] / sw, 4)}} if at_scale else {})}


@pytest.mark.benchmark
def test_capture_throughput_vs_greenlet_switch_rate() -> None:
    res = measure(scale=False)
    print(json.dumps(res))
    assert res["ratio_kernel"] >= TARGET, res


if __name__ == "__main__":
    json.dump(measure(scale="--no-scale" not in sys.argv[1:]), sys.stdout)
    print()
