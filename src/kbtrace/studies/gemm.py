"""Study ``gemm``: shapes x operand staging on one PE (ADR-0044, ADR-0054; commitlog §6, §17).

The predecessor swept 8 shapes x 3 operand-staging variants of its composite GEMM and drew
the per-stage engine time (DMA in / fetch / GEMM / DMA out), the MAC utilisation and an
ideal-pipeline model next to it; shapes below one tile (32 x 64 x 32) were flagged. Its
digest names one shape and one variant (32 x 3072 x 32, ``load_ref``) and one figure: the
composite window of that point, 1765 ns before and **992 ns** after its DMA-channel fix.

Here ``capture/gemm_staging.py`` (one composite on one PE) is swept over ``SHAPES`` x
``ref_ref`` / ``load_ref`` / ``load_load`` with ``replay.sweep`` (hive Parquet under
``sweep/``). Per point, from the run's ``op_timing`` and ``hops``: the composite's window
(its start to its end: the pinned operand loads before it are excluded, as the
predecessor's tile-pipeline window excludes them), the engine busy time per stage,
``gemm_util`` = GEMM busy / window and ``useful_eff`` = M·N·K / (MACs per ns x window).

Ideal pipeline, two versions: the reference's inherited constants (ADR-0044 D5: HBM 256
GB/s, T_stage 16 ns, 3 stages, 2 B per element; tiles x T_stage over fill + tiles x
max(T_stage, streamed bytes per tile / 256 GB/s)), and the same formula with kbtrace's own
stage times (a tile's GEMM ``ceil(tm/32)·ceil(tn/32)·tk + 16`` cycles, DMA bytes / the PE's
HBM bandwidth). ``--quick`` keeps 4 shapes (the reference's among them).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

from kbtrace._paths import REPO_ROOT
from kbtrace.studies import figures as F
from kbtrace.studies.framework import Check, Findings, Ref, StudyContext, scalar

VARIANTS = ("ref_ref", "load_ref", "load_load")
#: (M, K, N): the reference's 32x3072x32 (long K), two under-tile shapes, square ones
SHAPES = ((16, 64, 16), (32, 32, 32), (32, 3072, 32), (64, 64, 64), (128, 128, 128),
          (64, 512, 64), (128, 256, 128), (256, 256, 256))
QUICK_SHAPES = ((32, 32, 32), (32, 3072, 32), (64, 64, 64), (128, 128, 128))
REF_SHAPE, REF_VARIANT, REF_WINDOW_NS = (32, 3072, 32), "load_ref", 992.0
# ADR-0044 D5 constants (inherited, unverified in the reference itself)
HBM_GBS, T_STAGE, D_STAGES, BPE = 256.0, 16.0, 3, 2
STAGES = ("dma_read", "fetch", "gemm", "store", "dma_write")
STAGE_LABEL = {"dma_read": "DMA in", "fetch": "fetch", "gemm": "GEMM", "store": "store (RF->TCM)",
               "dma_write": "DMA out"}


def _label(s: tuple[int, int, int]) -> str:
    return f"{s[0]}x{s[1]}x{s[2]}"


def _config(ctx: StudyContext, shapes: tuple[tuple[int, int, int], ...]) -> dict[str, Any]:
    return {"workloads": [{"path": str(REPO_ROOT / "capture" / "gemm_staging.py"),
                           "name": f"gemm{_label(s)}",
                           "params": {"M": s[0], "K": s[1], "N": s[2], "dtype": "f16"},
                           "grid": {"variant": list(VARIANTS)}} for s in shapes],
            "topologies": [str(ctx.topology)], "fidelity": ["fast"]}


def _point(run_dir: Path) -> dict[str, float]:
    ot = pl.read_parquet(run_dir / "op_timing.parquet")
    comp = ot.filter(pl.col("kind") == "composite").row(0, named=True)
    hops = pl.read_parquet(run_dir / "hops.parquet", columns=["op_id", "stage", "busy_ns"])
    busy = (hops.filter(pl.col("op_id") == comp["op_id"])
            .with_columns(pl.col("stage").cast(pl.Utf8))
            .group_by("stage").agg(pl.col("busy_ns").sum()))
    b = dict(zip(busy["stage"], busy["busy_ns"], strict=True))
    out = {f"{s}_ns": float(b.get(s, 0.0)) for s in STAGES}
    out["window_ns"] = comp["t_end_ns"] - comp["t_start_ns"]
    out["makespan_ns"] = scalar(ot["t_end_ns"].max())
    return out


def _tiles(m: int, k: int, n: int, tm: int, tk: int, tn: int) -> list[tuple[int, int, int]]:
    return [(min(tm, m - i), min(tk, k - kk), min(tn, n - j))
            for i in range(0, m, tm) for j in range(0, n, tn) for kk in range(0, k, tk)]


def _ideal(m: int, k: int, n: int, variant: str, topo: Any) -> tuple[float, float, float]:
    """(reference-constant ideal GEMM util, kbtrace-parameter ideal util, kbtrace ideal ns)."""
    p = topo.params
    t = p.pe.tile
    tiles = _tiles(m, k, n, t.m, t.k, t.n)
    stream_a, stream_b = variant.startswith("ref"), variant.endswith("ref")

    def streamed(tm: int, tk: int, tn: int, bpe: int) -> int:
        return (tm * tk * bpe if stream_a else 0) + (tk * tn * bpe if stream_b else 0)
    ref_ns = D_STAGES * T_STAGE + sum(max(T_STAGE, streamed(*x, BPE) / HBM_GBS) for x in tiles)
    ref_util = len(tiles) * T_STAGE / ref_ns
    g = p.pe.gemm
    hbm = p.cube.hbm.pcs_per_pe * p.cube.hbm.pc_bw_gbps
    gemm_ns = [(math.ceil(tm / g.mac_rows) * math.ceil(tn / g.mac_cols) * tk + g.pipeline_cycles)
               / g.clock_ghz for tm, tk, tn in tiles]
    dma_ns = [streamed(tm, tk, tn, 2) / hbm for tm, tk, tn in tiles]
    kb_ns = dma_ns[0] + sum(max(a, b) for a, b in zip(gemm_ns, dma_ns, strict=True))
    return ref_util, sum(gemm_ns) / kb_ns, kb_ns


def run(ctx: StudyContext) -> Findings:
    from kbtrace.topology import compile_topology
    topo = compile_topology(ctx.topology)
    shapes = QUICK_SHAPES if ctx.quick else SHAPES
    points, sweep_dir = ctx.sweep(_config(ctx, shapes))
    t = topo.params.pe.tile
    g = topo.params.pe.gemm
    macs_per_ns = g.mac_rows * g.mac_cols * g.clock_ghz
    rows = []
    for r in points.iter_rows(named=True):
        shape = next(s for s in shapes if r["trace"].startswith(f"gemm{_label(s)}-"))
        m, k, n = shape
        v = r["variant"]
        x = _point(sweep_dir / r["run_dir"])
        ideal_ref, ideal_kb, ideal_kb_ns = _ideal(m, k, n, v, topo)
        rows.append({"shape": _label(shape), "variant": v, "M": m, "K": k, "N": n,
                     "under_tile": m < t.m or k < t.k or n < t.n, **x,
                     "gemm_util": x["gemm_ns"] / x["window_ns"],
                     "useful_eff": m * n * k / (macs_per_ns * x["window_ns"]),
                     "ideal_util_ref_constants": ideal_ref, "ideal_util_kbtrace": ideal_kb,
                     "ideal_window_kbtrace_ns": ideal_kb_ns})
    df = pl.DataFrame(rows)
    order = [_label(s) for s in shapes]
    lr = df.filter(pl.col("variant") == REF_VARIANT)
    names = [f"{s}{'*' if u else ''}" for s, u in zip(lr["shape"], lr["under_tile"],
                                                      strict=True)]
    F.stacked_bars(ctx.figure("gemm_stage_breakdown"), names,
                   {STAGE_LABEL[s]: lr[f"{s}_ns"].to_list() for s in STAGES},
                   title="GEMM per-stage engine busy time (load_ref; * = under one tile)",
                   xlabel="shape M x K x N", ylabel="engine busy time (ns, log)", log=True)
    F.bars_with_lines(ctx.figure("gemm_mac_utilization"), names,
                      {"GEMM util (measured)": (lr["gemm_util"] * 100).to_list(),
                       "useful MAC eff (measured)": (lr["useful_eff"] * 100).to_list()},
                      {"ideal pipeline, kbtrace parameters":
                       (lr["ideal_util_kbtrace"] * 100).to_list(),
                       "ideal pipeline, reference constants (ADR-0044 D5)":
                       (lr["ideal_util_ref_constants"] * 100).to_list()},
                      title="GEMM MAC utilisation per shape (load_ref; * = under one tile)",
                      xlabel="shape M x K x N", ylabel="utilisation (%)")
    F.grouped_bars(ctx.figure("gemm_variants"), order,
                   {v: [df.filter((pl.col("shape") == s) & (pl.col("variant") == v))
                        ["window_ns"][0] for s in order] for v in VARIANTS},
                   title="Composite window by operand staging", xlabel="shape M x K x N",
                   ylabel="composite window (ns, log)", log=True,
                   ref_points={(_label(REF_SHAPE), REF_VARIANT):
                               (REF_WINDOW_NS, "reference 992 ns (load_ref)")},
                   variants=list(VARIANTS))
    ref_pt = df.filter((pl.col("shape") == _label(REF_SHAPE))
                       & (pl.col("variant") == REF_VARIANT)).row(0, named=True)
    gap = (f"GEMM-bound here ({ref_pt['gemm_ns'] / ref_pt['window_ns']:.0%} of the window; "
           f"{ref_pt['gemm_ns'] / 48:.0f} ns per 32x64x32 tile vs the reference's T_stage 16 "
           "ns), DMA-bound there (192 KiB at 256 GB/s = 768 ns); see docs/studies.md")
    refs = [Ref("composite window", f"{_label(REF_SHAPE)} {REF_VARIANT}", "ns", REF_WINDOW_NS,
                ref_pt["window_ns"], note=gap)]
    for row in df.sort("shape", "variant").iter_rows(named=True):
        refs.append(Ref("composite window", f"{row['shape']} {row['variant']}", "ns", None,
                        row["window_ns"]))
    checks = []
    for s in order:
        w = {v: df.filter((pl.col("shape") == s) & (pl.col("variant") == v))["window_ns"][0]
             for v in VARIANTS}
        checks.append(Check(f"{s}: load_load <= load_ref <= ref_ref window",
                            w["load_load"] <= w["load_ref"] <= w["ref_ref"],
                            ", ".join(f"{v} {w[v]:.1f}" for v in VARIANTS) + " ns"))
    low = df.filter(pl.col("window_ns") < pl.col("ideal_window_kbtrace_ns") * 0.999)
    checks.append(Check("no window below kbtrace's ideal pipeline", low.height == 0,
                        f"{low.height} of {df.height} points below (ideal = first tile's DMA + "
                        "sum over tiles of max(GEMM, DMA))"))
    under = df.filter(pl.col("under_tile"))
    if under.height:
        full = df.filter(~pl.col("under_tile"))
        checks.append(Check("under-tile shapes waste MACs: their useful eff < every full shape's",
                            scalar(under["useful_eff"].max()) < scalar(full["useful_eff"].min()),
                            f"under-tile max {scalar(under['useful_eff'].max()):.3f}, full-tile "
                            f"min {scalar(full['useful_eff'].min()):.3f}"))
    return Findings(
        tables={"points": df}, figures=["gemm_stage_breakdown", "gemm_mac_utilization",
                                        "gemm_variants"],
        refs=refs, checks=checks,
        notes=["Window = the composite op's start to end (pinned loads before it excluded).",
               gap],
        sections=[("Per-stage breakdown", None, "gemm_stage_breakdown"),
                  ("MAC utilisation and the ideal pipeline", None, "gemm_mac_utilization"),
                  ("Operand staging", None, "gemm_variants"), ("Points", "points", None)])
