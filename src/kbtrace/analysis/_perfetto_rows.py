"""The timeline's two whole-run queries over ops, computed in numpy over a single run's
``op_timing`` and ``ops`` read as they are (plain scans: no sort, no join; ``perfetto._stream``,
``perfetto._flows``; issue 22, target 3).

- ``op_rows``: ``op_timing``'s rows for the op slices in ``perfetto.OPS_QUERY``'s order (engine, start,
  end descending, op_id). DuckDB's ``ORDER BY`` of the 11 columns held +150-210 MiB at a
  million ops (the sorted rows with their strings); here the sort keys are ranked and
  ``np.lexsort``-ed (an 8 MB permutation), the columns read once (~64 B per op, strings as
  dictionary indices) and each batch taken from them.
- ``cross_engine_deps``: the count of ``perfetto.DEPS_QUERY``'s rows (each (dep, op_id) of
  ``ops.deps`` where both ops ran, on different engines) and its first rows by (dep, op_id).
  DuckDB's two hash joins over a million ops' engine strings held +110 MiB; here an engine
  code per op_id (4 B per op) is looked up for each batch of ``ops.deps``.

The same rows in the same order as the SQL (tests/test_perfetto_rows.py checks both against
it): strings compared as DuckDB's binary collation does (code points), doubles as its sort
keys do (NaN above every number, -0.0 equal to 0.0; NULL engines compare to nothing).
``None`` where that does not hold (a run set, a sandboxed run, NULL sort keys or repeated
op ids): the caller then runs the SQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbtrace.analysis._memory import release_cache

__all__ = ["op_rows", "cross_engine_deps", "OP_COLUMNS"]

#: the op slices' columns, in the order of ``perfetto``'s query
OP_COLUMNS = ["op_id", "launch", "program", "seq", "kind", "name", "engine", "t_start_ns",
              "t_end_ns", "queue_ns", "nbytes"]
_STRINGS = ("kind", "name", "engine")


def _own_files(run: Any) -> bool:
    """A single run read from its own files (the views are its Parquet files as they are)."""
    return len(run.run_dirs) == 1 and run.path == run.run_dirs[0] and not run.sandbox


class _Columns:
    """Columns of a view (``op_timing``, read as it is: no sort, no join) taken a batch at a
    time from DuckDB into numpy arrays: numbers as they are, strings as codes into one list
    of distinct values (-1 for NULL), so the peak is the arrays plus one batch. (pyarrow's
    own Parquet reader kept ~20-30 MiB more resident after the timeline than DuckDB's.)"""

    def __init__(self, run: Any, view: str, columns: list[str], strings: tuple[str, ...],
                 batch: int = 1 << 16) -> None:
        n = int(run.con.sql(f"SELECT count(*) FROM {view}").fetchall()[0][0])
        reader = _reader(run, f"SELECT {', '.join(columns)} FROM {view}", batch)
        types = {fld.name: fld.type for fld in reader.schema}
        self.values: dict[str, list[str]] = {c: [] for c in columns if c in strings}
        self.nulls = 0
        self.cols: dict[str, np.ndarray] = {
            c: np.empty(n, np.int32 if c in strings else types[c].to_pandas_dtype())
            for c in columns}
        index: dict[str, dict[str, int]] = {c: {} for c in self.values}
        at = 0
        for b in reader:
            m = b.num_rows
            for name, col in zip(b.schema.names, b.columns, strict=True):
                self.nulls += col.null_count
                if name in index:
                    codes, vals = _codes(col)
                    lut = np.array([index[name].setdefault(v, len(index[name])) for v in vals]
                                   + [-1], np.int32)
                    self.cols[name][at:at + m] = lut[codes]
                else:
                    self.cols[name][at:at + m] = col.to_numpy(zero_copy_only=False)
            at += m
        release_cache(run.con)
        for c, ix in index.items():
            self.values[c] = list(ix)

    def strings(self, name: str, idx: np.ndarray) -> pa.Array:
        """Column ``name``'s strings at rows ``idx``."""
        codes = self.cols[name][idx]
        return pa.DictionaryArray.from_arrays(
            pa.array(codes, mask=codes < 0), pa.array(self.values[name], pa.string())
        ).cast(pa.string())


def _reader(run: Any, query: str, batch: int) -> Any:
    """``query``'s rows as an Arrow batch reader (a DuckDB error raised as the run names it)."""
    import duckdb
    try:
        return run.con.sql(query).to_arrow_reader(batch)
    except duckdb.Error as exc:
        raise run.error(exc) from exc


def _codes(col: pa.Array) -> tuple[np.ndarray, list[str]]:
    """Indices (the last value's index + 1 for NULLs: -1 after the lookup) and distinct values
    of a dictionary or string column."""
    d = col.dictionary_decode() if pa.types.is_dictionary(col.type) else col
    enc = pc.dictionary_encode(d)
    vals = enc.dictionary.to_pylist()
    return enc.indices.fill_null(len(vals)).to_numpy(), vals


def _string_rank(values: list[str]) -> np.ndarray:
    """Each value's rank in code-point order (DuckDB's binary collation of UTF-8)."""
    rank = np.empty(len(values), np.int64)
    rank[sorted(range(len(values)), key=values.__getitem__)] = np.arange(len(values))
    return rank


def op_rows(run: Any, rows: int) -> Iterator[pa.RecordBatch] | None:
    """``op_timing``'s op-slice columns (``OP_COLUMNS``; kind, name and engine as strings) by
    engine, t_start_ns, t_end_ns descending, op_id, in batches of ``rows``; None when the
    SQL must do it (see the module docstring)."""
    if not _own_files(run):
        return None
    t = _Columns(run, "op_timing", OP_COLUMNS, _STRINGS)
    if t.nulls:
        return None
    c = t.cols
    op_id = c["op_id"]
    if len(op_id) > 1 and not (np.diff(op_id) > 0).all() and \
            len(np.unique(op_id)) != len(op_id):
        return None         # a repeated op id: the SQL's order among its rows is its own
    # doubles as DuckDB sorts them: -0.0 == 0.0 (as numpy compares), NaN above every number
    # (last ascending, as numpy sorts; first descending, so a key of its own)
    end = c["t_end_ns"]
    keys = [op_id, -end, c["t_start_ns"], _string_rank(t.values["engine"])[c["engine"]]]
    if np.isnan(end).any():
        keys.insert(2, ~np.isnan(end))
    order = np.lexsort(keys)
    del keys
    return _batches(t, order, rows)


def _batches(t: _Columns, order: np.ndarray, rows: int) -> Iterator[pa.RecordBatch]:
    for i in range(0, len(order), rows):
        idx = order[i:i + rows]
        yield pa.RecordBatch.from_arrays(
            [t.strings(c, idx) if c in _STRINGS else pa.array(t.cols[c][idx])
             for c in OP_COLUMNS], OP_COLUMNS)


def _engines(run: Any) -> np.ndarray | None:
    """Per op_id, a code of the engine that ran it (equal codes, equal engines); -1 for op
    ids without an ``op_timing`` row or with a NULL engine. None for repeated op ids."""
    t = _Columns(run, "op_timing", ["op_id", "engine"], ("engine",))
    op_id, code = t.cols["op_id"], t.cols["engine"]
    if len(op_id) > 1 and not (np.diff(op_id) > 0).all() and \
            len(np.unique(op_id)) != len(op_id):
        return None
    eng = np.full(int(op_id.max()) + 1 if len(op_id) else 0, -1, np.int32)
    keep = op_id >= 0
    eng[op_id[keep]] = code[keep]
    return eng


def cross_engine_deps(run: Any, limit: int,
                      batch: int = 1 << 16) -> tuple[int, np.ndarray, np.ndarray] | None:
    """The number of (dep, op_id) pairs of ``ops.deps`` whose two ops both have an
    ``op_timing`` row, on different engines, and the first ``limit`` of them by (dep, op_id)
    (two arrays); None when the SQL must do it (see the module docstring)."""
    if not _own_files(run):
        return None
    eng = _engines(run)
    if eng is None:
        return None
    if run.trace_dir is None:       # no trace: the ops view is empty
        return 0, np.empty(0, np.int64), np.empty(0, np.int64)
    n = 0
    first_dep, first_op = np.empty(0, np.int64), np.empty(0, np.int64)
    for b in _reader(run, "SELECT op_id, deps FROM ops", batch):
        lists = b.column(1)
        dep = lists.flatten()
        op = b.column(0).to_numpy()[pc.list_parent_indices(lists).to_numpy()]
        ok = dep.is_valid().to_numpy(zero_copy_only=False)
        dep = dep.fill_null(-1).to_numpy()
        ok &= (dep >= 0) & (dep < len(eng)) & (op >= 0) & (op < len(eng))
        dep, op = dep[ok], op[ok]
        a, c = eng[dep], eng[op]
        cross = (a >= 0) & (c >= 0) & (a != c)
        dep, op = dep[cross], op[cross]
        n += len(dep)
        if limit > 0 and len(dep):
            dep, op = np.concatenate([first_dep, dep]), np.concatenate([first_op, op])
            keep = np.lexsort((op, dep))[:limit]
            first_dep, first_op = dep[keep], op[keep]
    release_cache(run.con)
    return n, first_dep, first_op
