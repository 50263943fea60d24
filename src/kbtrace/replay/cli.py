"""``kbtrace replay``: a thin wrapper over ``kbtrace.replay.replay``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kbtrace.replay.engine import replay
from kbtrace.replay.options import FIDELITIES, ReplayOptions

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("replay", help="time a captured trace on a topology (SimPy)",
                       description="Replay TRACE_DIR on a topology; write op_timing.parquet, "
                                   "hops.parquet, nodes/links.parquet and run.json.")
    p.add_argument("trace", metavar="TRACE_DIR", help="trace directory written by kbtrace capture")
    p.add_argument("--topology", required=True, metavar="PATH",
                   help="topology YAML, e.g. topologies/default.yaml")
    p.add_argument("--fidelity", choices=FIDELITIES, default="fast",
                   help="flit: per-flit events (reference); fast: closed-form per transfer "
                        "(default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a topology parameter by its YAML path, e.g. "
                        "--set cube.hbm.pc_bw_gbps=16 (repeatable)")
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="run directory (default data/runs/<trace>-<topology>-<fidelity>)")
    p.set_defaults(func=_replay)


def _replay(args: argparse.Namespace) -> int:
    from kbtrace.topology.cli import parse_sets
    from kbtrace.topology.topology import compile_topology
    topo = compile_topology(args.topology, overrides=parse_sets(args.set))
    out = args.out
    if out is None and args.set:
        tag = "-".join(s.replace("=", "_") for s in args.set)
        out = str(Path("data") / "runs" / f"{Path(args.trace).name}-{topo.params.name}-{tag}-"
                                          f"{args.fidelity}")
    run = replay(args.trace, topo, ReplayOptions(fidelity=args.fidelity, out_dir=out))
    print(f"replayed {args.trace} on {topo.params.name} ({run.fidelity}): "
          f"makespan {run.makespan_ns:.1f} ns, {run.ops} ops, {run.hops} hops, "
          f"{run.events} events, {run.wall_s:.2f} s wall")
    print(f"run {run.run_id} written to {run.run_dir}")
    return 0
