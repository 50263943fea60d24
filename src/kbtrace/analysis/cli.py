"""Analysis subcommands: run, sql, verify, diff, baseline, report, export (argument parsing only)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kbtrace._paths import add_topology, arg
from kbtrace._progress import NOTE, log, progress, replay_task
from kbtrace.replay.options import FIDELITIES, add_hbm_pcs

__all__ = ["register"]

_RUN_HELP = "run directory, or its name in data/runs/"
_REPORT_HELP = ("run directory, sweep directory or directory of runs (a per-point report), "
                "or its name in data/runs/ or data/sweeps/")


def _sql(args: argparse.Namespace) -> int:
    from kbtrace.analysis.formats import render, resolve_query, write_frame
    from kbtrace.analysis.reporter import run_inputs
    from kbtrace.analysis.run import open_run
    from kbtrace.errors import UsageError

    if args.format == "parquet" and not args.out:
        raise UsageError("--format parquet needs -o FILE (Parquet is not written to a terminal)")
    query = resolve_query(args.query)     # an empty query or a missing .sql file: no run opened
    _missing_trace_note(args.run)
    with open_run(args.run, sandbox=args.sandbox) as run:
        df = run.sql(query)
        inputs = run_inputs(run.run_dirs, run.trace_dir)
    if args.out:
        write_frame(df, args.format, args.out, inputs)
        print(f"wrote {df.height} rows to {args.out}")
    else:
        sys.stdout.write(render(df, args.format))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from kbtrace.analysis.verifier import verify

    with progress() as bars:
        task = bars.add("verify", unit="ops")
        res = verify(args.run, progress=task.update)
        task.done()
    sys.stdout.write(res.render(args.format))
    return 0 if res.ok else 1


def _diff(args: argparse.Namespace) -> int:
    from kbtrace.analysis.differ import diff

    res = diff(args.base, args.new, fail_on=args.fail_on or [])
    out = res.render(args.format)
    if args.out:
        from kbtrace._io import atomic_path
        with atomic_path(args.out, (args.base, args.new)) as tmp:
            tmp.write_text(out)
    sys.stdout.write(out)
    return 1 if res.failed else 0


def _baseline_update(args: argparse.Namespace) -> int:
    from kbtrace.analysis.baseline import update_baselines

    for name, path in update_baselines(args.workloads or None, topology=args.topology,
                                       root=args.root):
        print(f"baseline {name}: {path}")
    return 0


def _baseline_check(args: argparse.Namespace) -> int:
    from kbtrace.analysis.baseline import check_baselines

    failed = False
    for name, res in check_baselines(args.workloads or None, topology=args.topology,
                                     root=args.root, fail_on=args.fail_on or ["makespan>2%"]):
        if args.format == "text":
            print(f"== {name}: {'REGRESSION' if res.failed else 'ok'}")
        sys.stdout.write(res.render(args.format))
        failed = failed or res.failed
    return 1 if failed else 0


def _missing_trace_note(run_path: Path) -> None:
    """One stderr line when a run's trace cannot be found: its ``ops`` view is then empty,
    and so is everything built on it (dependency edges of the critical path, GEMM FLOPs)."""
    from kbtrace.analysis.run import find_trace_dir, read_run_json, recorded_trace_path

    run_dir = Path(run_path)
    if not (run_dir / "run.json").is_file():
        return                       # a sweep or a directory of runs: each point has its own
    info = read_run_json(run_dir)
    if find_trace_dir(run_dir, info) is None:
        log.warning(f"{run_dir}: its trace ({recorded_trace_path(info)}) was not found; views "
                    "over the trace's ops are empty (fix trace.path in run.json to include "
                    "them)", extra=NOTE)


def _report(args: argparse.Namespace) -> int:
    from kbtrace.analysis.reporter import report

    _missing_trace_note(args.run)
    with progress() as bars:
        task = bars.add("report: tables and plots")
        out = report(args.run, args.out)
        task.done()
    print(f"report: {out / 'index.html'}")
    return 0


def _export_perfetto(args: argparse.Namespace) -> int:
    from kbtrace.analysis.perfetto import export_perfetto

    with progress() as bars:
        task = bars.add("export perfetto")
        n = export_perfetto(args.run, args.out)
        task.done()
    print(f"wrote {n} trace events to {args.out} (open it in https://ui.perfetto.dev)")
    return 0


def _run(args: argparse.Namespace) -> int:
    from kbtrace.analysis.main import run_workload

    def lines(part: list[str]) -> None:      # each stage's lines as it ends, also in a pipe
        if part:
            print("\n".join(part), flush=True)

    with progress(args.progress) as bars:
        current: list[Any] = []

        def stage(name: str) -> None:       # a spinner per stage; replay shows its ops
            while current:
                current.pop().done()
            if name != "replay":
                current.append(bars.add(name))

        summary = run_workload(args.workload, topology=args.topology, params=args.param or [],
                               sets=args.set, fidelity=args.fidelity, out=args.out,
                               verify_data=not args.no_verify, make_report=not args.no_report,
                               attribute="auto" if args.attribute is None else bool(args.attribute),
                               hbm_pcs=args.hbm_pcs, verify_alongside=args.verify_alongside,
                               progress=replay_task(bars) if bars.mode != "off" else None,
                               on_stage=stage, on_lines=lines)
        while current:
            current.pop().done()
    return 0 if summary.ok else 1


def _check(args: argparse.Namespace) -> int:
    from kbtrace.analysis.check import check_path
    topo = None
    if args.topology is not None:
        from kbtrace.topology import compile_topology
        topo = compile_topology(args.topology)
    for line in check_path(args.path, topo):
        print(line)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from kbtrace.analysis.formats import FORMATS, add_format

    p = sub.add_parser("run", help="capture + replay + verify + report one workload (main job)",
                       description="Capture WORKLOAD.py, replay it on a topology, verify the "
                                   "numbers, write a report; print where everything went.")
    p.add_argument("workload", nargs="?", default=None,
                   help="workload file or its name in capture/ (default: capture/gemm.py)")
    add_topology(p, overrides=True)
    p.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                   help="workload parameter override, repeatable (-p M=512)")
    p.add_argument("--fidelity", choices=FIDELITIES, default="fast",
                   help="replay fidelity: fast (default), flit (the reference) or fast-fcfs "
                        "(faster where many streams meet, late under contention)")
    p.add_argument("-o", "--out", default="data", metavar="DIR", help="output root: OUT/traces/<workload>-<topology>, "
                   "OUT/runs/<workload>-<topology>-<fidelity> (report in RUN/report) (default: data/)")
    p.add_argument("--no-verify", action="store_true", help="skip phase-2 verification")
    p.add_argument("--no-report", action="store_true", help="skip the HTML/PNG report")
    p.add_argument("--attribute", action=argparse.BooleanOptionalAction, default=None,
                   help="name the resource that would help most (each resource class made 2x "
                        "faster, re-timed on the recorded run: `kbtrace attribute --estimate`); "
                        "default: when that is estimated under 3 s")
    p.add_argument("--verify-alongside", action=argparse.BooleanOptionalAction, default=None,
                   help="verify in a second process while the headline and report run (same "
                        "result, shorter wall time); default: from 50,000 ops on, with 2+ cores")
    add_hbm_pcs(p)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="replay status line on stderr (ops done, simulated time, events, wall "
                        "time); default: when stderr is a terminal")
    p.set_defaults(func=_run)

    p = sub.add_parser("sql", help="run SQL (or a saved query by name) over a run's views")
    p.add_argument("run", type=arg("run"),
                   help="run directory (or a directory of runs), or its name in data/runs/")
    p.add_argument("query", help="SQL text, a saved query name from analysis/ (top_hotspots), "
                                 "or a .sql file")
    add_format(p, FORMATS, "the rows (parquet: with -o only)")
    p.add_argument("-o", "--out", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--sandbox", action="store_true",
                   help="for SQL you did not write (e.g. from a pull request): the query sees "
                        "the run's views only; DuckDB file access (read_csv, COPY TO, ATTACH, "
                        "INSTALL, ...) is off and its configuration locked")
    p.set_defaults(func=_sql)

    p = sub.add_parser("verify", help="phase-2 numeric verification in replay order (exit 1 on mismatch)")
    p.add_argument("run", type=arg("run"), help=_RUN_HELP)
    add_format(p, what="the per-tensor table (json: the whole result)")
    p.set_defaults(func=_verify)

    p = sub.add_parser("diff", help="compare two runs or baselines op by op; thresholds set the exit code")
    p.add_argument("base", type=arg("run"), help="baseline run or baseline directory (or a "
                   "name in data/runs/ or data/baselines/)")
    p.add_argument("new", type=arg("run"), help="new run or baseline directory")
    p.add_argument("--fail-on", action="append", metavar="RULE",
                   help="regression rule, repeatable: makespan>2%%, stage.dma_read>5%%, "
                        "util.node.hbm_ctrl<-10%%, ops.added>0, op.max>10%%")
    add_format(p, what="the comparison (csv: the metrics table)")
    p.add_argument("-o", "--out", metavar="FILE", help="also write the rendering to FILE")
    p.set_defaults(func=_diff)

    p = sub.add_parser("baseline", help="committed CI baselines under data/baselines/")
    bsub = p.add_subparsers(dest="baseline_command", metavar="ACTION", required=True)
    for name, fn, hlp in (("update", _baseline_update, "re-run workloads and rewrite baselines"),
                          ("check", _baseline_check, "re-run workloads and diff against baselines")):
        b = bsub.add_parser(name, help=hlp)
        b.add_argument("workloads", nargs="*", help="workload names (default: every capture/*.py)")
        add_topology(b)
        b.add_argument("--root", default=None, help="baseline root (default: data/baselines)")
        if name == "check":
            b.add_argument("--fail-on", action="append", metavar="RULE")
            add_format(b, what="each comparison")
        b.set_defaults(func=fn)

    p = sub.add_parser("check", help="check that a trace, run, sweep or baseline is intact "
                                     "(digests, schemas, fields); exit 2 naming the first problem",
                       description="Check every trace, run, sweep and baseline at or below PATH "
                                   "as its readers would: recorded file digests, schemas, JSON "
                                   "fields, op times; with -t, also that traces fit a topology.")
    p.add_argument("path", type=Path, help="a trace, run, sweep or baseline directory (or a "
                                           "directory holding several)")
    p.add_argument("--topology", "-t", default=None, metavar="PATH", type=arg("topology"),
                   help="also validate traces against this topology (as replay would)")
    p.set_defaults(func=_check)

    p = sub.add_parser("report", help="tables, plots and one HTML page for a run, sweep or set of runs")
    p.add_argument("run", type=arg("run"), help=_REPORT_HELP)
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="report directory (default: RUN/report)")
    p.set_defaults(func=_report)

    p = sub.add_parser("export", help="export a run's timeline")
    esub = p.add_subparsers(dest="export_format", metavar="FORMAT", required=True)
    e = esub.add_parser("perfetto", help="Chrome trace-event JSON for ui.perfetto.dev")
    e.add_argument("run", type=arg("run"), help=_RUN_HELP)
    e.add_argument("-o", "--out", required=True, type=Path, metavar="FILE",
                   help="output .json file")
    e.set_defaults(func=_export_perfetto)
