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
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kbtrace import schema
from kbtrace._integrity import check_digests, check_trace_files
from kbtrace._io import json_type, read_json_object, trace_hash
from kbtrace._paths import resolve
from kbtrace.analysis import _materialize
from kbtrace.analysis._materialize import IDENT as _IDENT
from kbtrace.analysis._materialize import MATERIALIZE, PARALLEL_SAFE
from kbtrace.analysis._memory import limit_memory
from kbtrace.analysis._reproduce import recorded_trace_path, reproduce_commands
from kbtrace.analysis.sqllib import load_views
from kbtrace.errors import AnalysisError, KbtraceError, SchemaError, UsageError

__all__ = ["Run", "open_run", "find_trace_dir", "recorded_trace_path", "read_run_json",
           "run_trace_dir", "check_trace_hash", "read_parquet_schema",
           "corrupt_parquet", "flat_info", "reproduce_commands", "DEFAULT_WINDOWS", "REPLAY_FIX",
           "MATERIALIZE", "PARALLEL_SAFE"]

DEFAULT_WINDOWS = 20
_RUN_FILES = {"op_timing": schema.OP_TIMING, "hops": schema.HOPS,
              "nodes": schema.NODES, "links": schema.LINKS}


def _q(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


#: how to regenerate a run directory's own files (run.json, op_timing/hops/nodes/links)
REPLAY_FIX = "re-run `kbtrace replay` to regenerate the run"


def _reason(exc: BaseException) -> str:
    """The first sentence of an Arrow / DuckDB error (they run on for several lines)."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return line.split(". ")[0].rstrip(".")


def corrupt_parquet(path: Path, exc: BaseException, fix: str) -> SchemaError:
    """The one-line error for a Parquet file that cannot be read."""
    return SchemaError(f"{path}: corrupt or truncated Parquet file ({_reason(exc)}); {fix}")


def read_parquet_schema(path: Path, fix: str) -> pa.Schema:
    """``pq.read_schema``; a corrupt or truncated file is a ``SchemaError`` naming it."""
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise corrupt_parquet(path, exc, fix) from None


def _scan(path: Path) -> BaseException | None:
    """Decode every page of a Parquet file, one batch at a time; the error, if any."""
    try:
        for _ in pq.ParquetFile(path).iter_batches(batch_size=1 << 16):
            pass
    except (pa.ArrowException, OSError) as exc:
        return exc
    return None


# DuckDB errors a damaged file can raise mid-query (user SQL mistakes are Parser, Binder,
# Catalog, Conversion, ... exceptions): only these lead to a scan of the run's files
_READ_ERRORS = (duckdb.IOException, duckdb.InvalidInputException, duckdb.SerializationException,
                duckdb.InternalException)


def read_run_json(run_dir: Path) -> dict[str, Any]:
    p = run_dir / "run.json"
    if not p.is_file():
        raise AnalysisError(f"{run_dir}: not a run directory (no run.json); "
                            "pass the directory written by `kbtrace replay`")
    info = read_json_object(p, REPLAY_FIX)
    schema.check_version(info.get("schema_version"), str(p))
    _check_run_info(info, p)
    check_digests(run_dir, info.get("files"), p, REPLAY_FIX)
    if info.get("files"):       # recorded counts: a consistent edit still cannot drop rows
        for name, key in (("op_timing.parquet", "ops"), ("hops.parquet", "hops")):
            want = info.get(key)
            f = run_dir / name
            if isinstance(want, int) and f.is_file() and (
                    got := read_parquet_rows(f, REPLAY_FIX)) != want:
                raise SchemaError(f"{f}: {got} rows, run.json records {key} = {want}; "
                                  f"{REPLAY_FIX}")
    return info


def read_parquet_rows(path: Path, fix: str) -> int:
    """The row count in a Parquet file's footer; a corrupt file is a ``SchemaError``."""
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise corrupt_parquet(path, exc, fix) from None


_NUM, _STR, _OBJ = (int, float), (str,), (dict,)
#: run.json keys analysis reads -> accepted types (None is accepted too: older runs lack some)
_RUN_KEYS: dict[str, tuple[type, ...]] = {
    "makespan_ns": _NUM, "wall_s": _NUM, "events": _NUM, "ops": _NUM, "hops": _NUM,
    "run_id": _STR, "fidelity": _STR, "trace_dir": _STR, "trace_hash": _STR,
    "trace": _OBJ, "topology": (str, dict), "options": _OBJ, "peaks": _OBJ, "files": _OBJ,
    "trace.path": _STR, "trace.path_from_run": _STR, "trace.hash": _STR, "trace.workload": _STR,
    "topology.path": _STR, "topology.name": _STR, "topology.hash": _STR,
    "topology.overrides": _OBJ, "trace.workload_file": _STR, "trace.topology_path": _STR,
    "overrides": _OBJ, "overrides.params": _OBJ, "overrides.topology": _OBJ,
    "overrides.capture_topology": _OBJ,
}


_WANT: dict[tuple[type, ...], str] = {_NUM: "a number", _STR: "a string", _OBJ: "an object"}


def _check_run_info(info: dict[str, Any], path: Path) -> None:
    """The run.json fields analysis reads have the types replay writes (a hand-edited or
    damaged file fails here, naming the field, not later with a TypeError)."""
    for key, types in _RUN_KEYS.items():
        parent, _, leaf = key.rpartition(".")
        holder = info.get(parent) if parent else info
        if not isinstance(holder, dict):
            continue
        v = holder.get(leaf)
        if v is not None and (not isinstance(v, types) or isinstance(v, bool)):
            want = _WANT.get(types, "a string or an object")
            raise SchemaError(f"{path}: corrupt: {key} is a JSON {json_type(v)}, expected "
                              f"{want}; {REPLAY_FIX}")
    bad = [k for k, v in (info.get("peaks") or {}).items()
           if v is not None and (not isinstance(v, _NUM) or isinstance(v, bool))]
    if bad:
        raise SchemaError(f"{path}: corrupt: peaks.{bad[0]} is not a number; {REPLAY_FIX}")


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
        try:
            if (cand / "ops.parquet").is_file():
                return cand.resolve()
        except (OSError, ValueError):     # a recorded path the OS rejects (NUL, too long)
            continue
    return None


def _trace_hash(trace_dir: Path) -> str:
    """``_io.trace_hash`` of ``trace_dir``, as replay recorded it in run.json ``trace.hash``
    (reads trace.json only: cheap on any trace); unreadable files are ``SchemaError``s."""
    fix = "re-capture the trace"
    mj = trace_dir / "trace.json"
    meta = read_json_object(mj, fix) if mj.is_file() else {}
    try:
        return trace_hash(meta, trace_dir)
    except OSError as exc:
        raise SchemaError(f"{trace_dir / 'ops.parquet'}: unreadable ({exc}); {fix}") from None


def check_trace_hash(run_dir: Path, info: dict[str, Any], trace_dir: Path) -> None:
    """Refuse a trace that is not the one the run was replayed from (re-captured, or another
    trace now at the recorded path): every join of run and trace would silently lose rows.
    Runs that recorded no ``trace.hash`` (older runs, duck-typed traces) are not checked."""
    tr = info.get("trace")
    want = tr.get("hash") if isinstance(tr, dict) else None
    if not want or not recorded_trace_path(info):
        return
    got = _trace_hash(trace_dir)
    if got != want:
        replay_cmd, capture_cmd = reproduce_commands(run_dir, info, trace_dir)
        again = (f"re-capture the original trace with `{capture_cmd}`, then" if capture_cmd
                 else "re-capture the original trace, then")
        raise SchemaError(f"{run_dir / 'run.json'}: the trace at {trace_dir} changed since this "
                          f"run was replayed (hash {got}, run has {want}); to reproduce the run, "
                          f"{again} `{replay_cmd}`; to time the trace as it is now, run only "
                          "the replay")


def run_trace_dir(run_dir: Path, info: dict[str, Any]) -> Path | None:
    """``find_trace_dir``, then ``check_trace_hash``: the trace the run was replayed from,
    None when it cannot be found; a ``SchemaError`` when it changed since the replay."""
    trace_dir = find_trace_dir(run_dir, info)
    if trace_dir is not None:
        check_trace_hash(run_dir, info, trace_dir)
    return trace_dir


def _checked(path: Path, expected: pa.Schema, fix: str = REPLAY_FIX) -> Path:
    if not path.is_file():
        raise AnalysisError(f"{path}: missing; {fix}")
    schema.check_schema(read_parquet_schema(path, fix), expected, str(path))
    return path


def _create_view(con: duckdb.DuckDBPyConnection, sql: str, files: list[Path], fix: str) -> None:
    """``CREATE VIEW`` over Parquet files; DuckDB reads their footers here, so a file that
    pyarrow accepted but DuckDB cannot read fails with its name, not a DuckDB traceback."""
    try:
        con.execute(sql)
    except duckdb.Error as exc:
        bad = next((f for f in files if _scan(f) is not None), files[0])
        raise corrupt_parquet(bad, exc, fix) from None


class Run:
    """A replayed run opened for analysis: ``run.sql(q)`` / ``run.pl(view)`` return polars frames.

    Attributes: ``path`` (run dir), ``info`` (run.json), ``trace_dir`` (or None),
    ``con`` (the DuckDB connection; use it directly for relations).
    """

    def __init__(self, path: Path, info: dict[str, Any], trace_dir: Path | None,
                 con: duckdb.DuckDBPyConnection, run_dirs: tuple[Path, ...],
                 sandbox: bool = False, spill_dir: Path | None = None) -> None:
        self.path = path
        self.sandbox = sandbox          # configuration locked (open_run(sandbox=True))
        self.info = info
        self.trace_dir = trace_dir
        self.con = con
        self.run_dirs = run_dirs
        self._spill_dir: Path | None = None
        self._spill_cleanup: weakref.finalize | None = None
        if spill_dir is not None:
            self.own_spill(spill_dir)
        self._n_twin = 0                  # twin files written (analysis._materialize)
        self._windows: dict[int, str] = {}   # window count -> utilisation_windows table
        self._scans: dict[str, Any] = {}     # a twin's scan left for another (islands)
        self._fabric: Any = None    # the timeline's fabric cut, if the twins' scan counted it

    # -- queries
    def error(self, exc: Exception, what: str = "SQL failed") -> KbtraceError:
        """The error to raise for a DuckDB failure: when it may come from a damaged file
        (I/O, invalid input, ...), the run's Parquet files are decoded to name the corrupt
        one (a ``SchemaError``: re-run replay / re-capture); else ``AnalysisError(what)``."""
        if type(exc) is duckdb.Error or isinstance(exc, (*_READ_ERRORS, pa.ArrowException)):
            files = [(d / f"{t}.parquet", REPLAY_FIX) for d in self.run_dirs for t in _RUN_FILES]
            if self.trace_dir is not None:
                files.append((self.trace_dir / "ops.parquet", "re-capture the trace"))
            for path, fix in files:
                bad = _scan(path) if path.is_file() else None
                if bad is not None:
                    return corrupt_parquet(path, bad, fix)
        return AnalysisError(f"{what}: {str(exc).splitlines()[0] if str(exc) else exc!r}")

    def _relation(self, query: str) -> duckdb.DuckDBPyRelation | None:
        if not query.strip():
            raise UsageError("the SQL query is empty; pass SQL text, a saved query name "
                             "(e.g. top_hotspots) or a .sql file")
        try:
            return self.con.sql(query)
        except duckdb.Error as exc:
            raise self.error(exc) from exc

    def sql(self, query: str) -> pl.DataFrame:
        """Run SQL over the views; return a polars DataFrame (empty for a statement that
        returns no rows, e.g. ``CREATE VIEW``)."""
        rel = self._relation(query)
        try:
            return pl.DataFrame() if rel is None else rel.pl()
        except duckdb.Error as exc:
            raise self.error(exc) from exc

    def arrow(self, query: str) -> pa.Table:
        rel = self._relation(query)
        try:
            return pa.table({}) if rel is None else rel.to_arrow_table()
        except duckdb.Error as exc:
            raise self.error(exc) from exc

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
        """Compute ``views`` once and keep them (``analysis._materialize``), so later queries
        read the result instead of re-running the view (each view of the SQL library is
        re-evaluated by every query that uses it; on a run with a million hops
        ``utilisation`` or ``_pe_segments`` take seconds). In order: a view materialised
        first speeds up those after it. The views keep their names; the run's files do not
        change.

        ``PARALLEL_SAFE`` views use every core (the connection otherwise runs on one, so
        float sums and row orders are reproducible): 20 -> 12 s on 3.8M hops, 2 cores. Of a
        single run, ``_busy_islands`` and ``_pe_segments`` are computed by their numpy twins
        (``analysis.islands``: the same rows in the same order, 3-4x faster) and kept in
        files; ``utilisation_windows`` is kept per window count (``set_windows``)."""
        _materialize.materialize(self, views)

    def set_windows(self, n: int) -> None:
        """Number of equal windows used by ``utilisation_windows``."""
        _materialize.set_windows(self, n)

    @property
    def makespan_ns(self) -> float:
        rows = self.con.sql("SELECT makespan_ns FROM _span").fetchall()
        return float(rows[0][0]) if rows and rows[0][0] is not None else 0.0

    @property
    def name(self) -> str:
        return self.path.name

    def own_spill(self, spill_dir: Path) -> None:
        """Make ``spill_dir`` (DuckDB's temp directory, the twins' files) this run's: removed
        by ``close``, or when the run is garbage-collected or the interpreter exits, so a run
        opened without ``with`` or ``close`` (a notebook's ``run = open_run(...)``) leaves no
        directory behind in the system's temp folder."""
        self._spill_dir = spill_dir
        self._spill_cleanup = weakref.finalize(self, shutil.rmtree, spill_dir, True)

    def close(self) -> None:
        for parts in self._scans.values():
            parts.close()
        self._scans.clear()
        self.con.close()
        if self._spill_cleanup is not None:
            self._spill_cleanup()

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


def _points_run_dirs(points: Path) -> list[str]:
    """A sweep's ``points.parquet`` ``run_dir`` column (each point's directory, in order)."""
    fix = "re-run `kbtrace sweep` to regenerate it"
    read_parquet_schema(points, fix)
    try:
        return pq.read_table(points, columns=["run_dir"]).column("run_dir").to_pylist()
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise SchemaError(f"{points}: corrupt or not a sweep points table "
                          f"({str(exc).splitlines()[0]}); {fix}") from None


def open_run(path: str | os.PathLike[str], *, n_windows: int = DEFAULT_WINDOWS,
             trace: bool = True, sandbox: bool = False) -> Run:
    """Open a run directory (or a directory of run directories) for SQL/polars analysis.

    The run's trace (its ``ops`` view) must be the one it was replayed from (run.json
    ``trace.hash``; a ``SchemaError`` otherwise). ``trace=False`` does not look for it:
    ``ops`` is then empty, for callers that read only the run's own files (``summarize``).

    ``sandbox=True`` is for SQL a person did not write (a query from a pull request in CI):
    the views read the files through Arrow datasets opened here, then DuckDB's external
    access is switched off and its configuration locked, so a query can read the views and
    nothing else: no file read or written (``read_csv``, ``COPY ... TO``, ``EXPORT``), no
    ``ATTACH``, ``INSTALL`` or ``LOAD``, no ``SET`` undoing it. ``diff`` and ``baseline``
    open runs this way.

    ``path`` resolves as the CLI's run arguments do (``kbtrace._paths``): a path, else a
    name in ``data/runs/``, ``data/sweeps/`` or ``data/baselines/`` under the current
    directory or the repository (a ``UsageError`` listing the names there otherwise).

    >>> run = open_run("gemm-small-fast")                      # doctest: +SKIP
    >>> run.sql("SELECT * FROM hotspots ORDER BY rank LIMIT 5")  # doctest: +SKIP
    """
    root = Path(path) if Path(path).exists() else resolve(path, "run")
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
            order = {d: i for i, d in enumerate(_points_run_dirs(points))}
            dirs.sort(key=lambda d: (order.get(d.relative_to(root).as_posix(), len(order)), d))
        if not dirs:
            raise AnalysisError(f"{root}: neither a run directory (no run.json) nor a "
                                "directory of runs; pass a directory written by `kbtrace replay`")
    infos = [read_run_json(d) for d in dirs]
    con = duckdb.connect()
    spill = Path(tempfile.mkdtemp(prefix="kbtrace-duckdb-"))
    try:
        limit_memory(con, spill)
        run = _open(root, dirs, infos, con, n_windows, trace, _Scans(con, sandbox))
        run.own_spill(spill)
        return run
    except BaseException:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
        raise


class _Scans:
    """FROM expressions over Parquet files: ``read_parquet`` (DuckDB opens the files), or in
    sandbox mode Arrow datasets registered on the connection (DuckDB needs no file access,
    so it can be switched off once the views exist)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, sandbox: bool) -> None:
        self.con, self.sandbox, self.n = con, sandbox, 0

    def one(self, f: Path, fix: str) -> str:
        if not self.sandbox:
            return f"read_parquet({_q(f)})"
        import pyarrow.dataset as ds
        name = f"_scan{self.n}"
        self.n += 1
        try:
            self.con.register(name, ds.dataset(str(f), format="parquet"))
        except (pa.ArrowException, OSError) as exc:
            raise corrupt_parquet(f, exc, fix) from None
        return name

    def many(self, files: list[Path], root: Path, fix: str) -> str:
        """All ``files`` with a ``run_name`` column: each one's directory relative to root."""
        if not self.sandbox:
            lst = "[" + ", ".join(_q(f) for f in files) + "]"
            cut = len(str(root).rstrip("/")) + 2
            return (f"(SELECT * EXCLUDE (filename), regexp_replace(substr(filename, {cut}), "
                    f"'/[^/]+$', '') AS run_name FROM read_parquet({lst}, filename=true))")
        return "(" + " UNION ALL ".join(
            f"SELECT *, {_q(Path(f.parent.relative_to(root).as_posix()))} AS run_name "
            f"FROM {self.one(f, fix)}" for f in files) + ")"

    def lock(self) -> None:
        if self.sandbox:
            self.con.execute("SET enable_external_access = false")
            self.con.execute("SET lock_configuration = true")


def _no_progress_bar(con: duckdb.DuckDBPyConnection) -> None:
    """No DuckDB progress bars on stderr mid-report. Under Jupyter without ipywidgets DuckDB
    has them off already and *refuses* the setting (InvalidInputException: "required package
    'ipywidgets' is missing"): set it only when it is on."""
    on = con.sql("SELECT current_setting('enable_progress_bar')").fetchall()
    if on and on[0][0]:
        con.execute("SET enable_progress_bar = false")




def _open(root: Path, dirs: list[Path], infos: list[dict[str, Any]],
          con: duckdb.DuckDBPyConnection, n_windows: int, trace: bool, scans: _Scans) -> Run:
    """Create the views of ``open_run`` on ``con``."""
    con.execute("SET threads TO 1")  # deterministic row order inside views, small runs
    _no_progress_bar(con)
    multi = len(dirs) > 1 or root != dirs[0]
    for table, sch in _RUN_FILES.items():
        files = [_checked(d / f"{table}.parquet", sch) for d in dirs]
        if table in ("nodes", "links"):  # one topology per view: the first run's
            _create_view(con, f"CREATE VIEW {table} AS SELECT * FROM "
                         f"{scans.one(files[0], REPLAY_FIX)}", files[:1], REPLAY_FIX)
        elif multi:   # run_name: the run's directory relative to root (sweep: its partitions)
            _create_view(con, f"CREATE VIEW {table} AS SELECT * FROM "
                         f"{scans.many(files, root, REPLAY_FIX)}", files, REPLAY_FIX)
        else:
            _create_view(con, f"CREATE VIEW {table} AS SELECT * FROM "
                         f"{scans.one(files[0], REPLAY_FIX)}", files, REPLAY_FIX)
    trace_dir = run_trace_dir(dirs[0], infos[0]) if trace else None
    if trace_dir is not None:
        check_trace_files(trace_dir, ("ops.parquet",))
        fix = "re-capture the trace"
        ops = _checked(trace_dir / "ops.parquet", schema.OPS, fix)
        _create_view(con, f"CREATE VIEW ops AS SELECT * FROM {scans.one(ops, fix)}", [ops], fix)
    else:
        con.register("_ops_empty", schema.OPS.empty_table())
        con.execute("CREATE VIEW ops AS SELECT * FROM _ops_empty")
    con.register("_runs_arrow", _runs_table(root, dirs, infos))
    if multi and (root / "points.parquet").is_file():    # a sweep: its points table too
        pts = root / "points.parquet"
        fix = "re-run `kbtrace sweep` to regenerate it"
        _create_view(con, f"CREATE VIEW points AS SELECT * FROM {scans.one(pts, fix)}", [pts],
                     fix)
    con.execute("CREATE VIEW runs AS SELECT * FROM _runs_arrow")
    con.execute(f"CREATE TABLE _config AS SELECT {int(n_windows)} AS n_windows")
    con.execute(_run_meta_sql(infos[0], multi))
    if not multi:
        load_views(con)
    scans.lock()
    return Run(root, infos[0], trace_dir, con, tuple(dirs), sandbox=scans.sandbox)
