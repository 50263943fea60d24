"""``kbtrace replay``: a thin wrapper over ``kbtrace.replay.replay``."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from kbtrace._paths import add_topology, arg
from kbtrace._progress import progress, replay_task
from kbtrace._tables import add_format
from kbtrace.replay.engine import replay
from kbtrace.replay.options import FIDELITIES, ReplayOptions, add_hbm_pcs
from kbtrace.replay.sweep import EXECUTORS

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:


    p = sub.add_parser("replay", help="time a captured trace on a topology (SimPy)",
                       description="Replay TRACE_DIR on a topology; write op_timing.parquet, "
                                   "hops.parquet, nodes/links.parquet and run.json.")
    p.add_argument("trace", metavar="TRACE_DIR", type=arg("trace"),
                   help="trace directory written by kbtrace capture, or its name in data/traces/")
    add_topology(p, required=True, overrides=True)
    p.add_argument("--fidelity", choices=FIDELITIES, default="fast",
                   help="flit: per-flit events (reference); fast: closed-form per transfer, "
                        "streams that meet on a link served together (default); fast-fcfs: "
                        "fast without moving a booking once made (faster where many streams "
                        "meet, late under contention)")
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="run directory (default data/runs/<workload>[-<params>]-<topology>"
                        "[-<overrides>]-<fidelity>: non-default values are in the name)")
    add_hbm_pcs(p)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="status line on stderr while the simulation runs (ops done, simulated "
                        "time, events, wall time); default: when stderr is a terminal")
    p.set_defaults(func=_replay)

    s = sub.add_parser("sweep", help="replay traces on topologies over a grid of parameters",
                       description="Replay every point of a sweep config (traces x topologies x "
                                   "fidelities x grid) into a hive-partitioned directory; write "
                                   "points.parquet (one row per point) and sweep.json. Exit 1 "
                                   "if any point failed (the others are kept).")
    s.add_argument("config", metavar="CONFIG", type=arg("sweep"),
                   help="sweep YAML or its name in replay/, e.g. replay/hbm_bandwidth.yaml")
    s.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="sweep directory (default data/sweeps/<config name>)")
    s.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="add or replace a grid axis, e.g. --grid cube.hbm.pc_bw_gbps=8,16,32 "
                        "(repeatable)")
    s.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="processes for the local executor: this one and N-1 workers, started "
                        "when the work pays for them (default 1: this process only)")
    s.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local processes (default) or a Ray cluster (pip install 'kbtrace[ray]')")
    s.add_argument("--resume", action="store_true",
                   help="skip points already replayed ok with the same config and inputs")
    add_format(s, what="the table of points")
    s.set_defaults(func=_sweep)


def _replay(args: argparse.Namespace) -> int:
    from kbtrace.topology.cli import parse_sets
    from kbtrace.topology.topology import compile_topology
    topo = compile_topology(args.topology, overrides=parse_sets(args.set))
    out = args.out       # default: data/runs/<workload>[-<params>]-<topology>[-<sets>]-<fidelity>
    with progress(args.progress) as bars:
        run = replay(args.trace, topo, ReplayOptions(fidelity=args.fidelity, out_dir=out,
                                                     hbm_pcs=args.hbm_pcs),
                     progress=replay_task(bars) if bars.mode != "off" else None)
    print(f"replayed {args.trace} on {topo.params.name} ({run.fidelity}): "
          f"makespan {run.makespan_ns:.1f} ns, {run.ops} ops, {run.hops} hops, "
          f"{run.events} events, {run.wall_s:.2f} s wall")
    print(f"run {run.run_id} written to {run.run_dir}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from kbtrace.replay.sweep import run_sweep
    from kbtrace.replay.sweep_config import load_config, parse_grid_items
    cfg = load_config(args.config, parse_grid_items(args.grid))
    out = Path(args.out) if args.out else Path("data") / "sweeps" / Path(args.config).stem
    n = 0
    with progress() as bars:
        total = (len(cfg.traces) * len(cfg.topologies) * len(cfg.fidelities)
                 * math.prod(len(v) for _, v in cfg.grid))
        task = bars.add("sweep", total=total, unit="points")

        def shown(point: Any, res: dict[str, Any]) -> None:
            nonlocal n
            n += 1
            what = (f"makespan {res['makespan_ns']:,.1f} ns ({res['wall_s']} s)"
                    if res["status"] == "ok" else f"FAILED: {res['error']}")
            task.update(n, info=str(point.rel_dir))
            # one line per point as it finishes (a log of the sweep, also through a pipe)
            print(f"sweep: [{n}] {point.rel_dir}: {what}", file=sys.stderr, flush=True)

        res = run_sweep(cfg, out, jobs=args.jobs, executor=args.executor, resume=args.resume,
                        on_point=shown)
        task.done()
    from kbtrace._tables import render_strings
    keys = [k for k, _ in cfg.grid] + list(cfg.workload_grid_keys)
    rows = res.points.to_pylist()
    # per workload (a trace, or all the traces of one gridded workload entry): the makespan
    # of its first successful point
    group = {t.name: t.base or t.name for t in cfg.traces}
    base: dict[str, float] = {}
    for r in rows:
        if r["makespan_ns"]:
            base.setdefault(group[r["trace"]], r["makespan_ns"])
    table = {c: ["-" if r[c] is None else str(r[c]) for r in rows]
             for c in ("point", "trace", "topology", "fidelity", *keys)}
    table["makespan_ns"] = [f"{r['makespan_ns']:,.1f}" if r["makespan_ns"] is not None
                            else r["status"] for r in rows]
    table["vs workload's first"] = [f"{r['makespan_ns'] / base[group[r['trace']]]:.3f}x"
                                    if r["makespan_ns"] is not None
                                    and group[r["trace"]] in base else "-" for r in rows]
    print(render_strings(table, args.format), end="")
    if args.format != "text":          # the table alone: a file or another program reads it
        return _sweep_exit(res, rows, out)
    reused = f", {res.reused} reused" if res.reused else ""
    print(f"sweep of {len(rows)} point(s){reused} written to {out} (points.parquet, sweep.json)")
    print(f"next: kbtrace report {out}   (makespan against each grid parameter, per-point "
          "bottlenecks)")
    return _sweep_exit(res, rows, out)


def _sweep_exit(res: Any, rows: list[dict[str, Any]], out: Path) -> int:
    from kbtrace.errors import SweepPointsFailed
    if res.failed:
        f = res.failed[0]
        raise SweepPointsFailed(f"sweep: {len(res.failed)} of {len(rows)} point(s) failed; "
                                f"first: point {f['point']} ({f['run_dir']}): {f['error']}; "
                                f"see {out / 'points.parquet'}")
    return 0
