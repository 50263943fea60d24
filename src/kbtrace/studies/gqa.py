"""Study ``gqa``: Llama-70B grouped-query attention, the reference's 4 panels (ADR-0057 v1,
commitlog §16), numerics verified, op counts, and a latency breakdown per panel.

The predecessor's milestone ran single- and multi-user prefill (a KV ring) and decode (a
partial-softmax combine) at validation scale and only counted ops (gemm, ipcq send/recv, dma
read/write per panel); its one stated figure: both decode panels emit exactly **2 x n_ranks
GEMMs** (one-shot partial attention per rank, ADR-0056 D3). Here ``capture/gqa.py`` is swept
over the 4 panels (hive Parquet under ``sweep/``; ``S`` = 128 positions, 64 with ``--quick``),
every point is verified against numpy in replay order (``kbtrace.verify``), and beyond the
reference each panel gets its time: makespan, kernel body (launch barrier to the last
program's end) and the engine busy time per stage, averaged over the programs.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from kbtrace._paths import REPO_ROOT
from kbtrace.studies import figures as F
from kbtrace.studies.framework import Check, Findings, Ref, StudyContext

PANELS = ("single_user_prefill", "multi_user_prefill", "single_user_decode",
          "multi_user_decode")
KINDS = {"dot": "gemm", "send": "ipcq_send", "recv": "ipcq_recv", "load": "dma_read",
         "store": "dma_write", "math": "math"}
STAGES = ("dma_read", "fetch", "gemm", "math", "store", "dma_write", "ipcq")


def _panel(run_dir: Any, trace_dir: Any, topo: Any, panel: str) -> dict[str, Any]:
    import json

    from kbtrace.analysis import verify
    meta = json.loads((run_dir / "run.json").read_text())
    tmeta = json.loads((trace_dir / "trace.json").read_text())
    counts = tmeta.get("op_counts", {})
    multi = panel.startswith("multi")
    ranks = topo.n_sips * topo.cubes_per_sip if multi else topo.pes_per_cube
    users = topo.pes_per_cube if multi else 1
    hops = pl.read_parquet(run_dir / "hops.parquet", columns=["stage", "busy_ns"]).with_columns(
        pl.col("stage").cast(pl.Utf8)).group_by("stage").agg(pl.col("busy_ns").sum())
    busy = dict(zip(hops["stage"], hops["busy_ns"], strict=True))
    progs = ranks * users
    launch = meta["launches"][0]
    v = verify(run_dir)
    return {"panel": panel, "ranks": ranks, "users": users, "programs": progs,
            **{KINDS[k]: int(counts.get(k, 0)) for k in KINDS},
            "gemm_per_user": int(counts.get("dot", 0)) / users,
            "makespan_ns": float(meta["makespan_ns"]),
            "body_ns": launch["t_body_end_ns"] - launch["t_barrier_ns"],
            **{f"{s}_ns_per_program": float(busy.get(s, 0.0)) / progs for s in STAGES},
            "verified": bool(v.ok)}


def run(ctx: StudyContext) -> Findings:
    from pathlib import Path

    from kbtrace.topology import compile_topology
    topo = compile_topology(ctx.topology)
    S = 64 if ctx.quick else 128
    cfg = {"workloads": [{"path": str(REPO_ROOT / "capture" / "gqa.py"), "name": "gqa",
                          "params": {"S": S}, "grid": {"panel": list(PANELS)}}],
           "topologies": [str(ctx.topology)], "fidelity": ["fast"]}
    points, sweep_dir = ctx.sweep(cfg)
    rows = []
    for r in points.iter_rows(named=True):
        run_dir = sweep_dir / r["run_dir"]
        trace_dir = Path(__import__("json").loads((run_dir / "point.json").read_text())
                         ["trace_dir"])
        rows.append(_panel(run_dir, trace_dir, topo, r["panel"]))
    df = pl.DataFrame(rows).sort(pl.col("panel").replace_strict(
        {p: i for i, p in enumerate(PANELS)}))
    names = df["panel"].to_list()
    F.grouped_bars(ctx.figure("gqa_op_counts"), names,
                   {k: df[k].to_list() for k in ("gemm", "ipcq_send", "ipcq_recv", "dma_read",
                                                 "dma_write")},
                   title=f"GQA op counts per panel (S = {S}, G = 8, D = 64)",
                   xlabel="panel", ylabel="ops in the trace (log)", log=True,
                   ref_points={(p, "gemm"): (2 * int(rk) * int(u),
                                             "reference: 2 x ranks GEMMs per user (decode)"
                                             if i == 0 else "_ref")
                               for i, (p, rk, u) in enumerate(
                                   df.filter(pl.col("panel").str.ends_with("decode"))
                                   .select("panel", "ranks", "users").iter_rows())})
    F.stacked_bars(ctx.figure("gqa_latency_breakdown"), names,
                   {s: df[f"{s}_ns_per_program"].to_list() for s in STAGES}
                   | {"kernel body (wall)": df["body_ns"].to_list()},
                   title="GQA time per panel: engine busy per program by stage, and the body",
                   xlabel="panel", ylabel="time (ns, log)", log=True)
    refs = [Ref("GEMMs per user", p, "ops", 2.0 * rk, g)
            for p, rk, g in df.filter(pl.col("panel").str.ends_with("decode"))
            .select("panel", "ranks", "gemm_per_user").iter_rows()]
    refs += [Ref(f, p, u, None, float(x)) for p, mk, bd, gm in
             df.select("panel", "makespan_ns", "body_ns", "gemm").iter_rows()
             for f, u, x in (("makespan", "ns", mk), ("kernel body", "ns", bd),
                             ("GEMM ops", "ops", gm))]
    checks = [Check("every panel verifies against numpy in replay order",
                    bool(df["verified"].all()),
                    ", ".join(f"{p} {'ok' if v else 'FAIL'}" for p, v in
                              zip(df["panel"], df["verified"], strict=True)))]
    for p, rk, u, g in df.select("panel", "ranks", "users", "gemm").iter_rows():
        want = 2 * rk * u * (rk if p.endswith("prefill") else 1)
        checks.append(Check(f"{p}: GEMMs = 2 x ranks{' x ring steps' if 'prefill' in p else ''}"
                            f" x users", g == want, f"{g} (expected {want})"))
    for who in ("single_user", "multi_user"):
        pre = df.filter(pl.col("panel") == f"{who}_prefill")["body_ns"][0]
        dec = df.filter(pl.col("panel") == f"{who}_decode")["body_ns"][0]
        checks.append(Check(f"{who}: decode body < prefill body", dec < pre,
                            f"{dec:.0f} vs {pre:.0f} ns"))
    return Findings(tables={"panels": df}, figures=["gqa_op_counts", "gqa_latency_breakdown"],
                    refs=refs, checks=checks,
                    notes=[f"S = {S} positions, G = 8 query heads per KV head, D = 64, f32; "
                           "multi-user panels serve one user per PE (the reference: 1)."],
                    sections=[("Op counts", None, "gqa_op_counts"),
                              ("Latency breakdown", None, "gqa_latency_breakdown"),
                              ("Panels", "panels", None)])
