"""The critical path walked in numpy: the materialised twin of ``critical_path``.

``analysis/sql/critical_path.sql`` stays the definition; ``Run.materialize`` computes the
view's rows here instead (single runs) and keeps them in the same order (in a file of the
run's spill directory, read in file order), so the queries over it (the headline's and the
report's sums of ``contrib_ns``) add the same rows in the same order. The walk is the view's: from the op that ends last (ties: the lowest op_id)
to its ``_crit_pred`` predecessor, and so on while there is one. The rows are the view's
projection of each walked op, computed on the same doubles (``t_end_ns - t_from_ns``,
``greatest(0.0, t_start_ns - t_from_ns)``), in the order the view's plan gives them at one
thread: ``op_timing``'s row order (DuckDB probes the walk with ``op_timing``, read in file
order) over the materialised ``_crit_pred`` (``critical_path_parts`` takes the view's rows
when it is not), then the ``completion`` row. ``tests/test_islands.py`` checks the rows equal
the view's on real runs.

Why: DuckDB walks the path as a recursive CTE, one join per step; gemm at a million ops has
a path of 185,181 ops: ~1.0 CPU s. Here the walk is a Python loop over list indices.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from kbtrace.analysis.critpred import column_np as _np

__all__ = ["critical_path", "critical_path_parts", "pred_kept"]

_OPS = ("SELECT op_id, sip, cube, pe, CAST(kind AS VARCHAR) AS kind, CAST(name AS VARCHAR) "
        "AS name, CAST(engine AS VARCHAR) AS engine, t_start_ns, t_end_ns FROM op_timing")


def critical_path(con: Any) -> pa.Table:
    """The rows of ``critical_path``, in the view's order."""
    ids = _np(con.sql("SELECT op_id FROM op_timing").to_arrow_table(), "op_id")
    pred = con.sql("SELECT op_id, pred_op_id, edge, pred_end_ns FROM _crit_pred").to_arrow_table()
    first = con.sql("SELECT op_id FROM op_timing ORDER BY t_end_ns DESC, op_id LIMIT 1"
                    ).fetchall()
    makespan, last_end = con.sql("SELECT makespan_ns, t_last_end_ns FROM _span").fetchall()[0]
    # the walk: each op's predecessor by op_id (a row per op with one), followed from the
    # first op until an op has none
    p_op, p_pred = _np(pred, "op_id"), _np(pred, "pred_op_id")
    order = np.argsort(p_op, kind="stable")
    p_op_s = p_op[order]
    walk: list[int] = []
    rows: list[int] = []            # each walked op's pred row (-1: none)
    if first:
        # the pred row of each op (by position in p_op_s), and of each row's predecessor
        j = np.minimum(np.searchsorted(p_op_s, p_pred[order]), max(len(p_op_s) - 1, 0))
        nxt = np.where(p_op_s[j] == p_pred[order], j, -1) if len(j) else j
        del j
        op = int(first[0][0])
        i = int(np.searchsorted(p_op_s, op))
        k = i if i < len(p_op_s) and p_op_s[i] == op else -1
        for _ in range(len(p_op) + 1):      # (a path never revisits an op)
            walk.append(op)
            rows.append(int(order[k]) if k >= 0 else -1)
            if k < 0:
                break
            op = int(p_pred[rows[-1]])
            k = int(nxt[k])
        del nxt, p_op_s
    # the walked ops in op_timing's order (inner join: ops not there are dropped)
    w_ops = np.array(walk, np.int64)
    w_order = np.argsort(w_ops, kind="stable")
    w_sorted = w_ops[w_order]
    ix = np.minimum(np.searchsorted(w_sorted, ids), max(len(w_sorted) - 1, 0))
    at = np.flatnonzero(w_sorted[ix] == ids) if len(w_sorted) else np.zeros(0, np.int64)
    t = _walked(con, ids[at])
    depth = w_order[ix[at]].astype(np.int64)     # (a walked op's depth is its place)
    prow = np.array(rows, np.int64)[depth] if len(depth) else np.zeros(0, np.int64)
    has = prow >= 0
    pr = np.where(has, prow, 0)
    edges = pred.column("edge").take(pa.array(pr, pa.int64())).to_pylist() if len(pred) else []
    edge = pa.array([e if h else "start" for e, h in zip(edges or ["start"] * len(pr),
                                                         has.tolist(), strict=True)],
                    pa.string())
    p_end = _np(pred, "pred_end_ns").astype(np.float64)
    t_from = np.where(has, p_end[pr] if len(pred) else 0.0, 0.0)
    t_start, t_end = _np(t, "t_start_ns"), _np(t, "t_end_ns")
    steps = (int(depth.max()) - depth) if len(depth) else depth
    out = pa.table({
        "step": pa.array(steps, pa.int64()), "op_id": pa.array(ids[at], pa.int64()),
        "sip": t.column("sip"), "cube": t.column("cube"), "pe": t.column("pe"),
        "kind": t.column("kind"), "name": t.column("name"), "engine": t.column("engine"),
        "edge": edge,
        "pred_op_id": pa.array(p_pred[pr] if len(pred) else np.zeros(len(pr), np.int64),
                               pa.int64(), mask=~has),
        "t_from_ns": pa.array(t_from, pa.float64()), "t_start_ns": t.column("t_start_ns"),
        "t_end_ns": t.column("t_end_ns"),
        "wait_ns": pa.array(np.maximum(0.0, t_start - t_from), pa.float64()),
        "contrib_ns": pa.array(t_end - t_from, pa.float64())})
    if makespan is not None and last_end is not None and makespan > last_end:
        done = pa.table({
            "step": pa.array([len(walk)], pa.int64()), "op_id": pa.nulls(1, pa.int64()),
            "sip": pa.nulls(1, pa.int16()), "cube": pa.nulls(1, pa.int16()),
            "pe": pa.nulls(1, pa.int16()), "kind": ["launch"], "name": ["completion"],
            "engine": pa.nulls(1, pa.string()), "edge": ["completion"],
            "pred_op_id": pa.array([walk[0] if walk else None], pa.int64()),
            "t_from_ns": [last_end], "t_start_ns": [last_end], "t_end_ns": [makespan],
            "wait_ns": [0.0], "contrib_ns": [makespan - last_end]})
        out = pa.concat_tables([out, done.cast(out.schema)])
    return out


def _walked(con: Any, ops: np.ndarray) -> pa.Table:
    """The ``op_timing`` rows (``_OPS``) of ``ops``, which are in its order: a semi join
    read in that order, else (checked) every row taken."""
    con.register("_cp_walk", pa.table({"op_id": pa.array(ops, pa.int64())}))
    try:
        t = con.sql(f"SELECT * FROM ({_OPS}) SEMI JOIN _cp_walk USING (op_id)").to_arrow_table()
    finally:
        con.unregister("_cp_walk")
    if not np.array_equal(_np(t, "op_id"), ops):
        t = con.sql(_OPS).to_arrow_table()
        got = _np(t, "op_id")
        t = t.take(pa.array(np.flatnonzero(np.isin(got, ops))))
    return t


def critical_path_parts(con: Any) -> Iterator[pa.Table]:
    """``critical_path`` as one table (the twins' interface), when ``_crit_pred`` is
    materialised (the order above is the view's over its rows); else the view's rows."""
    yield (critical_path(con) if pred_kept(con)
           else con.sql("SELECT * FROM critical_path").to_arrow_table())


def pred_kept(con: Any) -> bool:
    """Whether ``_crit_pred`` is materialised (``analysis._materialize``): the view reads its
    table ``_m__crit_pred`` or its twin's file ``twin-_crit_pred-<n>.parquet``."""
    got = con.sql("SELECT sql FROM duckdb_views() WHERE view_name = '_crit_pred'").fetchall()
    sql = got[0][0] if got else ""
    return "_m__crit_pred" in sql or "twin-_crit_pred-" in sql
