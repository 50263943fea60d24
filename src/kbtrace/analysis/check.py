"""``kbtrace check PATH``: is a trace, run, sweep or baseline intact?

For every artefact at or below PATH it does what a reader does before trusting one, and
nothing else (no replay, no query):

* **trace** (trace.json): format, schema version, trace.json keys and types, the digests
  of ops.parquet and memory.parquet, their schemas; with ``topology``, the whole
  ``replay.validate`` check of the ops against that topology;
* **run** (run.json): run.json fields and types, the digest and row counts of every file
  it records, the Parquet schemas, op times (no op ends before it starts), and, when the
  run's trace is found, that it is the trace the run was replayed from;
* **baseline** (summary.json): the summary's fields, ops.parquet's digest and schema;
* **sweep** (points.parquet): the points table, then each of its runs.

The first problem is raised as the ``KbtraceError`` the reader would raise; otherwise the
artefacts checked are returned (the CLI prints one line each).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kbtrace.errors import UsageError

__all__ = ["check_path"]


def _trace(d: Path, topology: Any) -> str:
    from kbtrace.tracefile import open_trace
    tr = open_trace(d)
    if topology is None:
        return f"trace {d}: ok ({tr.n_ops} ops; files match trace.json)"
    from kbtrace._io import read_parquet_lean
    from kbtrace.replay.validate import validate_ops
    validate_ops(read_parquet_lean(tr.ops_path), topology, tr.meta)
    return (f"trace {d}: ok ({tr.n_ops} ops; files match trace.json; fits topology "
            f"{topology.params.name!r})")


def _run(d: Path) -> str:
    from kbtrace import schema
    from kbtrace.analysis.run import (
        REPLAY_FIX,
        _checked,
        find_trace_dir,
        read_run_json,
        run_trace_dir,
    )
    from kbtrace.analysis.verifier import check_timing
    from kbtrace.errors import SchemaError
    info = read_run_json(d)
    for name, sch in (("op_timing", schema.OP_TIMING), ("hops", schema.HOPS),
                      ("nodes", schema.NODES), ("links", schema.LINKS)):
        _checked(d / f"{name}.parquet", sch)
    import pyarrow.parquet as pq
    try:
        timing = pq.read_table(d / "op_timing.parquet",
                               columns=["op_id", "t_issue_ns", "t_start_ns", "t_end_ns"])
    except (OSError, ValueError) as exc:
        raise SchemaError(f"{d / 'op_timing.parquet'}: unreadable ({exc}); {REPLAY_FIX}") from None
    check_timing(timing, d / "op_timing.parquet")
    trace = find_trace_dir(d, info)
    if trace is not None:
        run_trace_dir(d, info)
    files = "files match run.json" if info.get("files") else "no digests recorded (older run)"
    where = f"trace {trace}" if trace is not None else "trace not found"
    return f"run {d}: ok ({files}; {where})"


def _baseline(d: Path) -> str:
    from kbtrace.analysis.summary import load_summary
    s = load_summary(d)
    return f"baseline {d}: ok ({s.ops.height} ops)"


def check_path(path: str | os.PathLike[str], topology: Any = None) -> list[str]:
    """Check every trace, run, baseline and sweep at or below ``path``; one line each."""
    root = Path(path)
    if not root.exists():
        raise UsageError(f"{root}: no such file or directory; pass a trace, run, sweep or "
                         "baseline directory")
    if root.is_file():          # a file inside one: check the directory that holds it
        root = root.parent
    found: list[tuple[str, Path]] = []
    for marker, kind in (("trace.json", "trace"), ("run.json", "run"),
                         ("summary.json", "baseline"), ("points.parquet", "sweep")):
        hits = [root / marker] if (root / marker).is_file() else sorted(root.rglob(marker))
        found += [(kind, h.parent) for h in hits]
    if not found:
        raise UsageError(f"{root}: holds no kbtrace trace (trace.json), run (run.json), "
                         "baseline (summary.json) or sweep (points.parquet)")
    lines = []
    for kind, d in sorted(found, key=lambda kd: (str(kd[1]), kd[0])):
        if kind == "trace":
            lines.append(_trace(d, topology))
        elif kind == "run":
            lines.append(_run(d))
        elif kind == "baseline" and not (d / "run.json").is_file():
            lines.append(_baseline(d))
        elif kind == "sweep":
            from kbtrace.analysis.run import _points_run_dirs
            dirs = _points_run_dirs(d / "points.parquet")
            lines.append(f"sweep {d}: points.parquet ok ({len(dirs)} points)")
    return lines
