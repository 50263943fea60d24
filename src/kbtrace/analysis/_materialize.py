"""``Run.materialize`` and ``Run.set_windows``: views computed once and kept, on an open run.

A materialised view ``v`` becomes ``CREATE VIEW v AS SELECT * FROM _m_v``, where ``_m_v`` is

- a temporary table of the view's rows (``ORDER BY ALL`` for ``PARALLEL_SAFE`` views,
  computed on every core);
- for ``_busy_islands``, ``_pe_segments``, ``_crit_pred`` and ``critical_path`` of a single
  run, the rows of their numpy twins (``analysis.islands``, ``critpred``, ``critpath``),
  written to a Parquet file in the run's spill directory, which ``v`` reads instead of
  ``_m_v``: the rows grow with the hops or the ops (23 M islands, ~720 MB as a DuckDB table
  at a million ops; ``_crit_pred`` a row per op and ``critical_path`` one per op on the path,
  ~70 MiB as tables there, held under the report's and the timeline's peaks), and a file
  costs neither the process nor DuckDB's buffer pool any memory while no query reads it
  (issue 22, target 3). A query decodes the pages it reads in file order, so sums over it
  add up in the same order as over a table (``critical_path``'s twin reads ``_crit_pred``
  in any order: it walks the predecessors by op_id);
- for ``utilisation_windows``, the only view reading the window setting (``_config``), a
  temporary table per window count, ``_m_utilisation_windows_<n>``: ``set_windows(n)``
  points the view at the table of ``n`` if there is one, else back at its SQL, so the view
  is never stale (the report reads it twice: its plot and the timeline's counters). Of a
  single run, the table holds its numpy twin's rows (``analysis.utilwindows``: the same
  rows, each window's busy time added up in time order, not in DuckDB's join order), added
  up as the islands are made when ``_busy_islands`` is materialised before it in the same
  call (``utilwindows.WindowSums``), else from the islands read back.

Every materialised view keeps its name; the run's files do not change.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from kbtrace._io import dictionary_columns, release_memory
from kbtrace.analysis import critpath, critpred, islands, utilwindows
from kbtrace.analysis._earliest import Earliest
from kbtrace.analysis._memory import release_cache
from kbtrace.analysis.sqllib import view_docs
from kbtrace.errors import AnalysisError

__all__ = ["MATERIALIZE", "PARALLEL_SAFE", "WINDOWED", "materialize", "set_windows", "IDENT"]

_log = logging.getLogger("kbtrace.analysis")

# views the report reads more than once, each costly on large runs (helpers first);
# ``hotspots`` and ``roofline`` each scan every hop, and the headline and the report read
# them three times between them (0.5 CPU s a scan at a million ops)
MATERIALIZE = ("_pe_segments", "_busy_islands", "utilisation", "_crit_pred", "critical_path",
               "utilisation_windows", "hotspots", "roofline")
# of those, the ones whose rows are exact whatever the evaluation order (min / max, integer
# sums, windows over a total order; checked equal at 1 and 2 threads on 3.8M hops): they are
# computed on every core and sorted (ORDER BY ALL), so what reads them sees the same rows in
# the same order as single-threaded. Float sums (utilisation, critical_path) stay on one.
PARALLEL_SAFE = frozenset({"_pe_segments", "_busy_islands", "_crit_pred"})
#: the view that depends on ``Run.set_windows`` (one materialisation per window count)
WINDOWED = "utilisation_windows"
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: view -> the function computing its rows in numpy, a table at a time (single runs)
TWINS = {**islands.TWINS, "_crit_pred": critpred.crit_pred_parts,
         "critical_path": critpath.critical_path_parts,
         "utilisation_windows": utilwindows.rows_parts}
#: rows per row group of a twin's Parquet file (the per-PE timeline's query over
#: ``_pe_segments`` held ~110 MiB with the ~600 k-row groups of its chunks at a million ops)
TWIN_ROW_GROUP = 1 << 16
#: of those, the ones whose rows may come from one scan of the hops (``Run._scans``)
SHARED = frozenset({*islands.TWINS, "_crit_pred"})


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def materialize(run: Any, views: tuple[str, ...]) -> None:
    """``Run.materialize(views)`` (see the module docstring and ``Run.materialize``)."""
    for v in views:
        if not IDENT.match(v):
            raise AnalysisError(f"{v!r} is not a view name")
    twins = len(run.run_dirs) == 1 and not run.sandbox
    if twins and "_crit_pred" in views and any(
            v in islands.TWINS for v in views[:views.index("_crit_pred")]):
        run._scans["_collect"] = critpred.Collect   # the islands' scan takes its hops too
    if twins:           # (a single run's hops view reads this file)
        run._scans[islands.HOPS_FILE] = run.run_dirs[0] / "hops.parquet"
        if any(v in islands.TWINS for v in views):
            # the timeline's fabric cut, counted by the islands' scan (perfetto._fabric_cut)
            from kbtrace.analysis.perfetto import MAX_FABRIC_SLICES
            run._scans[islands.FABRIC] = Earliest(MAX_FABRIC_SLICES)
    if twins and WINDOWED in views and "_busy_islands" in views[:views.index(WINDOWED)]:
        run._scans[utilwindows.WANT] = True     # its busy times added up with the islands
    try:
        _materialize(run, views, twins)
        fabric = run._scans.get(islands.FABRIC)
        if fabric is not None and fabric.complete:
            run._fabric = fabric        # (perfetto._fabric_cut)
    finally:
        run._scans.pop("_collect", None)
        run._scans.pop(islands.FABRIC, None)
        run._scans.pop(islands.HOPS_FILE, None)
        run._scans.pop(utilwindows.WANT, None)
        run._scans.pop(utilwindows.SUMS, None)


def _materialize(run: Any, views: tuple[str, ...], twins: bool) -> None:
    cores = os.cpu_count() or 1
    for v in views:
        safe = v in PARALLEL_SAFE      # sorted on any machine: same rows, same order
        twin: Any = TWINS.get(v) if twins else None
        if twin is not None and (v in SHARED or v == WINDOWED):   # one scan of the hops
            twin = functools.partial(twin, shared=run._scans)   # for these (and the islands)
        par = safe and cores > 1 and not run.sandbox and twin is None   # (locked: 1 thread)
        t0 = time.perf_counter()
        try:
            if par:
                run.con.execute(f"SET threads TO {cores}")
            src = f"_m_{v}"
            if v == WINDOWED:
                src = _windows(run, twin)
            elif twin is not None:    # its rows, computed in numpy, already in that order
                src = _load_twin(run, v, twin)
            else:
                run.con.execute(f"CREATE OR REPLACE TEMP TABLE _m_{v} AS SELECT * FROM {v}"
                                + (" ORDER BY ALL" if safe else ""))
            run.con.execute(f"CREATE OR REPLACE VIEW {v} AS SELECT * FROM {src}")
            release_cache(run.con)      # the memory DuckDB kept from computing it
            if twin is not None:
                release_memory()    # the twin's numpy and Arrow buffers, before the next view
            _log.debug(f"{run.path.name}: view {v} materialised in "
                       f"{time.perf_counter() - t0:.2f} s"
                       + (f" on {cores} threads" if par else "")
                       + (" (numpy twin)" if twin is not None else ""))
        except duckdb.Error as exc:
            raise run.error(exc, f"materialising view {v!r} failed") from exc
        finally:
            if par:
                run.con.execute("SET threads TO 1")


def _load_twin(run: Any, view: str, twin: Any) -> str:
    """A numpy twin's rows (``islands.TWINS``) in a Parquet file in the spill directory
    (``open_run``'s), or without one in the temporary table ``_m_<view>``: what to read."""
    if run._spill_dir is None:
        run.con.register("_twin_rows", islands.plain(pa.concat_tables(list(twin(run.con)))))
        run.con.execute(f"CREATE OR REPLACE TEMP TABLE _m_{view} AS SELECT * FROM _twin_rows")
        run.con.unregister("_twin_rows")
        return f"_m_{view}"
    run._n_twin += 1      # a new file each time: the view may still read the last one
    path = run._spill_dir / f"twin-{view}-{run._n_twin}.parquet"
    writer = None
    try:
        for part in twin(run.con):
            if writer is None:      # dictionaries for the strings only: the doubles'
                writer = pq.ParquetWriter(  # cost time to try (islands: 0.4 s of 1.0)
                    path, part.schema, compression="none",
                    use_dictionary=dictionary_columns(part.schema))
            # row groups of a bounded size: a query over the file decodes one at a time
            writer.write_table(part, row_group_size=TWIN_ROW_GROUP)
            del part        # (not held while the twin makes the next one)
    finally:
        if writer is not None:
            writer.close()
    return f"read_parquet({_q(str(path))})"


def _n_windows(con: duckdb.DuckDBPyConnection) -> int:
    return int(con.sql("SELECT n_windows FROM _config").fetchall()[0][0])


def _windows(run: Any, twin: Any) -> str:
    """``utilisation_windows`` for the current window count, computed once per count (by
    its numpy ``twin`` if there is one): the table holding it."""
    n = _n_windows(run.con)
    table = f"_m_{WINDOWED}_{n}"
    if n not in run._windows:       # the view is its SQL now (set_windows keeps it so)
        if twin is not None:
            run.con.register("_twin_rows", pa.concat_tables(list(twin(run.con))))
            run.con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT * FROM _twin_rows")
            run.con.unregister("_twin_rows")
        else:
            run.con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT * FROM {WINDOWED}")
        run._windows[n] = table
    return table


def set_windows(run: Any, n: int) -> None:
    """``Run.set_windows(n)``: the window count, and ``utilisation_windows`` pointed at its
    materialisation for ``n`` if there is one, else at its SQL (never at another count's)."""
    if n < 1:
        raise AnalysisError(f"n_windows must be >= 1, got {n}")
    run.con.execute(f"CREATE OR REPLACE TABLE _config AS SELECT {int(n)} AS n_windows")
    if not run._windows:
        return
    if n in run._windows:
        run.con.execute(f"CREATE OR REPLACE VIEW {WINDOWED} AS SELECT * FROM {run._windows[n]}")
    else:
        run.con.execute(next(d.sql for d in view_docs() if d.name == WINDOWED))
