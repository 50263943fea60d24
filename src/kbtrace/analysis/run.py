"""Open a run (or a directory of runs) as a DuckDB connection with the SQL library loaded.

``open_run(path)`` checks every Parquet file's schema version, creates the base views
``ops``, ``op_timing``, ``hops``, ``nodes``, ``links`` and ``runs`` over the files
(nothing is copied into memory), then the documented views of ``analysis/sql``.
A directory holding several run directories opens as a run set: ``op_timing``,
``hops`` and ``runs`` then span every run and carry a ``run_id`` column.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kbtrace import schema
from kbtrace.analysis.sqllib import load_views
from kbtrace.errors import AnalysisError

__all__ = ["Run", "open_run", "find_trace_dir", "recorded_trace_path", "read_run_json",
           "flat_info", "DEFAULT_WINDOWS"]

DEFAULT_WINDOWS = 20
# views the report reads more than once, each costly on large runs (helpers first)
MATERIALIZE = ("_pe_segments", "_busy_islands", "utilisation", "_crit_pred", "critical_path")
# of those, the ones whose rows are exact whatever the evaluation order (min / max, integer
# sums, windows over a total order; checked equal at 1 and 2 threads on 3.8M hops): they are
# computed on every core and sorted (ORDER BY ALL), so what reads them sees the same rows in
# the same order as single-threaded. Float sums (utilisation, critical_path) stay on one.
PARALLEL_SAFE = frozenset({"_pe_segments", "_busy_islands", "_crit_pred"})
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RUN_FILES = {"op_timing": schema.OP_TIMING, "hops": schema.HOPS,
              "nodes": schema.NODES, "links": schema.LINKS}


def _q(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def read_run_json(run_dir: Path) -> dict[str, Any]:
    p = run_dir / "run.json"
    if not p.is_file():
        raise AnalysisError(f"{run_dir}: not a run directory (no run.json); "
                            "pass the directory written by `kbtrace replay`")
    info = json.loads(p.read_text())
    schema.check_version(info.get("schema_version"), str(p))
    return info


def recorded_trace_path(info: dict[str, Any]) -> str | None:
    """The trace path a run.json records (``trace.path``; ``trace_dir`` in older runs)."""
    return info.get("trace_dir") or (info.get("trace") or {}).get("path")


def find_trace_dir(run_dir: Path, info: dict[str, Any]) -> Path | None:
    """The trace a run was replayed from: run.json ``trace.path`` (absolute; or relative to the
    run or the cwd, as older runs recorded it), else ``trace.path_from_run`` (relative to the
    run directory, so a moved ``data/`` tree still finds its traces)."""
    if (run_dir / "ops.parquet").is_file():
        return run_dir
    td = recorded_trace_path(info)
    cands = [Path(td), run_dir / td, Path.cwd() / td] if td else []
    from_run = (info.get("trace") or {}).get("path_from_run")
    if from_run:    # the run and its trace moved together (a copied data/ tree)
        cands.append(run_dir / from_run)
    for cand in cands:
        if (cand / "ops.parquet").is_file():
            return cand.resolve()
    return None


def _checked(path: Path, expected: pa.Schema) -> Path:
    if not path.is_file():
        raise AnalysisError(f"{path}: missing; re-run `kbtrace replay` to regenerate the run")
    schema.check_schema(pq.read_schema(path), expected, str(path))
    return path


class Run:
    """A replayed run opened for analysis: ``run.sql(q)`` / ``run.pl(view)`` return polars frames.

    Attributes: ``path`` (run dir), ``info`` (run.json), ``trace_dir`` (or None),
    ``con`` (the DuckDB connection; use it directly for relations).
    """

    def __init__(self, path: Path, info: dict[str, Any], trace_dir: Path | None,
                 con: duckdb.DuckDBPyConnection, run_dirs: tuple[Path, ...]) -> None:
        self.path = path
        self.info = info
        self.trace_dir = trace_dir
        self.con = con
        self.run_dirs = run_dirs

    # -- queries
    def sql(self, query: str) -> pl.DataFrame:
        """Run SQL over the views; return a polars DataFrame."""
        try:
            return self.con.sql(query).pl()
        except duckdb.Error as exc:
            raise AnalysisError(f"SQL failed: {str(exc).splitlines()[0]}") from exc

    def arrow(self, query: str) -> pa.Table:
        try:
            return self.con.sql(query).to_arrow_table()
        except duckdb.Error as exc:
            raise AnalysisError(f"SQL failed: {str(exc).splitlines()[0]}") from exc

    def pl(self, view: str) -> pl.DataFrame:
        """A whole view (``run.pl("hops")``) as a polars DataFrame."""
        if not _IDENT.match(view):
            raise AnalysisError(f"{view!r} is not a view name; use run.sql() for queries")
        return self.sql(f"SELECT * FROM {view}")

    def views(self) -> list[str]:
        rows = self.con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal "
                            "ORDER BY view_name").fetchall()
        return [r[0] for r in rows]

    def materialize(self, views: tuple[str, ...] = MATERIALIZE) -> None:
        """Compute ``views`` once and keep them as temporary tables, so later queries read the
        result instead of re-running the view (each view of the SQL library is re-evaluated
        by every query that uses it; on a run with a million hops ``utilisation`` or
        ``_pe_segments`` take seconds). In order: a view materialised first speeds up those
        after it. The views keep their names; the run's files do not change.

        ``PARALLEL_SAFE`` views use every core (the connection otherwise runs on one, so
        float sums and row orders are reproducible): 20 -> 12 s on 3.8M hops, 2 cores."""
        cores = os.cpu_count() or 1
        for v in views:
            if not _IDENT.match(v):
                raise AnalysisError(f"{v!r} is not a view name")
            safe = v in PARALLEL_SAFE      # sorted on any machine: same rows, same order
            par = safe and cores > 1
            try:
                if par:
                    self.con.execute(f"SET threads TO {cores}")
                self.con.execute(f"CREATE OR REPLACE TEMP TABLE _m_{v} AS SELECT * FROM {v}"
                                 + (" ORDER BY ALL" if safe else ""))
                self.con.execute(f"CREATE OR REPLACE VIEW {v} AS SELECT * FROM _m_{v}")
            except duckdb.Error as exc:
                raise AnalysisError(f"materialising view {v!r} failed: "
                                    f"{str(exc).splitlines()[0]}") from exc
            finally:
                if par:
                    self.con.execute("SET threads TO 1")

    def set_windows(self, n: int) -> None:
        """Number of equal windows used by ``utilisation_windows``."""
        if n < 1:
            raise AnalysisError(f"n_windows must be >= 1, got {n}")
        self.con.execute(f"CREATE OR REPLACE TABLE _config AS SELECT {int(n)} AS n_windows")

    @property
    def makespan_ns(self) -> float:
        v = (self.con.sql("SELECT makespan_ns FROM _span").fetchall() or [None])[0]
        return float(v[0]) if v and v[0] is not None else 0.0

    @property
    def name(self) -> str:
        return self.path.name

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, makespan_ns={self.info.get('makespan_ns')})"


def flat_info(info: dict[str, Any]) -> dict[str, Any]:
    """run.json normalised to flat keys (trace_hash, topology, topology_hash, workload)."""
    out = dict(info)
    tr, topo = info.get("trace"), info.get("topology")
    if isinstance(tr, dict):
        out.setdefault("trace_hash", tr.get("hash"))
        out.setdefault("trace_dir", tr.get("path"))
        out.setdefault("workload", tr.get("workload"))
    if isinstance(topo, dict):
        out["topology"] = topo.get("name")
        out.setdefault("topology_hash", topo.get("hash"))
        out.setdefault("topology_path", topo.get("path"))
    return out


def _runs_table(root: Path, dirs: list[Path], infos: list[dict[str, Any]]) -> pa.Table:
    """One row per run; ``name`` is the run's directory relative to ``root`` (a sweep point's
    partition path, e.g. ``trace=gemm/topology=small/fidelity=fast/cube.hbm.pc_bw_gbps=16``)."""
    infos = [flat_info(i) for i in infos]
    keys = ("run_id", "workload", "trace_hash", "topology", "topology_hash", "fidelity", "makespan_ns",
            "events", "ops", "hops", "wall_s", "schema_version", "kbtrace_version")
    names = [d.relative_to(root).as_posix() if d != root else d.name for d in dirs]
    cols: dict[str, list[Any]] = {"run_dir": [str(d) for d in dirs], "name": names}
    for k in keys:
        vals = [i.get(k) for i in infos]
        cols[k] = [None if v is None else (float(v) if k in ("makespan_ns", "wall_s") else
                                           int(v) if k in ("events", "ops", "hops") else str(v))
                   for v in vals]
    cols["options_json"] = [json.dumps(i.get("options", {}), sort_keys=True) for i in infos]
    return pa.table(cols)


#: run.json "peaks" keys kept in _run_meta (NULL for runs written before they were recorded)
PEAKS = ("gemm_gflops_per_pe", "math_gops_per_pe", "hbm_gbps_per_pe", "pes")


def _run_meta_sql(info: dict[str, Any], multi: bool) -> str:
    """``_run_meta``: one row, the run's makespan and machine peaks (NULL for a run set)."""
    peaks = info.get("peaks") or {}
    vals = {"makespan_ns": info.get("makespan_ns"), **{k: peaks.get(k) for k in PEAKS}}
    cols = ", ".join(f"CAST({'NULL' if v is None or multi else repr(float(v))} AS DOUBLE) AS {k}"
                     for k, v in vals.items())
    return f"CREATE TABLE _run_meta AS SELECT {cols}"


def open_run(path: str | os.PathLike[str], *, n_windows: int = DEFAULT_WINDOWS) -> Run:
    """Open a run directory (or a directory of run directories) for SQL/polars analysis.

    >>> run = open_run("data/runs/gemm")                       # doctest: +SKIP
    >>> run.sql("SELECT * FROM hotspots ORDER BY rank LIMIT 5")  # doctest: +SKIP
    """
    root = Path(path)
    if not root.is_dir():
        raise AnalysisError(f"{root}: no such run directory; pass a directory written by "
                            "`kbtrace replay` (it holds run.json)")
    if (root / "run.json").is_file():
        dirs = [root]
    else:
        # a sweep or a folder of runs: every run.json below (hive-partitioned sweeps nest);
        # a sweep's runs in point order, others by path
        dirs = sorted(p.parent for p in root.rglob("run.json"))
        points = root / "points.parquet"
        if points.is_file():
            order = {d: i for i, d in enumerate(pq.read_table(points, columns=["run_dir"])
                                                .column("run_dir").to_pylist())}
            dirs.sort(key=lambda d: (order.get(d.relative_to(root).as_posix(), len(order)), d))
        if not dirs:
            raise AnalysisError(f"{root}: neither a run directory (no run.json) nor a "
                                "directory of runs; pass a directory written by `kbtrace replay`")
    infos = [read_run_json(d) for d in dirs]
    con = duckdb.connect()
    con.execute("SET threads TO 1")  # deterministic row order inside views, small runs
    con.execute("SET enable_progress_bar = false")   # no progress bars on stderr mid-report
    multi = len(dirs) > 1 or root != dirs[0]
    for table, sch in _RUN_FILES.items():
        files = [_checked(d / f"{table}.parquet", sch) for d in dirs]
        if table in ("nodes", "links"):  # one topology per view: the first run's
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({_q(files[0])})")
        elif multi:   # run_name: the run's directory relative to root (sweep: its partitions)
            lst = "[" + ", ".join(_q(f) for f in files) + "]"
            cut = len(str(root).rstrip("/")) + 2
            con.execute(
                f"CREATE VIEW {table} AS SELECT * EXCLUDE (filename), "
                f"regexp_replace(substr(filename, {cut}), '/[^/]+$', '') AS run_name "
                f"FROM read_parquet({lst}, filename=true)")
        else:
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({_q(files[0])})")
    trace_dir = find_trace_dir(dirs[0], infos[0])
    if trace_dir is not None:
        ops = _checked(trace_dir / "ops.parquet", schema.OPS)
        con.execute(f"CREATE VIEW ops AS SELECT * FROM read_parquet({_q(ops)})")
    else:
        con.register("_ops_empty", schema.OPS.empty_table())
        con.execute("CREATE VIEW ops AS SELECT * FROM _ops_empty")
    con.register("_runs_arrow", _runs_table(root, dirs, infos))
    if multi and (root / "points.parquet").is_file():    # a sweep: its points table too
        con.execute(f"CREATE VIEW points AS SELECT * FROM read_parquet({_q(root / 'points.parquet')})")
    con.execute("CREATE VIEW runs AS SELECT * FROM _runs_arrow")
    con.execute(f"CREATE TABLE _config AS SELECT {int(n_windows)} AS n_windows")
    con.execute(_run_meta_sql(infos[0], multi))
    if not multi:
        load_views(con)
    return Run(root, infos[0], trace_dir, con, tuple(dirs))
