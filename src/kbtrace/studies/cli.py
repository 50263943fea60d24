"""``kbtrace list``, ``kbtrace probe`` and ``kbtrace study``: thin wrappers over the library."""

from __future__ import annotations

import argparse
import json
import sys

from kbtrace._paths import add_topology
from kbtrace._tables import add_format, add_json_alias, deprecated_json

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    from kbtrace.studies.registry import LIST_KINDS as KINDS
    from kbtrace.studies.registry import STUDIES
    ls = sub.add_parser("list", help="workloads, topologies, sweep configs, studies, traces "
                                     "and runs",
                        description="List what the project holds: workloads (first docstring "
                                    "line and PARAMS), topologies, sweep configs, studies, and "
                                    "the traces and runs under data/.")
    ls.add_argument("kind", nargs="*", metavar="KIND",
                    help=f"only these kinds ({', '.join(KINDS)}); default all")
    add_format(ls, what="each kind's table (json: one object, kind -> rows)")
    add_json_alias(ls)
    ls.set_defaults(func=_list)

    p = sub.add_parser("probe", help="single transfers replayed alone against their lower "
                                     "bound; invariants (exit 1 on failure)",
                       description="Replay the probe cases (H2D / D2H over 1-4 cube hops, PE "
                                   "DMA local / same half / cross half / cross cube best and "
                                   "worst / cross SIP) one at a time; print actual time against "
                                   "the lower-bound parts, efficiency and the bottleneck link, "
                                   "and the invariants as [v] PASS / [x] FAIL lines. Exit 1 "
                                   "when an invariant fails.")
    add_topology(p, overrides=True)
    p.add_argument("--case", default="all", metavar="NAME",
                   help="one case by name (default all), e.g. h2d-2hop")
    p.add_argument("--nbytes", type=int, default=32768, metavar="N",
                   help="bytes per transfer (default 32768)")
    p.add_argument("--sweep", action="store_true",
                   help="also every case at 4 KiB, 16 KiB, 64 KiB, 256 KiB and 1 MiB")
    p.add_argument("--fidelity", choices=("fast", "flit"), default="fast",
                   help="replay fidelity (default fast)")
    p.add_argument("--hops", action="store_true",
                   help="print each case's replayed hops (node, stage, enter/leave ns)")
    add_format(p, what="the result (json: one object with every table)")
    add_json_alias(p)
    p.set_defaults(func=_probe)

    s = sub.add_parser("study", help="an evaluation study: sweep, tables, figures, one HTML "
                                     "page, reference vs measured",
                       description="Run a study (one of: " + ", ".join(STUDIES) + "): its "
                                   "sweep (hive Parquet), tables (CSV/MD), figures (PNG) and "
                                   "index.html in -o DIR, and print every figure the "
                                   "reference gives next to kbtrace's value and their ratio. "
                                   "Exit 1 when a check fails or a figure leaves its tolerance "
                                   "of the committed calibration record.")
    s.add_argument("study", metavar="NAME", help="one of " + ", ".join(STUDIES))
    add_topology(s)
    s.add_argument("--quick", action="store_true",
                   help="fewer points (every reference figure is still measured)")
    s.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="worker processes for the sweep (default 1)")
    s.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="output directory (default data/studies/<study>[-quick])")
    s.add_argument("--record", action="store_true",
                   help="write this run's figures as the committed calibration record "
                        "(data/calibration/<study>[-quick].json)")
    s.set_defaults(func=_study)



def _study(args: argparse.Namespace) -> int:
    from kbtrace.studies.framework import print_result, record_calibration, run_study
    res = run_study(args.study, args.topology, quick=args.quick, jobs=args.jobs, out=args.out)
    rc = print_result(res)
    if args.record:
        print(f"calibration record written to {record_calibration(res)}")
    return rc


def _list(args: argparse.Namespace) -> int:
    from kbtrace.analysis.formats import render
    from kbtrace.errors import UsageError
    from kbtrace.studies.catalog import KINDS, WHERE, catalog
    kinds = tuple(dict.fromkeys(args.kind)) or KINDS
    for k in kinds:
        if k not in KINDS:
            raise UsageError(f"kbtrace list {k!r}: no such kind; use any of {', '.join(KINDS)}")
    deprecated_json(args)
    frames = catalog(kinds)
    if args.format == "json":
        print(json.dumps({k: df.to_dicts() for k, df in frames.items()}, indent=1,
                         default=str))
        return 0
    for kind, df in frames.items():
        print(f"{kind} ({df.height})")
        if df.height:
            print(render(df.drop("path") if "path" in df.columns and kind != "runs" else df,
                         args.format))
        else:
            print(f"  none in {WHERE[kind]}\n")
    return 0


def _probe(args: argparse.Namespace) -> int:
    import polars as pl

    from kbtrace.analysis.formats import render
    from kbtrace.studies.probe import run_probe
    from kbtrace.topology import compile_topology
    from kbtrace.topology.cli import parse_sets
    topo = compile_topology(args.topology, overrides=parse_sets(args.set))
    res = run_probe(topo, args.case, args.nbytes, sweep=args.sweep, fidelity=args.fidelity)
    deprecated_json(args)
    if args.format == "json":
        print(json.dumps(res.as_json(), indent=1))
        return 0 if res.ok else 1
    fmt = args.format
    print(f"probe on {res.topology} ({res.fidelity}): {res.nbytes} B per transfer, each case "
          f"replayed alone")
    show = res.cases.select(
        "case", "src", "dst", "actual_ns", "overhead_ns", "wire_ns", "drain_ns", "commit_ns",
        "lb_ns", "floor_ns", (pl.col("efficiency") * 100).round(1).alias("eff_%"),
        pl.col("eff_bw_gbps").round(1), "bn_bw_gbps", (pl.col("util") * 100).round(1)
        .alias("util_%"), "bottleneck")
    print(render(show.with_columns(pl.col(pl.Float64).round(2)), fmt))
    if res.sweep is not None:
        sw = res.sweep.with_columns((pl.col("util") * 100).round(1).alias("util_%"),
                                    pl.col("actual_ns").round(1))
        for col, title in (("actual_ns", "actual ns"), ("util_%", "utilisation % of the "
                                                                  "bottleneck link")):
            wide = sw.pivot(on="nbytes", index="case", values=col, sort_columns=False)
            wide.columns = ["case", *(_size(int(c)) for c in wide.columns[1:])]
            print(f"size sweep: {title}")
            print(render(wide, fmt))
    if args.hops:
        for case in res.cases["case"]:
            h = res.hops.filter(pl.col("case") == case).select(
                "hop", "stage", "node", pl.col("t_enter_ns").round(2),
                pl.col("t_leave_ns").round(2), pl.col("queue_ns").round(2), "nbytes")
            print(f"hops of {case}")
            print(render(h, fmt))
    for r in res.invariants.iter_rows(named=True):
        mark = "[v] PASS" if r["ok"] else "[x] FAIL"
        print(f"{mark} {r['invariant']}: {r['detail']}")
    if not res.ok:
        print(f"kbtrace: probe: {res.invariants.filter(~pl.col('ok')).height} invariant(s) "
              "failed", file=sys.stderr)
    return 0 if res.ok else 1


def _size(n: int) -> str:
    return f"{n >> 20}MiB" if n >= 1 << 20 and not n % (1 << 20) else \
        f"{n >> 10}KiB" if not n % 1024 else f"{n}B"
