"""Analysis stage: SQL views, verification, diff, reports and timeline export over runs.

Role
    Turn a replayed run (``op_timing.parquet``, ``hops.parquet``, ``nodes/links.parquet``,
    ``run.json``) and its trace (``ops.parquet``, ``memory.parquet``) into answers: where
    the time went, whether the numbers are right, and what changed against a baseline.

Inputs / outputs
    run dir (+ trace dir)  ->  DuckDB views and polars frames     (``open_run``)
                           ->  VerifyResult (phase-2 numerics)     (``verify``; in a
                               second process beside the report: ``alongside``)
    base + new runs        ->  DiffResult (+ CI exit code)         (``diff``)
    run dir                ->  report dir: CSV/MD tables, PNGs, HTML (``report``)
    sweep / dir of runs    ->  report dir: per-point table, sweep plots (``report``)
                           ->  Chrome/Perfetto trace JSON           (``export_perfetto``)

Phases
    open (schema checks, base views over Parquet) -> SQL library views (``sql/*.sql``)
    -> question modules return frames -> report/plot modules consume those frames.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "open_run": "kbtrace.analysis.run",
    "Run": "kbtrace.analysis.run",
    "catalogue_markdown": "kbtrace.analysis.sqllib",
    "view_docs": "kbtrace.analysis.sqllib",
    "verify": "kbtrace.analysis.verifier",
    "VerifyResult": "kbtrace.analysis.verifier",
    "diff": "kbtrace.analysis.differ",
    "DiffResult": "kbtrace.analysis.differ",
    "summarize": "kbtrace.analysis.summary",
    "report": "kbtrace.analysis.reporter",
    "export_perfetto": "kbtrace.analysis.perfetto",
    "run_workload": "kbtrace.analysis.main",
    "write_synthetic_run": "kbtrace.analysis.synthetic",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'kbtrace.analysis' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
