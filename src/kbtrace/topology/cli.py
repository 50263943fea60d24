"""``kbtrace topo show|route|draw``: thin wrappers over the topology library."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from kbtrace._paths import arg
from kbtrace._tables import add_format
from kbtrace.errors import TopologyError
from kbtrace.topology.topology import Topology, compile_topology

__all__ = ["register", "parse_sets"]


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """``["cube.mesh.link_bw_gbps=128", ...]`` -> overrides dict (values parsed by the compiler)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise TopologyError(f"--set {item!r}: expected KEY=VALUE, e.g. --set cube.mesh.link_bw_gbps=128")
        key, val = key.strip(), val.strip()
        if key in out and out[key] != val:
            raise TopologyError(f"--set {key} is given twice ({out[key]} and {val}); keep one "
                                f"(to compare values, use `kbtrace sweep --grid {key}=...`)")
        out[key] = val
    return out


def _load(args: argparse.Namespace) -> Topology:
    return compile_topology(args.path, overrides=parse_sets(args.set))


def register(sub: argparse._SubParsersAction) -> None:
    topo = sub.add_parser("topo", help="inspect a topology: counts, routes, drawings",
                          description="Compile a topology YAML and inspect it.")
    tsub = topo.add_subparsers(dest="topo_command", metavar="SUBCOMMAND", required=True)


    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("path", type=arg("topology"),
                       help="topology YAML or its name in topologies/, e.g. default")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a parameter by its YAML path (repeatable)")

    p = tsub.add_parser("show", help="counts per level, nodes/links by kind, HBM bandwidth")
    common(p)
    p.set_defaults(func=_show)
    p = tsub.add_parser("route", help="hops of the route SRC -> DST and its lower-bound latency")
    common(p)
    p.add_argument("src", help="source node id, e.g. sip0.cube0.pe0.dma")
    p.add_argument("dst", help="destination node id, e.g. sip0.cube1.hbm_ctrl.pe0")
    p.add_argument("--nbytes", type=int, default=4096, help="transfer size for the lower bound (default 4096)")
    add_format(p, what="the hops (text: with the lower-bound latency)")
    p.set_defaults(func=_route)
    p = tsub.add_parser("draw", help="PNG drawings: SIP view and one cube's mesh")
    common(p)
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--sip", type=int, default=0, help="SIP to draw (default 0)")
    p.add_argument("--cube", type=int, default=0, help="cube whose mesh to draw (default 0)")
    p.set_defaults(func=_draw)


def _show(args: argparse.Namespace) -> int:
    t = _load(args)
    p = t.params
    h = p.cube.hbm
    print(f"topology {p.name!r} ({args.path}) content_hash={t.content_hash}"
          f"{' (cached)' if t.from_cache else ''}")
    print(f"  SIPs          {t.n_sips}  ({p.system.sips.topology})")
    print(f"  cubes         {t.n_sips * t.cubes_per_sip}  ({t.cubes_per_sip} per SIP, "
          f"{p.sip.cube_mesh_w}x{p.sip.cube_mesh_h} mesh)")
    print(f"  PEs           {len(t.pes)}  ({t.pes_per_cube} per cube)")
    print(f"  IO chiplets   {t.n_sips * t.n_io_chiplets}  ({t.n_io_chiplets} per SIP)")
    eff = t.hbm_bw_per_cube_gbps * h.efficiency
    print(f"  HBM per cube  {t.hbm_bw_per_cube_gbps:g} GB/s  ({t.pes_per_cube} slices x {h.pcs_per_pe} PCs "
          f"x {h.pc_bw_gbps:g} GB/s; effective {eff:g} GB/s at efficiency {h.efficiency:g}); "
          f"{h.capacity_gb} GB, {t.hbm_slice_bytes >> 20} MiB per slice")
    n_cubes = t.n_sips * t.cubes_per_sip
    print(f"  HBM total     {t.hbm_bw_per_cube_gbps * n_cubes:g} GB/s over {n_cubes} cubes")
    print(f"  nodes         {len(t.nodes)}")
    for kind, n in sorted(Counter(x.kind for x in t.nodes).items()):
        print(f"    {kind:<12} {n}")
    print(f"  links         {len(t.links)} (directed)")
    for kind, n in sorted(Counter(x.kind for x in t.links).items()):
        print(f"    {kind:<15} {n}")
    return 0


def _route(args: argparse.Namespace) -> int:
    t = _load(args)
    if args.nbytes < 0:
        raise TopologyError(f"--nbytes {args.nbytes}: must be >= 0")
    r = t.route(args.src, args.dst)
    if args.format != "text":
        return _route_table(t, r, args.format)
    print(f"{'hop':>3}  {'node':<34} {'link kind':<15} {'bw GB/s':>8} {'dist mm':>8} {'wire ns':>8} "
          f"{'ovhd ns':>8}")
    for i, n in enumerate(r.nodes):
        node = t.nodes[n]
        if i == 0:
            print(f"{i:>3}  {node.id:<34} {'(source)':<15} {'':>8} {'':>8} {'':>8} {'':>8}")
            continue
        ln = t.links[r.links[i - 1]]
        bw = f"{ln.bw_gbps:g}" if ln.bw_gbps > 0 else "cmd"
        print(f"{i:>3}  {node.id:<34} {ln.kind:<15} {bw:>8} {ln.distance_mm:>8g} {ln.latency_ns:>8.3g} "
              f"{node.overhead_ns:>8g}")
    drain = args.nbytes / r.bottleneck_gbps if r.bottleneck_gbps > 0 and args.nbytes > 0 else 0.0
    commit = r.lower_bound_ns(args.nbytes) - r.overhead_ns - r.wire_ns - drain
    print(f"hops={len(r.links)}  overhead={r.overhead_ns:g} ns  wire={r.wire_ns:.4g} ns  "
          f"bottleneck={r.bottleneck_gbps:g} GB/s  drain({args.nbytes} B)={drain:.4g} ns  "
          f"hbm_commit={commit:g} ns")
    print(f"lower_bound_ns({args.nbytes}) = {r.lower_bound_ns(args.nbytes):.4f}")
    print(f"floor_ns({args.nbytes}) = {r.floor_ns(args.nbytes):.4f}  (wormhole: overheads after "
          f"the slowest link overlap its drain)")
    return 0


def _route_table(t: Topology, r: Any, fmt: str) -> int:
    """The hops of route ``r`` as a table (one row per node; the source has no link)."""
    import polars as pl

    from kbtrace._tables import render
    rows = []
    for i, n in enumerate(r.nodes):
        node = t.nodes[n]
        ln = t.links[r.links[i - 1]] if i else None
        rows.append({"hop": i, "node": node.id, "link_kind": ln.kind if ln else None,
                     "bw_gbps": ln.bw_gbps if ln else None,
                     "distance_mm": ln.distance_mm if ln else None,
                     "latency_ns": ln.latency_ns if ln else None,
                     "overhead_ns": node.overhead_ns})
    sys.stdout.write(render(pl.DataFrame(rows, schema={
        "hop": pl.Int64, "node": pl.String, "link_kind": pl.String, "bw_gbps": pl.Float64,
        "distance_mm": pl.Float64, "latency_ns": pl.Float64, "overhead_ns": pl.Float64}), fmt))
    return 0


def _draw(args: argparse.Namespace) -> int:
    from kbtrace.topology.draw import draw_cube, draw_sip

    t = _load(args)
    for path in (draw_sip(t, args.out, sip=args.sip), draw_cube(t, args.out, sip=args.sip, cube=args.cube)):
        print(path)
    return 0
