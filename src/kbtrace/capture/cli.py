"""``kbtrace capture`` and ``kbtrace trace show``: thin wrappers over the capture library."""

from __future__ import annotations

import argparse
from collections import Counter

import pyarrow.parquet as pq

from kbtrace._paths import add_topology, arg
from kbtrace._progress import log, progress
from kbtrace.capture.trace import Trace, capture, open_trace

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capture", help="run a workload's kernels and write an op trace",
                       description="Capture WORKLOAD.py (a file in capture/) into ops.parquet, "
                                   "memory.parquet and trace.json.")
    p.add_argument("workload", metavar="WORKLOAD.py", type=arg("workload"),
                   help="workload file or its name in capture/, e.g. capture/gemm.py or gemm")
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                   help="override a workload parameter, typed like its default (repeatable)")
    add_topology(p, overrides=True)
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="trace directory (default data/traces/<workload>[-<params>]; "
                        "then -<topology>[-<overrides>] unless the default topology)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="write the trace even when an output differs from its numpy reference "
                        "(default: an error, exit 2, nothing written)")
    p.add_argument("--strict", action="append", default=[], choices=("promote", "store", "all"),
                   help="make an implicit type conversion a sanitizer error: 'promote' (mixed "
                        "operand dtypes), 'store' (tl.store casting to the destination's "
                        "dtype), 'all' (repeatable)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the op count per kind from the workload's op_counts(p, topo) "
                        "instead of capturing (sizes too large to capture, e.g. llama_layer "
                        "at full Llama-70B size)")
    p.set_defaults(func=_capture)

    t = sub.add_parser("trace", help="inspect captured traces")
    tsub = t.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)
    s = tsub.add_parser("show", help="summarise a trace directory")
    s.add_argument("dir", metavar="DIR", type=arg("trace"),
                   help="trace directory or its name in data/traces/")
    s.set_defaults(func=_show)


def _counts(trace: Trace) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(trace.op_counts.items()))


def _dry_run(args: argparse.Namespace, topo) -> int:
    from types import SimpleNamespace

    from kbtrace.capture.workload import load_workload, parse_params
    from kbtrace.errors import CaptureError, UsageError
    from kbtrace.topology import compile_topology
    if not hasattr(topo, "params"):
        topo = compile_topology(topo)
    mod = load_workload(args.workload)
    fn = getattr(mod, "op_counts", None)
    if not callable(fn):
        raise UsageError(f"{args.workload}: --dry-run needs the workload to define "
                         "op_counts(p, topo); capture it instead (drop --dry-run)")
    params = parse_params(getattr(mod, "PARAMS", {}), args.param)
    try:
        counts = fn(SimpleNamespace(**params), topo)
    except ValueError as e:
        raise CaptureError(f"{args.workload}: {e}") from None
    shown = " ".join(f"{k}={v}" for k, v in sorted(params.items()))
    print(f"dry run of {args.workload} on {topo.params.name} ({shown}): "
          f"{sum(counts.values()):,} ops ({', '.join(f'{k}={v:,}' for k, v in sorted(counts.items()))})")
    print("nothing captured (op counts from the workload's op_counts)")
    return 0


def _capture(args: argparse.Namespace) -> int:
    topo = args.topology
    if args.set:
        from kbtrace.topology import compile_topology
        from kbtrace.topology.cli import parse_sets
        topo = compile_topology(topo, overrides=parse_sets(args.set))
    if args.dry_run:
        return _dry_run(args, topo)
    with progress() as bars:
        task = bars.add(f"capture {args.workload.stem}: running kernels")
        tr = capture(args.workload, topo, params=args.param, out_dir=args.out,
                     allow_mismatch=args.allow_mismatch, strict=args.strict)
        task.done()
    print(f"captured {tr.name}: {tr.n_ops} ops ({_counts(tr)})")
    if tr.n_ops == 0:
        params = ", ".join(f"{k}={v}" for k, v in sorted(tr.meta["params"].items()))
        log.warning(f"{tr.name} ({params}) recorded no ops: a replay would time nothing; "
                    "check the parameters (a size of 0?)")
    for name, chk in sorted(tr.meta["reference_check"].items()):
        state = "matches" if chk["ok"] else "DIFFERS FROM"
        print(f"  output {name} ({chk['dtype']}) {state} its numpy reference "
              f"(max abs err {chk['max_abs_err']:.3g})")
    print(f"trace written to {tr.path}")
    # only with --allow-mismatch: the trace is kept, the exit code still says it differs
    return 1 if any(not c["ok"] for c in tr.meta["reference_check"].values()) else 0


def _show(args: argparse.Namespace) -> int:
    tr = open_trace(args.dir)
    m = tr.meta
    print(f"trace {tr.path}: workload {m['workload']} ({m['workload_file']}), kbtrace "
          f"{m['kbtrace_version']}, schema {m['schema_version']}")
    print(f"  topology {m['topology']['name']} ({m['topology']['content_hash']})")
    print("  params " + ", ".join(f"{k}={v}" for k, v in sorted(m["params"].items())))
    for i, ln in enumerate(m["launches"]):
        print(f"  launch {i}: kernel {ln['kernel']} grid {tuple(ln['grid'])} "
              f"({ln['programs']} programs), {ln['n_ops']} ops")
    print(f"  {m['n_ops']} ops: {_counts(tr)}")
    ops = pq.read_table(tr.ops_path, columns=["sip", "cube", "pe", "nbytes", "kind"])
    per_pe = Counter(zip(ops.column("sip").to_pylist(), ops.column("cube").to_pylist(),
                         ops.column("pe").to_pylist(), strict=True))
    moved = sum(n for n, k in zip(ops.column("nbytes").to_pylist(), ops.column("kind").to_pylist(),
                                  strict=True) if k in ("load", "store", "send"))
    print(f"  {len(per_pe)} PEs active, {moved} bytes moved by load/store/send")
    mem = pq.read_table(tr.memory_path, columns=["tensor", "role"]).to_pylist()
    roles = Counter((r["tensor"], r["role"]) for r in mem)
    def parts(r: str, n: int) -> str:   # a reference is stored in blocks, not shards
        unit = "block" if r == "reference" else "shard"
        return f"{n} {unit}{'s' if n > 1 else ''}"

    print("  tensors: " + ", ".join(f"{t} ({r}, {parts(r, n)})"
                                    for (t, r), n in sorted(roles.items())))
    return 0
