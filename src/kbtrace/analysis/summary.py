"""Run summaries: the compact, comparable digest of a run that diff and baselines use.

A ``Summary`` holds the makespan, the exclusive stage totals (sum over PEs of
``stage_breakdown_pe``), mean utilisation per resource kind (``utilisation``), and the
per-op timing keyed by (launch, program, seq, kind, name). It is computed from a run
directory, or loaded from a baseline directory (``summary.json`` + ``ops.parquet``),
which is what ``data/baselines/<workload>/`` holds (a few KB per workload).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from kbtrace import __version__, schema
from kbtrace._integrity import check_digests, digests
from kbtrace._io import atomic_dir, write_json, write_table
from kbtrace.errors import AnalysisError, SchemaError

__all__ = ["Summary", "summarize", "load_summary", "write_summary", "OP_KEY"]

OP_KEY = ("launch", "program", "seq", "kind", "name")
_OP_COLS = (*OP_KEY, "pe", "t_issue_ns", "t_start_ns", "t_end_ns", "queue_ns")


@dataclass(frozen=True)
class Summary:
    """What diff compares. ``ops`` has OP_KEY + pe + t_issue/t_start/t_end/queue_ns."""

    source: str
    makespan_ns: float
    stages: dict[str, float]          # exclusive stage time summed over PEs (ns)
    util: dict[str, float]            # mean utilisation per resource kind
    ops: pl.DataFrame
    meta: dict[str, Any]


def summarize(run: Any) -> Summary:
    """Summarise a run directory (or open Run)."""
    from kbtrace.analysis.run import Run, open_run

    owned = not isinstance(run, Run)
    # nothing here reads the trace's ops; diff and baseline run in CI on pull requests, so
    # the runs they compare are opened sandboxed (no file access beyond the run's views)
    r = open_run(run, trace=False, sandbox=True) if owned else run
    try:
        stages = dict(r.sql("SELECT stage, sum(time_ns) AS t FROM stage_breakdown_pe "
                            "GROUP BY stage ORDER BY stage").rows())
        util = dict(r.sql("SELECT resource_kind || '.' || kind AS k, avg(util) AS u FROM utilisation "
                          "GROUP BY ALL ORDER BY k").rows())
        ops = r.sql(f"SELECT {', '.join(_OP_COLS)} FROM op_timing ORDER BY op_id")
        ops = ops.with_columns(pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String))
        from kbtrace.analysis.run import flat_info
        info = flat_info(r.info)
        meta = {k: info.get(k) for k in ("run_id", "workload", "trace_hash", "topology",
                                        "topology_hash", "fidelity", "options")}
        # rounded: sums of floats may differ in the last ulp between engines/versions
        stages = {k: round(float(v), 6) for k, v in stages.items()}
        util = {k: round(float(v or 0.0), 9) for k, v in util.items()}
        return Summary(str(r.path), float(r.makespan_ns), stages, util, ops, meta)
    finally:
        if owned:
            r.close()


def write_summary(s: Summary, out: str | os.PathLike[str]) -> Path:
    """Write a baseline directory whole: summary.json + ops.parquet (deterministic bytes);
    it may replace only an earlier baseline (``_io.atomic_dir``)."""
    out = Path(out)
    with atomic_dir(out, "baseline") as stage:
        write_table(stage / "ops.parquet", s.ops.to_arrow())
        write_json(stage / "summary.json", {
            "files": digests(stage, ("ops.parquet",)),      # checked when loaded
            "kind": "kbtrace.baseline", "schema_version": schema.SCHEMA_VERSION,
            "kbtrace_version": __version__, "makespan_ns": s.makespan_ns,
            "stages": s.stages, "util": s.util, "meta": s.meta})
    return out


def load_summary(path: str | os.PathLike[str]) -> Summary:
    """A run directory or a baseline directory -> Summary."""
    p = Path(path)
    if (p / "summary.json").is_file() and not (p / "run.json").is_file():
        return _load_baseline(p)
    if (p / "run.json").is_file():
        return summarize(p)
    raise AnalysisError(f"{p}: neither a run directory (run.json) nor a baseline (summary.json); "
                        "pass a `kbtrace replay` output or a data/baselines/<workload> directory")


def _load_baseline(p: Path) -> Summary:
    """A baseline directory; a corrupt, truncated or incomplete file is one ``SchemaError``."""
    from kbtrace._io import read_json_object
    from kbtrace.analysis.baseline import update_command
    from kbtrace.analysis.run import corrupt_parquet, read_parquet_schema

    fix = f"re-create it with `{update_command(p.name, p.parent)}`"
    sj = p / "summary.json"
    doc = read_json_object(sj, fix)
    schema.check_version(doc.get("schema_version"), str(sj))
    try:
        makespan = float(doc["makespan_ns"])
        stages = {str(k): float(v) for k, v in doc["stages"].items()}
        util = {str(k): float(v) for k, v in doc["util"].items()}
        meta = doc.get("meta") or {}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SchemaError(f"{sj}: corrupt baseline summary (bad or missing {exc}); {fix}") from None
    opf = p / "ops.parquet"
    if not opf.is_file():
        raise SchemaError(f"{opf}: missing; {fix}")
    check_digests(p, doc.get("files"), sj, fix)
    read_parquet_schema(opf, fix)
    try:
        ops = pl.read_parquet(opf)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise corrupt_parquet(opf, exc, fix) from None
    missing = [c for c in _OP_COLS if c not in ops.columns]
    if missing:
        raise SchemaError(f"{opf}: not a baseline ops table (no column {missing[0]!r}); {fix}")
    return Summary(str(p), makespan, stages, util, ops, meta)
