"""``kbtrace attribute``, ``whatif`` and ``calibrate``: thin wrappers over ``kbtrace.insight``."""

from __future__ import annotations

import argparse

from kbtrace._paths import arg
from kbtrace._tables import add_format, render

__all__ = ["register"]


def _topology_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", "-t", type=arg("topology"), default=None, metavar="PATH",
                   help="the topology the run was replayed on (default: run.json's path; "
                        "checked against the recorded topology hash)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="the --set overrides the run was replayed with (repeatable)")


def register(sub: argparse._SubParsersAction) -> None:
    from kbtrace.insight.resources import RESOURCES
    p = sub.add_parser(
        "attribute", help="which resource, made faster, shortens the run most (replays)",
        description="Replay RUN's trace with each resource class (mesh, UCIe, PCIe and IO "
                    "links, node overheads, HBM, SRAM, DMA set-up, GEMM and MATH clocks, TCM, "
                    "IPCQ, dispatch) made FACTOR x faster and slower; rank the makespan "
                    "changes; write RUN/attribution/attribution.parquet (kbtrace report RUN "
                    "shows it with a tornado chart). Classes: "
                    + "; ".join(f"{r.name}: {', '.join(r.keys)}" for r in RESOURCES))
    p.add_argument("run", type=arg("run"), help="run directory, or its name in data/runs/")
    p.add_argument("--factor", type=float, default=2.0,
                   help="how much faster each class is made (default 2: bandwidths and clocks "
                        "x2, overheads /2, slots x2)")
    p.add_argument("--reverse", action=argparse.BooleanOptionalAction, default=True,
                   help="also replay each class 1/FACTOR as fast (default: yes)")
    p.add_argument("--resources", default=None, metavar="A,B,...",
                   help="only these classes (default all)")
    _topology_opts(p)
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="worker processes (default 1: in this process)")
    p.add_argument("--executor", choices=("local", "ray"), default="local")
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="output directory (default RUN/attribution)")
    p.add_argument("--estimate", action="store_true",
                   help="re-time each class on the recorded graph (kbtrace whatif) instead of "
                        "replaying it: faster, an estimate")
    add_format(p, what="the ranked table (text: with the summary lines)")
    p.set_defaults(func=_attribute)

    w = sub.add_parser(
        "whatif", help="re-time a run with changed parameters, without a replay",
        description="Re-time RUN on its recorded dependency graph (program order, "
                    "dependencies, IPCQ matching, each contended resource's recorded service "
                    "order) with topology parameters changed by --set; say where the recorded "
                    "order could flip and bound the error there; --exact replays instead.")
    w.add_argument("run", type=arg("run"), help="run directory, or its name in data/runs/")
    w.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", required=True,
                   help="the change: a topology parameter by its YAML path (repeatable)")
    w.add_argument("--exact", action="store_true",
                   help="replay the trace with the change instead (slower, exact)")
    w.add_argument("--topology", "-t", type=arg("topology"), default=None, metavar="PATH",
                   help="the topology the run was replayed on (default: run.json's path)")
    w.add_argument("--replayed-with", action="append", default=[], metavar="KEY=VALUE",
                   help="the --set overrides the run was replayed with (repeatable)")
    add_format(w, what="the result (text: a sentence and its caveats; else one row)")
    w.set_defaults(func=_whatif)

    c = sub.add_parser(
        "calibrate", help="fit topology parameters to measured figures (least squares)",
        description="Replay calibration scenarios (PE DMA reads: local, cross-half, "
                    "cross-cube, cross-SIP, hot targets) on a topology and fit the --fit "
                    "parameters so they match a target CSV (scenario,nbytes,measured_ns"
                    "[,source]; default: the reference's PE DMA figures); report each "
                    "figure's error before and after; write the fitted topology YAML. "
                    "Exit 1 when a figure stays off by more than --tolerance.")
    c.add_argument("--target", default=None, metavar="FILE",
                   help="target CSV (default: the shipped reference figures)")
    c.add_argument("--fit", default=None, metavar="KEY,...",
                   help="parameters to fit; KEY+KEY scales keys by one factor (default "
                        "pe.dma.overhead_ns, cube.mesh.router_overhead_ns, "
                        "cube.hbm.pc_bw_gbps+cube.hbm.router_bw_gbps, sip.ucie.overhead_ns)")
    c.add_argument("--topology", "-t", type=arg("topology"), default=None, metavar="PATH",
                   help="topology to start from (default topologies/default.yaml)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="start the fit from these overrides (repeatable)")
    c.add_argument("--tolerance", type=float, default=0.10,
                   help="largest relative error a fitted figure may keep (default 0.10)")
    c.add_argument("--max-evaluations", type=int, default=60, metavar="N",
                   help="most optimiser steps (scipy's max_nfev; each step's Jacobian costs "
                        "one more round of replays per fitted factor) (default 60)")
    c.add_argument("-o", "--out", default="data/calibration", metavar="DIR",
                   help="output directory: calibrated.yaml, calibration.csv, calibration.json "
                        "(default data/calibration)")
    add_format(c, what="each figure before and after (text: with the fitted parameters)")
    c.set_defaults(func=_calibrate)


def _attribute(args: argparse.Namespace) -> int:
    from kbtrace.insight.attribute import attribute
    from kbtrace.topology.cli import parse_sets
    res = [r.strip() for r in args.resources.split(",")] if args.resources else None
    a = attribute(args.run, factor=args.factor, reverse=args.reverse, resources=res,
                  topology=args.topology, overrides=parse_sets(args.set), jobs=args.jobs,
                  executor=args.executor, out=args.out,
                  method="whatif" if args.estimate else "replay")
    if args.format != "text":
        print(render(a.frame(), args.format), end="")
        return 0
    print(a.text())
    top = a.top
    if top:
        print(f"helps most: {top['resource']} ({top['keys']}) {a.table['factor'][0].as_py():g}x "
              f"faster saves {top['faster_gain_pct']:.2f}% of the makespan")
    else:
        print("no resource class changes the makespan")
    est = f", {a.estimates} re-timed estimates" if a.estimates else ""
    print(f"{a.replays} replays{est} in {a.wall_s:.2f} s; written to {a.out_dir} "
          f"(kbtrace report {args.run} shows it)")
    return 0


def _whatif(args: argparse.Namespace) -> int:
    from kbtrace.insight.whatif import whatif
    from kbtrace.topology.cli import parse_sets
    res = whatif(args.run, parse_sets(args.set), exact=args.exact, topology=args.topology,
                 overrides=parse_sets(args.replayed_with))
    if args.format != "text":
        print(render(res.frame(), args.format), end="")
        return 0
    print(res.text())
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from kbtrace._paths import resolve
    from kbtrace.insight.calibrate import calibrate
    from kbtrace.topology.cli import parse_sets
    fit = [k.strip() for k in args.fit.split(",") if k.strip()] if args.fit else None
    topo = args.topology or resolve("topologies/default.yaml", "topology")
    cal = calibrate(args.target, topology=topo, fit=fit, start=parse_sets(args.set) or None,
                    tolerance=args.tolerance, max_evaluations=args.max_evaluations,
                    out=args.out)
    if args.format != "text":
        print(render(cal.frame(), args.format), end="")
        return 0 if cal.ok else 1
    print(cal.text())
    print(f"fitted topology written to {cal.out_dir}/calibrated.yaml (and calibration.csv, "
          "calibration.json)")
    return 0 if cal.ok else 1
