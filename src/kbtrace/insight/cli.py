"""``kbtrace attribute``: a thin wrapper over ``kbtrace.insight``."""

from __future__ import annotations

import argparse

from kbtrace._paths import arg

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
    p.set_defaults(func=_attribute)


def _attribute(args: argparse.Namespace) -> int:
    from kbtrace.insight.attribute import attribute
    from kbtrace.topology.cli import parse_sets
    res = [r.strip() for r in args.resources.split(",")] if args.resources else None
    a = attribute(args.run, factor=args.factor, reverse=args.reverse, resources=res,
                  topology=args.topology, overrides=parse_sets(args.set), jobs=args.jobs,
                  executor=args.executor, out=args.out)
    print(a.text())
    top = a.top
    if top:
        print(f"helps most: {top['resource']} ({top['keys']}) {a.table['factor'][0].as_py():g}x "
              f"faster saves {top['faster_gain_pct']:.2f}% of the makespan")
    else:
        print("no resource class changes the makespan")
    print(f"{a.replays} replays in {a.wall_s:.2f} s; written to {a.out_dir} "
          f"(kbtrace report {args.run} shows it)")
    return 0
