"""Capture throughput (ops/s) on the gemm workload next to the raw greenlet switch-pair rate.

Run:  python benchmarks/bench_capture.py            (prints a JSON line)
      python benchmarks/bench_capture.py --no-scale (without the ~100 k-op captures)
      python benchmarks/bench_capture.py --scale-repeats 5
      pytest benchmarks/bench_capture.py -m benchmark
Targets, both rates measured here: issue 3, capture kernel ops/s >= 0.15 x greenlet switch
pairs/s (asserted); issue 22 (target 5), at scale, >= 0.3 x, and the whole capture <= 3x
its kernel phase (reported: ``meets_issue22``).

Both sides in CPU seconds of this process (``time.process_time``; capture's
``stats["*_cpu_s"]``): on a shared machine wall-clock rates follow the neighbours (at load 5
the same capture took 2-4x its CPU time in wall time, and a 70 ms switch sample and a
seconds-long capture get different shares), CPU time does not. Paired samples: the
switch-pair rate is sampled right before every capture, and each capture's ratio is its
kernel rate over *that* sample; the ratio reported is the **median of these per-capture
ratios**. ``switch_samples`` lists every sample; best-of figures are kept beside the
medians.

* ``kernel_ops_per_s`` -- the kernel phase: greenlets run the kernels, every tl.* call is
  validated (sanitizers, deadlock detection) and recorded; loads return real values.
  This is the capture throughput the target applies to (asserted).
* ``drain_ops_per_s`` -- rows, the golden executor over every op in capture order
  (out_digest) and the Parquet batches.
* ``total_ops_per_s`` -- the whole ``capture()`` call: build, kernel phase, drain,
  reference check, memory.parquet, trace.json.

``at_scale``: the same per op for gemm at ~100 k ops on default.yaml (``SCALE_PARAMS``, the
shape of ``bench_e2e.py``), ``--scale-repeats`` captures (default 3), each with its switch
sample: per-capture ``ratio_kernel`` and ``total_over_kernel`` and their medians, and CPU
µs per op. Fixed costs no longer hide the per-op ones there.

``floor`` (with the captures at scale): what a ``tl`` call costs at least, in CPU µs and in
switch pairs per op, on the same gemm kernel: with a ``tl`` whose calls return at once
(``noop``: the kernel's own Python), and with a minimal recorder (``minimal``: a record
tuple, a handle and its weak reference per op, nothing else); 0.3x is 3.33 pairs per op.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import greenlet
import pytest

ROOT = Path(__file__).resolve().parents[1]
PARAMS = {"M": 512, "N": 512, "K": 256}
TARGET = 0.15
REPEATS = 7


SWITCH_SAMPLES: list[float] = []   # every switch-pair rate sampled in this process


def switch_pairs_per_s(n: int = 200_000, repeats: int = 3) -> float:
    """Round trips main -> child -> main per CPU second of this process (one 'switch pair');
    best of ``repeats`` (each best is also kept in ``SWITCH_SAMPLES``)."""
    def child() -> None:
        parent = main_g
        while True:
            parent.switch()
    main_g = greenlet.getcurrent()
    g = greenlet.greenlet(child)
    g.switch()
    best = 0.0
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(n):
            g.switch()
        best = max(best, n / max(time.process_time() - t0, 1e-9))
    SWITCH_SAMPLES.append(best)
    return best


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def capture_ops_per_s(golden: bool, repeats: int = REPEATS) -> dict[str, object]:
    """Per-capture ops/s of the kernel phase, the drain and the whole capture call on gemm,
    each capture paired with a switch-pair sample taken just before it."""
    from kbtrace.capture import capture
    from kbtrace.topology import compile_topology
    topo = compile_topology(ROOT / "topologies" / "small.yaml")
    runs: list[dict[str, float]] = []
    n_ops = 0
    with tempfile.TemporaryDirectory() as d:
        for _ in range(repeats):
            sw = switch_pairs_per_s(100_000, repeats=1)     # paired with this capture
            tr = capture(ROOT / "capture" / "gemm.py", topo, params=PARAMS, out_dir=d, golden=golden)
            n_ops = tr.n_ops
            st = tr.stats
            runs.append({"switch": sw, "kernel": n_ops / st["run_cpu_s"],
                         "drain": n_ops / st["drain_cpu_s"], "total": n_ops / st["total_cpu_s"]})
    out: dict[str, object] = {"ops": n_ops}
    for k in ("kernel", "drain", "total"):
        out[f"{k}_ops_per_s"] = round(max(r[k] for r in runs))
        out[f"{k}_ops_per_s_median"] = round(_median([r[k] for r in runs]))
        out[f"ratio_{k}_median"] = round(_median([r[k] / r["switch"] for r in runs]), 4)
    out["total_over_kernel_median"] = round(_median([r["kernel"] / r["total"] for r in runs]), 2)
    return out


#: the gemm of ``bench_e2e.py`` at ~100 k ops on default.yaml (i32, 256 PEs): the scale at
#: which ``kbtrace run``'s capture stage is measured; fixed costs (build, numpy references,
#: memory.parquet) dominate the 3,584-op capture above
SCALE_PARAMS = {"M": 1024, "N": 1024, "K": 2048, "BM": 32, "BN": 32, "BK": 64, "dtype": "i32"}


def capture_at_scale(repeats: int = 3) -> dict[str, object]:
    """``repeats`` captures of ``SCALE_PARAMS`` on default.yaml, each paired with a switch-pair
    sample taken just before it: medians of the per-capture ratios and the best (least
    disturbed) CPU µs per op of each phase (``*_wall``: the same in wall-clock µs)."""
    from kbtrace.capture import capture
    from kbtrace.topology import compile_topology
    topo = compile_topology(ROOT / "topologies" / "default.yaml")
    best: dict[str, float] = {}
    ratios: list[float] = []
    over: list[float] = []
    n_ops = 0
    with tempfile.TemporaryDirectory() as d:
        for _ in range(repeats):
            sw = switch_pairs_per_s(100_000, repeats=1)
            tr = capture(ROOT / "capture" / "gemm.py", topo, params=SCALE_PARAMS, out_dir=d)
            n_ops, st = tr.n_ops, tr.stats
            got = {"kernel": st["run_cpu_s"], "drain": st["drain_cpu_s"],
                   "total": st["total_cpu_s"], "kernel_wall": st["run_s"],
                   "total_wall": st["total_s"]}
            best = {k: min(v, best.get(k, v)) for k, v in got.items()}
            ratios.append(n_ops / got["kernel"] / sw)
            over.append(got["total"] / got["kernel"])
    return {"ops": n_ops, "cpu_us_per_op": {k: round(v / n_ops * 1e6, 2) for k, v in best.items()},
            "ratio_kernel_samples": [round(r, 4) for r in ratios],
            "ratio_kernel": round(_median(ratios), 4),
            "total_over_kernel_samples": [round(x, 2) for x in over],
            "total_over_kernel": round(_median(over), 2)}


class _Handle:
    """A handle as small as ``TensorHandle`` (the same slots), for ``recorder_floor``."""

    __slots__ = ("shape", "dtype", "space", "addr", "op_id", "op_name", "op_line", "pending",
                 "_data", "_deps", "_stored", "_lazy", "__weakref__")

    def __init__(self, shape: Any, dtype: str, addr: int, op_id: int, pending: bool) -> None:
        self.shape, self.dtype, self.space, self.addr = shape, dtype, "tcm", addr
        self.op_id, self.op_name, self.op_line, self.pending = op_id, "op", 0, pending
        self._data = self._deps = self._stored = self._lazy = None


class _MinimalRecorder:
    """What any recorder keeping capture's design does per op, and nothing else: a geometry
    lookup, a bump allocation, the op id, the kernel's line, one record tuple appended to a
    log, a handle and the weak reference TCM reclaim needs (no validation, no reclaim, no
    lazy values, no drain)."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.owned: list[Any] = []
        self.next_op = self.cursor = 0
        self.geo: dict[Any, tuple[Any, ...]] = {}

    def _died(self, r: Any) -> None:
        pass

    def load(self, ptr: int, shape: Any, dtype: str = "f16", strides: Any = None) -> _Handle:
        geo = self.geo.get((shape, dtype, strides))
        if geo is None:
            geo = self.geo[(shape, dtype, strides)] = (shape, shape[0] * shape[1] * 4)
        dst = self.cursor
        self.cursor = (dst + geo[1]) & 0xFFFFF
        op = self.next_op
        self.next_op = op + 1
        self.log.append((op, "load", self, sys._getframe(1).f_lineno, ptr, dst, geo, dtype))
        h = _Handle(geo[0], dtype, dst, op, False)
        self.owned.append(weakref.ref(h, self._died))
        return h

    def dot(self, a: Any, b: Any, acc: Any = None, acc_dtype: Any = None,
            out_dtype: Any = None) -> _Handle:
        op = self.next_op
        self.next_op = op + 1
        self.log.append((op, "dot", self, sys._getframe(1).f_lineno, a, b, acc))
        h = _Handle((a.shape[0], b.shape[1]), a.dtype, 0, op, True)
        self.owned.append(weakref.ref(h, self._died))
        return h


def recorder_floor(repeats: int = 3) -> dict[str, object]:
    """CPU µs per op, and in switch pairs, of ``SCALE_PARAMS``'s gemm kernel (the 256
    programs one after another, no greenlets) with a ``tl`` whose calls return at once, and
    with ``_MinimalRecorder`` behind ``tl.load`` / ``tl.dot``; automatic GC off, as in
    capture. The kernel phase's 0.3x target is 1 / 0.3 = 3.33 switch pairs per op."""
    import gc
    import importlib.util
    spec = importlib.util.spec_from_file_location("_gemm_floor", ROOT / "capture" / "gemm.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    p = SCALE_PARAMS
    nt = (p["M"] // p["BM"]) * (p["N"] // p["BN"])
    n_ops = nt * (3 * (p["K"] // p["BK"]) + 2)     # loads, dots, one fill and one store a tile
    h = _Handle((p["BM"], p["BN"]), "i32", 0, 0, True)

    def run(load: Any, dot: Any) -> float:
        cpu = 0.0
        for pid in range(256):
            tl = SimpleNamespace(
                sizeof=lambda d: 4, cdiv=lambda a, b: -(-a // b), load=load, dot=dot,
                num_programs=lambda axis=0: 256 if axis == 0 else 1,
                program_id=lambda axis=0, pid=pid: pid if axis == 0 else 0,
                zeros=lambda shape, dtype="f16": h, store=lambda ptr, v, strides=None: None)
            c0 = time.process_time()
            mod.gemm_kernel(tl, 0, 1 << 30, 2 << 30, p["M"], p["N"], p["K"], p["BM"], p["BK"],
                            p["BN"], p["dtype"])
            cpu += time.process_time() - c0
        return cpu / n_ops * 1e6

    out: dict[str, list[float]] = {"noop_us": [], "noop_pairs": [], "minimal_us": [],
                                   "minimal_pairs": []}
    gc_was = gc.isenabled()
    try:
        for _ in range(repeats):
            sw = switch_pairs_per_s(100_000, repeats=1)
            gc.disable()
            noop = run(lambda ptr, shape, dtype="f16", strides=None: h,
                       lambda a, b, acc=None, acc_dtype=None, out_dtype=None: h)
            rec = _MinimalRecorder()
            minimal = run(rec.load, rec.dot)
            del rec
            if gc_was:
                gc.enable()
            for k, us in (("noop", noop), ("minimal", minimal)):
                out[f"{k}_us"].append(round(us, 3))
                out[f"{k}_pairs"].append(round(us * sw / 1e6, 2))
    finally:
        if gc_was:
            gc.enable()
    return {"ops": n_ops, **out, "target_pairs": round(1 / 0.3, 2)}


def measure(scale: bool = True, scale_repeats: int = 3) -> dict[str, object]:
    SWITCH_SAMPLES.clear()
    gold = capture_ops_per_s(golden=True)
    fast = capture_ops_per_s(golden=False)
    at_scale = capture_at_scale(scale_repeats) if scale else None
    floor = recorder_floor() if scale else None
    ratio_kernel = float(gold["ratio_kernel_median"])       # type: ignore[arg-type]
    total_over_kernel = float(gold["total_over_kernel_median"])  # type: ignore[arg-type]
    if at_scale is not None:        # issue 22 is judged at scale
        ratio_kernel = float(at_scale["ratio_kernel"])       # type: ignore[arg-type]
        total_over_kernel = float(at_scale["total_over_kernel"])  # type: ignore[arg-type]
    return {"greenlet_switch_pairs_per_s_median": round(_median(SWITCH_SAMPLES)),
            "switch_samples": [round(x) for x in SWITCH_SAMPLES],
            "load_average": [round(x, 1) for x in os.getloadavg()],
            "ratio_kernel": gold["ratio_kernel_median"],
            "total_over_kernel": gold["total_over_kernel_median"],
            "meets_issue22": ratio_kernel >= 0.3 and total_over_kernel <= 3.0,
            "gemm_params": PARAMS, "gemm_ops": gold["ops"],
            "golden": gold, "no_golden": fast,
            "target_ratio": TARGET,
            **({"at_scale": at_scale} if at_scale else {}),
            **({"floor": floor} if floor else {})}


@pytest.mark.benchmark
def test_capture_throughput_vs_greenlet_switch_rate() -> None:
    res = measure(scale=False)
    print(json.dumps(res))
    assert res["ratio_kernel"] >= TARGET, res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-scale", action="store_true", help="skip the ~100 k-op captures")
    ap.add_argument("--scale-repeats", type=int, default=3, help="captures at scale (default 3)")
    a = ap.parse_args()
    json.dump(measure(scale=not a.no_scale, scale_repeats=a.scale_repeats), sys.stdout)
    print()
