"""Study ``pe_dma``: PE DMA writes into HBM slices, alone and contended (commitlog §6).

The predecessor's ``plot_pe_dma_perf`` harness: 6 uncongested scenarios (77 ns for a PE's
own slice up to 573 ns for the worst remote cube and PE; 409 ns across SIPs), 5 congested
ones (1/2/3 PEs into one slice: 82 / 158 / 230 ns; 8 PEs of a cube into the corresponding
PEs of the next cube east: 963 ns; 8 PEs into PE 0's slice: 558 ns) and 2 SIP-wide ones at
16 KB (every PE of SIP 0 into its own slice: 27.2 TB/s at 83 % of the fair-share aggregate;
all into sip0.cube0.pe0's slice: 134 GB/s at 93 %). The per-scenario transfer size is not
in the digest except for the SIP-wide pair (16 KB); the single-PE figures fit 16 KiB too
(77 ns ~ 64 ns drain at 256 GB/s + overheads), so every scenario here moves 16 KiB.

Each scenario is one trace of ``store`` ops (one per issuing PE, all in one launch) built
with ``probe.run_transfer`` and replayed by the real engine. Per scenario: ``latency_ns`` =
last completion - first DMA start; ``eff_bw_gbps`` = issuers x bytes / latency;
``util_single`` = that over the first issuer's bottleneck link; ``util_aggregate`` over the
max-min fair-share peak (per link bandwidth / number of paths using it, the minimum along
each path, summed over paths); and the breakdown of the slowest transfer's latency by the
component its hops belong to (``crit_ns`` of the replay's hops: pe_setup, noc_mesh, ucie,
fabric, hbm_ctrl, queueing).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from kbtrace.studies import figures as F
from kbtrace.studies.framework import Check, Findings, Ref, StudyContext, scalar
from kbtrace.studies.probe import run_transfer
from kbtrace.topology.model import PeCoord

NBYTES = 16384
#: name -> (reference latency ns or None, kind); kinds: single / congested / sip
REFERENCE_NS = {"same_cube_pe_local": 77.0, "remote_cube_pe_remote_worst": 573.0,
                "remote_sip": 409.0, "ctrl_hot_1": 82.0, "ctrl_hot_2": 158.0,
                "ctrl_hot_3": 230.0, "ucie_eastbound": 963.0, "all_pe_cube0_to_pe0": 558.0}
REFERENCE_BW = {"sip_local_all": (27200.0, 0.83), "sip_hotspot_pe0": (134.0, 0.93)}
REFERENCE_UTIL = {"ucie_eastbound": (1.064, 0.85), "all_pe_cube0_to_pe0": (None, 0.917),
                  "sip_local_all": (106.39, None)}
#: pe_dma: PE_CPU dispatch, scheduler and the DMA engine hop, which holds the transfer's
#: streaming (drain) time too; the others are the fabric hops' own latency
COMPONENTS = ("pe_dma", "noc_mesh", "ucie", "fabric", "hbm_ctrl", "queueing")


def _scenarios(topo: Any, quick: bool) -> list[tuple[str, str, list[tuple[PeCoord, PeCoord]]]]:
    pe0 = PeCoord(0, 0, 0)
    dma = topo.pe_node(pe0, "dma")

    def lb(d: PeCoord) -> float:
        return topo.route(dma, topo.hbm_ctrl(d)).lower_bound_ns(NBYTES)
    in_cube = [PeCoord(0, 0, p) for p in range(1, topo.pes_per_cube)]
    remote = [PeCoord(0, c, p) for c in range(1, topo.cubes_per_sip)
              for p in range(topo.pes_per_cube)]
    east = 1 if topo.params.sip.cube_mesh_w > 1 else None
    out = [("same_cube_pe_local", "single", [(pe0, pe0)]),
           ("same_cube_pe_remote_best", "single", [(pe0, min(in_cube, key=lb))]),
           ("same_cube_pe_remote_worst", "single", [(pe0, max(in_cube, key=lb))]),
           ("remote_cube_pe_local_best", "single", [(pe0, PeCoord(0, 1, 0))]),
           ("remote_cube_pe_remote_worst", "single", [(pe0, max(remote, key=lb))])]
    if topo.n_sips > 1:
        out.append(("remote_sip", "single", [(pe0, PeCoord(1, 0, 0))]))
    for n in (1, 2, 3):
        out.append((f"ctrl_hot_{n}", "congested", [(PeCoord(0, 0, p), pe0) for p in range(n)]))
    if east is not None:
        out.append(("ucie_eastbound", "congested",
                    [(PeCoord(0, 0, p), PeCoord(0, east, p)) for p in range(topo.pes_per_cube)]))
    out.append(("all_pe_cube0_to_pe0", "congested",
                [(PeCoord(0, 0, p), pe0) for p in range(topo.pes_per_cube)]))
    sip0 = [c for c in topo.pes if c.sip == 0]
    out.append(("sip_local_all", "sip", [(c, c) for c in sip0]))
    out.append(("sip_hotspot_pe0", "sip", [(c, pe0) for c in sip0]))
    return out


def _rows(topo: Any, pairs: list[tuple[PeCoord, PeCoord]]) -> list[dict[str, Any]]:
    from kbtrace.topology import address
    rows = []
    for i, (s, d) in enumerate(pairs):
        rows.append({"op_id": i, "launch": 0, "program": i, "kind": "store", "name": "store",
                     "sip": s.sip, "cube": s.cube, "pe": s.pe, "pid0": s.pe,
                     "pid1": s.sip * topo.cubes_per_sip + s.cube,
                     "src_space": "tcm", "src_addr": address.pe_tcm_addr(s.sip, s.cube, s.pe, 0),
                     "dst_space": "hbm", "dst_addr": topo.hbm_base(d) + i * NBYTES,
                     "nbytes": NBYTES, "out_shape": [NBYTES // 4], "out_dtype": "f32"})
    return rows


def _component(node: str, kind: str) -> str:
    if kind in ("pe_cpu", "scheduler", "dma_write") or node.endswith((".dma", ".pe_cpu",
                                                                     ".scheduler")):
        return "pe_dma"
    if ".hbm_ctrl." in node or kind == "hbm":
        return "hbm_ctrl"
    if "ucie" in node:
        return "ucie" if ".cube" in node else "fabric"
    if ".cube" in node and ".r" in node:
        return "noc_mesh"
    return "fabric"


def _peaks(topo: Any, pairs: list[tuple[PeCoord, PeCoord]]) -> tuple[float, float]:
    routes = [topo.route(topo.pe_node(s, "dma"), topo.hbm_ctrl(d)) for s, d in pairs]
    usage: dict[int, int] = {}
    for r in routes:
        for li in r.links:
            usage[li] = usage.get(li, 0) + 1
    agg = sum(min(topo.links[li].bw_gbps / usage[li] for li in r.links
                  if topo.links[li].bw_gbps > 0) for r in routes)
    return routes[0].bottleneck_gbps, agg


def _measure(topo: Any, name: str, kind: str, pairs: list[tuple[PeCoord, PeCoord]],
             work: Any) -> dict[str, Any]:
    ot, hops, _ = run_transfer(topo, _rows(topo, pairs), name, "fast", work)
    t0, t1 = scalar(ot["t_start_ns"].min()), scalar(ot["t_end_ns"].max())
    lat = t1 - t0
    slowest = ot.sort("t_end_ns", descending=True)["op_id"][0]
    h = hops.filter(pl.col("op_id") == slowest)
    parts = dict.fromkeys(COMPONENTS, 0.0)
    for node, stage, crit, q in h.select("node", pl.col("stage").cast(pl.Utf8), "crit_ns",
                                         "queue_ns").iter_rows():
        parts["queueing"] += q
        parts[_component(node or "", stage)] += crit - q
    single, agg = _peaks(topo, pairs)
    eff = len(pairs) * NBYTES / lat
    return {"scenario": name, "kind": kind, "issuers": len(pairs), "nbytes": NBYTES,
            "latency_ns": lat, "eff_bw_gbps": eff, "peak_single_gbps": single,
            "peak_aggregate_gbps": agg, "util_single": eff / single, "util_aggregate": eff / agg,
            **{f"{c}_ns": parts[c] for c in COMPONENTS}}


def run(ctx: StudyContext) -> Findings:
    import tempfile
    from pathlib import Path

    from kbtrace.topology import compile_topology
    topo = compile_topology(ctx.topology)
    with tempfile.TemporaryDirectory(prefix="kbtrace-pe-dma-") as work:
        rows = [_measure(topo, n, k, pairs, Path(work)) for n, k, pairs in
                _scenarios(topo, ctx.quick)]
    df = pl.DataFrame(rows)
    by = {r["scenario"]: r for r in rows}
    refs = []
    for n, ref in REFERENCE_NS.items():
        if n in by:
            refs.append(Ref("latency", n, "ns", ref, by[n]["latency_ns"]))
    for n, (bw, util) in REFERENCE_BW.items():
        if n in by:
            refs.append(Ref("effective bandwidth", n, "GB/s", bw, by[n]["eff_bw_gbps"]))
            refs.append(Ref("util_aggregate", n, "-", util, by[n]["util_aggregate"]))
    for n, (single, agg) in REFERENCE_UTIL.items():
        if n in by:
            if single is not None:
                refs.append(Ref("util_single", n, "-", single, by[n]["util_single"]))
            if agg is not None:
                refs.append(Ref("util_aggregate", n, "-", agg, by[n]["util_aggregate"]))
    for r in rows:
        if r["scenario"] not in REFERENCE_NS and r["scenario"] not in REFERENCE_BW:
            refs.append(Ref("latency", r["scenario"], "ns", None, r["latency_ns"]))
    refs = [Ref(x.figure, x.quantity, x.unit, x.reference, x.measured,
                note=_NOTES.get(x.quantity, "") if x.ratio is not None
                and abs(x.ratio - 1) > 0.10 else "") for x in refs]
    singles = [r for r in rows if r["kind"] == "single" and r["scenario"] != "remote_sip"]
    hot = [by[f"ctrl_hot_{n}"]["latency_ns"] for n in (1, 2, 3)] + \
        [by["all_pe_cube0_to_pe0"]["latency_ns"]]
    checks = [
        Check("uncongested latency grows with distance (same cube, then remote cubes)",
              all(a["latency_ns"] <= b["latency_ns"] for a, b in zip(singles, singles[1:],
                                                                    strict=False)),
              ", ".join(f"{r['scenario']} {r['latency_ns']:.1f}" for r in singles) + " ns"),
        Check("hot-slice latency grows with the issuer count (1, 2, 3, 8)",
              all(a < b for a, b in zip(hot, hot[1:], strict=False)),
              ", ".join(f"{v:.1f}" for v in hot) + " ns"),
        Check("util_aggregate <= 100 % everywhere", bool((df["util_aggregate"] <= 1.0 + 1e-9)
                                                          .all()),
              f"max {scalar(df['util_aggregate'].max()):.3f}"),
        Check("single issuers: util_single == util_aggregate",
              all(abs(r["util_single"] - r["util_aggregate"]) < 1e-9 for r in rows
                  if r["issuers"] == 1), "one path: both peaks are its bottleneck"),
        Check("8 PEs into one slice reach >= 70 % of the shared peak",
              by["all_pe_cube0_to_pe0"]["util_aggregate"] >= 0.70,
              f"{by['all_pe_cube0_to_pe0']['util_aggregate']:.3f}"),
    ]
    names = df["scenario"].to_list()
    refpts = {(n, "kbtrace"): (v, "reference (commitlog §6)") for n, v in REFERENCE_NS.items()
              if n in by}
    F.grouped_bars(ctx.figure("pe_dma_latency"), names, {"kbtrace": df["latency_ns"].to_list()},
                   title=f"PE DMA write latency, {NBYTES // 1024} KiB per issuer",
                   xlabel="scenario", ylabel="latency: first DMA start to last completion (ns)",
                   log=True, ref_points=_one_label(refpts), annotate=True)
    F.stacked_bars(ctx.figure("pe_dma_breakdown"), names,
                   {c: df[f"{c}_ns"].to_list() for c in COMPONENTS},
                   title="Latency of the slowest transfer by component (replay crit_ns)",
                   xlabel="scenario", ylabel="latency share (ns, log)", log=True)
    F.grouped_bars(ctx.figure("pe_dma_utilisation"), names,
                   {"util_single (vs one path's bottleneck)":
                    (df["util_single"] * 100).clip(upper_bound=150).to_list(),
                    "util_aggregate (vs fair-share peak)": (df["util_aggregate"] * 100).to_list()},
                   title="Effective bandwidth utilisation (util_single capped at 150 %: "
                         + ", ".join(f"{r['scenario']} {r['util_single']:.0%}" for r in rows
                                     if r["util_single"] > 1.5) + ")",
                   xlabel="scenario", ylabel="utilisation (%)",
                   ref_points=_one_label({
                       (n, "util_aggregate (vs fair-share peak)"):
                       (100 * v, "reference util_aggregate (commitlog §6)")
                       for n, v in [("ucie_eastbound", 0.85), ("all_pe_cube0_to_pe0", 0.917),
                                    ("sip_local_all", 0.83), ("sip_hotspot_pe0", 0.93)]
                       if n in by}))
    return Findings(tables={"scenarios": df}, figures=["pe_dma_latency", "pe_dma_breakdown",
                                                       "pe_dma_utilisation"],
                    refs=refs, checks=checks,
                    sections=[("Latency", None, "pe_dma_latency"),
                              ("Breakdown", None, "pe_dma_breakdown"),
                              ("Utilisation", None, "pe_dma_utilisation"),
                              ("Scenarios", "scenarios", None)])


def _one_label(pts: dict[tuple[str, str], tuple[float, str]]) -> dict[tuple[str, str],
                                                                      tuple[float, str]]:
    """Reference markers with one legend entry (matplotlib skips labels starting '_')."""
    out = {}
    for i, (k, (v, label)) in enumerate(pts.items()):
        out[k] = (v, label if i == 0 else "_" + label)
    return out


_NOTES: dict[str, str] = {
    "sip_hotspot_pe0": "the shared bottleneck here is the 256 GB/s r0c0 -> hbm_ctrl.pe0 link "
                       "(92 % of it used): the 120 remote writers reach cube 0 over both its E "
                       "and S UCIe ports, 4 lanes each (lane = source PE mod 4), where the "
                       "predecessor's routing funnelled them into one saturated UCIe path; the "
                       "fair-share utilisation agrees (0.92 vs 0.93)",
    "ucie_eastbound": "kbtrace spreads the 8 writers over the 4 UCIe lanes (lane = source PE "
                      "mod 4) where the predecessor funnelled 7 through one lane (its aggregate "
                      "peak ~160 GB/s, 512 GB/s here): kbtrace finishes sooner but at a lower "
                      "share of its larger peak; the slowest transfer queues 269 ns in the mesh "
                      "on its way to the E edge",
}
