"""The critical path's predecessors in numpy: the materialised twin of ``_crit_pred``.

``analysis/sql/_crit_pred.sql`` stays the definition (what a query over an unmaterialised
run or a run set evaluates); ``Run.materialize`` computes the view's rows here instead, for
a single run, in the same rows in the same (``ORDER BY ALL``) order, kept in a file of the
run's spill directory (``analysis._materialize``), which ``critical_path`` reads. The
rows are the same because nothing here adds floats in an order of its own: each candidate
predecessor and the choice among them are comparisons of the run's doubles, and the one
sum (an HBM or link wait's end, ``t_enter_ns + queue_ns``, plus 1e-9) is the SQL's, per
row. ``tests/test_islands.py`` checks the rows equal the SQL's on real runs.

Why: DuckDB evaluates the view as a DISTINCT of the leaves of every resource someone queued
on, two windows over them, an ASOF join, a union of ~3 candidates per op, two joins with
``op_timing`` and an ``arg_min`` per op; at a million gemm ops (29.4 M hops, 4.3 M leaves
on the 130 queued-on resources) 9.5 CPU s and DuckDB spilled ~1.4 GB under its 512 MB
budget. Here DuckDB reads only the hops of the queued-on resources (one scan, after a
scan of ``queue_ns`` that Parquet statistics mostly skip); the leaves are sorted once in
numpy and the windows are running maxima over that order; the candidates are chosen by
one ``lexsort``: 2.9 CPU s, peak +410 MiB over where it started.

Then (``Collect``): the hops are dealt by resource as they arrive (``islands.Parts``, past a
batch spilled to an unnamed file) and the resources taken a few at a time, so only one
chunk's leaves are sorted at once; and when ``Run.materialize`` computes the island twins in
the same call, their scan of ``_hop_ctx`` (the same hops when every hop has exactly one op in
``op_timing``, which ``Collect.done`` checks) hands them over, so this reads no hop itself:
1.3 CPU s, peak +230 MiB (2026-11-26, the same rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbtrace.analysis import islands

__all__ = ["crit_pred", "crit_pred_parts", "Collect", "EDGES", "STREAM_ROWS", "column_np"]

#: hop rows taken from DuckDB at a time
STREAM_ROWS = 1 << 18
#: the candidates' edges, by priority on equal predecessor ends (as the SQL's ``prio``)
EDGES = ("ipcq", "dep", "resource", "program")
_IPCQ, _DEP, _RESOURCE, _PROGRAM = range(4)


def column_np(t: pa.Table, name: str, dtype: Any = None) -> np.ndarray:
    """Column ``name`` of ``t`` as one numpy array (as ``dtype`` when given)."""
    col = t.column(name)
    a = (col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)).to_numpy(
        zero_copy_only=False)
    return a if dtype is None else a.astype(dtype, copy=False)


def crit_pred(con: Any) -> pa.Table:
    """The rows of ``_crit_pred`` (op_id, pred_op_id, edge, pred_end_ns), by op_id."""
    return pa.concat_tables(crit_pred_parts(con))


def crit_pred_parts(con: Any, shared: dict[str, Any] | None = None) -> Iterator[pa.Table]:
    """``crit_pred`` as one table (the twins' interface: tables, one here). ``shared``: where
    the island twins' scan may have left the resources' hops (``Collect``)."""
    ot = con.sql("SELECT op_id, t_end_ns, launch, program, seq FROM op_timing").to_arrow_table()
    ids = column_np(ot, "op_id", np.int64)
    o = np.argsort(ids, kind="stable")
    ids_s, t_end_s = ids[o], column_np(ot, "t_end_ns", np.float64)[o]
    del o
    # each candidate as (op, predecessor) positions in op_timing by op_id (both ends must
    # be there: the SQL's joins), so a position order is the op_id order
    pos = np.int32 if len(ids_s) < 1 << 31 else np.int64
    xs, ps, prios = [], [], []
    for x, p, edge_prio in _candidates(con, ot, ids, shared):     # (one at a time)
        xi, x_ok = _lookup(ids_s, x)
        pi, p_ok = _lookup(ids_s, p)
        keep = x_ok & p_ok
        xs.append(xi[keep].astype(pos))
        ps.append(pi[keep].astype(pos))
        prios.append(np.full(len(xs[-1]), edge_prio, np.int8))
        del x, p, xi, pi, x_ok, p_ok, keep
    del ot
    xi = np.concatenate(xs)
    del xs
    pi = np.concatenate(ps)
    del ps
    prio = np.concatenate(prios)
    del prios
    tx, tp = t_end_s[xi], t_end_s[pi]
    keep = (tp < tx) | ((tp == tx) & (pi < xi))      # ends no later (ties: lower op_id)
    del tx
    xi, pi, prio, tp = xi[keep], pi[keep], prio[keep], tp[keep]
    del keep
    at, p_at, prio, tp = _latest(len(ids_s), xi, pi, prio, tp)
    x, p = ids_s[at], ids_s[p_at]
    edge = pa.DictionaryArray.from_arrays(pa.array(prio.astype(np.int32)),
                                          pa.array(EDGES)).cast(pa.string())
    yield pa.table({"op_id": pa.array(x, pa.int64()), "pred_op_id": pa.array(p, pa.int64()),
                    "edge": edge, "pred_end_ns": pa.array(tp, pa.float64())})


def _latest(n: int, xi: np.ndarray, pi: np.ndarray, prio: np.ndarray, tp: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Of each op (position ``xi`` < ``n``) with candidates, the one (predecessor position
    ``pi``, edge ``prio``, its end ``tp``, never NaN) ending latest, ties by edge priority,
    then position: (xi, pi, prio, tp) by xi. The first row of each op once sorted by ``xi``,
    ``-tp``, ``prio``, ``pi`` (``np.lexsort``, 0.8 CPU s at a million gemm ops), found
    instead by a running maximum and minimum per op (``ufunc.at``): rows that tie on all
    four keys are the same candidate (its end is its predecessor's)."""
    best = np.full(n, -np.inf)
    np.maximum.at(best, xi, tp)
    top = tp == best[xi]
    xi, pi, prio, tp = xi[top], pi[top], prio[top], tp[top]
    rank = (prio.astype(np.int64) << 32) | pi.astype(np.int64)
    low = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(low, xi, rank)
    win = rank == low[xi]
    xi, pi, prio, tp = xi[win], pi[win], prio[win], tp[win]
    has = np.zeros(n, bool)
    has[xi] = True
    p_of, prio_of, tp_of = np.zeros(n, pi.dtype), np.zeros(n, prio.dtype), np.zeros(n)
    p_of[xi], prio_of[xi], tp_of[xi] = pi, prio, tp
    at = np.flatnonzero(has)
    return at, p_of[at], prio_of[at], tp_of[at]


def _candidates(con: Any, ot: pa.Table, ids: np.ndarray, shared: dict[str, Any] | None
                ) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """The candidate (op ids, predecessor ids, edge) sets, one at a time."""
    yield _resource(con, shared)
    yield _program(ot, ids)
    yield from _trace(con)


def _lookup(ids_s: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``q`` in the sorted ids, and whether each is there (a join)."""
    if not len(ids_s):
        return np.zeros(len(q), np.int64), np.zeros(len(q), bool)
    if int(ids_s[-1]) - int(ids_s[0]) == len(ids_s) - 1:      # consecutive ids (replay's)
        i = q - ids_s[0]
        ok = (i >= 0) & (i < len(ids_s))
        return np.where(ok, i, 0), ok
    i = np.minimum(np.searchsorted(ids_s, q), len(ids_s) - 1)
    return i, ids_s[i] == q


def _program(ot: pa.Table, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The previous op of each op's program (``lag(op_id) OVER (PARTITION BY launch,
    program ORDER BY seq)``)."""
    launch, prog = column_np(ot, "launch", np.int64), column_np(ot, "program", np.int64)
    o = np.lexsort((column_np(ot, "seq", np.int64), prog, launch))
    launch, prog, s_ids = launch[o], prog[o], ids[o]
    same = (launch[1:] == launch[:-1]) & (prog[1:] == prog[:-1])
    return s_ids[1:][same], s_ids[:-1][same], _PROGRAM


def _trace(con: Any) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """The trace's candidates: each op's deps, and a recv's matching send."""
    deps = con.sql("SELECT op_id, deps FROM ops").to_arrow_table()
    lists = deps.column("deps").combine_chunks()
    vals = pc.list_flatten(lists)
    parent = pc.list_parent_indices(lists).to_numpy()
    ok = vals.is_valid().to_numpy(zero_copy_only=False)
    dep_x = column_np(deps, "op_id", np.int64)[parent[ok]]
    dep_p = vals.filter(pa.array(ok)).to_numpy(zero_copy_only=False).astype(np.int64)
    recv = con.sql("SELECT op_id, match_op_id FROM ops WHERE kind = 'recv' "
                   "AND match_op_id IS NOT NULL").to_arrow_table()
    return [(dep_x, dep_p, _DEP), (column_np(recv, "op_id", np.int64),
                                   column_np(recv, "match_op_id", np.int64), _IPCQ)]


_LEAF = np.dtype([("k", "<i8"), ("t", "<f8"), ("op", "<i8")])
_QUERY = np.dtype([("k", "<i8"), ("op", "<i8"), ("te", "<f8"), ("tf", "<f8")])


class Collect:
    """The hops ``_resource`` needs, dealt by resource (``islands.Parts``, spilled past a
    batch): every hop of a resource someone queued on (its leave time and op) and every
    hop that queued (op, entry, end of the wait). Fed by ``crit_pred_parts``' own scan of
    ``hops``, or by the island twins' scan of ``_hop_ctx`` (``Run.materialize`` puts this
    class in ``shared["_collect"]``), which holds the same rows when every hop has exactly
    one op in ``op_timing`` (``done`` checks; else its rows are dropped)."""

    def __init__(self, con: Any) -> None:
        self.con = con
        ri = con.sql(f"SELECT DISTINCT {islands.RESOURCE_KEY} AS k FROM hops "
                     "WHERE queue_ns > 0 ORDER BY k").to_arrow_table()
        self.keys = column_np(ri, "k", np.int64) if ri.num_rows else np.zeros(0, np.int64)
        base = islands._temp_base(con)
        self.leaves = islands.Parts(self.keys, 0, base, _LEAF)
        self.queries = islands.Parts(self.keys, 0, base, _QUERY)

    def add(self, key: np.ndarray, op: np.ndarray, t_enter: np.ndarray, t_leave: np.ndarray,
            queue: np.ndarray) -> None:
        """A batch of hops: resource key, op id, entry, leave, queueing."""
        if not len(self.keys):
            return
        i = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
        m = self.keys[i] == key
        self.leaves.add(key[m], t_leave[m], op[m])
        w = queue > 0
        self.queries.add(key[w], op[w], t_enter[w], t_enter[w] + queue[w])

    def done(self, rows: int | None = None) -> Collect | None:
        """Itself, fed; None (and closed) if ``rows`` (hops of ``_hop_ctx`` scanned) is not
        every hop, once each."""
        if rows is not None:
            n_hops, dup = self.con.sql(
                "SELECT (SELECT count(*) FROM hops), (SELECT count(*) - count(DISTINCT op_id) "
                "FROM op_timing)").fetchall()[0]
            if rows != n_hops or dup:
                self.close()
                return None
        return self

    def close(self) -> None:
        self.leaves.close()
        self.queries.close()


def _scan(con: Any) -> Collect:
    """``Collect`` fed by a scan of ``hops`` (the resources' hops only)."""
    c = Collect(con)
    if not len(c.keys):
        return c
    con.register("_crit_ri", pa.table({"k": c.keys}))
    try:
        reader = con.sql(
            f"SELECT k, op_id, t_enter_ns, t_leave_ns, queue_ns FROM (SELECT "
            f"{islands.RESOURCE_KEY} AS k, op_id, t_enter_ns, t_leave_ns, queue_ns FROM hops) "
            "SEMI JOIN _crit_ri USING (k)").to_arrow_reader(STREAM_ROWS)
        for b in reader:
            c.add(*(b.column(i).to_numpy() for i in range(5)))
            del b
        del reader
    except BaseException:
        c.close()
        raise
    finally:
        con.unregister("_crit_ri")
    return c


def _resource(con: Any, shared: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, np.ndarray, int]:
    """For each op's hops that queued: every other op leaving that resource last by the
    end of the wait (``t_enter_ns + queue_ns`` + 1e-9), the op's own consecutive leaves
    skipped (see ``_crit_pred.sql``). A few resources at a time (their hops from
    ``shared["_crit_pred"]`` if a scan left them there, else from ``_scan``)."""
    got = shared.pop("_crit_pred", None) if shared is not None else None
    c = cast(Collect, got) if got is not None else _scan(con)
    leaves, queries = c.leaves, c.queries
    xs, ps = [], []
    try:
        for p0, p1 in leaves.bounds(leaves.counts + queries.counts):
            q, lv = queries.read(p0, p1), leaves.read(p0, p1)
            if len(q[0]) and len(lv[0]):
                x, p = _chunk(q, lv)
                xs.append(x)
                ps.append(p)
            del q, lv
    finally:
        c.close()
    empty = np.zeros(0, np.int64)
    return (np.concatenate(xs) if xs else empty, np.concatenate(ps) if ps else empty,
            _RESOURCE)


def _chunk(q: tuple[np.ndarray, ...], lv: tuple[np.ndarray, ...]
           ) -> tuple[np.ndarray, np.ndarray]:
    """``_resource``'s candidates of the queries ``q`` and leaves ``lv`` of some resources
    (the columns of ``_QUERY``, ``_LEAF``, ``islands.Parts.read``: every one of theirs)."""
    q_ri, q_op, q_te, q_tf = q
    q_op, q_ri, q_free = _queued(q_op, q_ri, q_te, q_tf)
    l_ri, l_t, l_op = lv
    o = np.lexsort((l_op, l_t, l_ri))
    l_ri, l_t, l_op = l_ri[o], l_t[o], l_op[o]
    del o
    # leave_t: one group per resource and leave time (a leave listed twice changes
    # neither the group's sole op nor the candidates, which are only compared)
    g0 = np.flatnonzero(np.r_[True, (l_ri[1:] != l_ri[:-1]) | (l_t[1:] != l_t[:-1])]
                        ).astype(np.int32)
    x, p, _ = _released_by(q_op, q_ri, q_free, g0, l_ri[g0], l_t[g0], l_op)
    return x, p


def _queued(op: np.ndarray, ri: np.ndarray, t_enter: np.ndarray, t_end: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One query per op, resource and entry: ``max(t_enter_ns + queue_ns) + 1e-9``."""
    o = np.lexsort((t_end, t_enter, ri, op))
    op, ri, t_enter, t_end = op[o], ri[o], t_enter[o], t_end[o]
    last = np.r_[(op[1:] != op[:-1]) | (ri[1:] != ri[:-1]) | (t_enter[1:] != t_enter[:-1]),
                 True] if len(op) else np.zeros(0, bool)
    return op[last], ri[last], t_end[last] + 1e-9


def _released_by(q_op: np.ndarray, q_ri: np.ndarray, q_free: np.ndarray, g0: np.ndarray,
                 g_ri: np.ndarray, g_t: np.ndarray, l_op: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, int]:
    """The resource candidates, from the queries (op, resource, time free) and the leaves'
    ops ``l_op`` sorted by resource, time, op, in groups by resource and time (group
    ``i``: rows ``g0[i]`` up to the next group's, of resource ``g_ri[i]`` at ``g_t[i]``)."""
    ng = len(g0)
    g_end = np.r_[g0[1:], np.int32(len(l_op))].astype(np.int32)
    sole = l_op[g0]                             # its op if only one op left then
    has = sole == l_op[g_end - 1]
    # the latest leave time before the run of consecutive leave times of one op that
    # group i is in: the time before the latest run start j <= i of its resource
    ri_first = np.r_[True, g_ri[1:] != g_ri[:-1]]
    valid = ~ri_first
    valid[1:] &= ~(has[1:] & has[:-1] & (sole[1:] == sole[:-1]))
    ar = np.arange(ng, dtype=np.int32)
    last_start = np.maximum.accumulate(np.where(valid, ar, np.int32(-1)))
    del valid
    ri_start = np.maximum.accumulate(np.where(ri_first, ar, np.int32(0)))
    del ar, ri_first
    before = np.where(last_start >= ri_start, last_start - 1, np.int32(-1))
    del last_start, ri_start
    # ASOF: the last group of the query's resource leaving by its time free
    o = np.lexsort((q_free, q_ri))
    q_op, q_ri, q_free = q_op[o], q_ri[o], q_free[o]
    g = np.full(len(q_op), -1, np.int64)
    ri_u, q_a = np.unique(q_ri, return_index=True)
    q_b = np.r_[q_a[1:], len(q_ri)]
    lo = np.searchsorted(g_ri, ri_u, "left")
    hi = np.searchsorted(g_ri, ri_u, "right")
    for a, b, c, d in zip(q_a.tolist(), q_b.tolist(), lo.tolist(), hi.tolist(), strict=True):
        pos = c + np.searchsorted(g_t[c:d], q_free[a:b], "right") - 1
        g[a:b] = np.where(pos >= c, pos, -1)
    found = g >= 0
    q_op, g = q_op[found], g[found]
    # the op itself left last: the leave time before its run (none in the first run)
    own = has[g] & (sole[g] == q_op)
    tg = np.where(own, before[g], g)
    ok = tg >= 0
    q_op, tg = q_op[ok], tg[ok]
    # every op leaving at that time, but the op itself
    start = g0[tg].astype(np.int64)
    cnt = g_end[tg].astype(np.int64) - start
    x = np.repeat(q_op, cnt)
    row = np.repeat(start - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))
    p = l_op[row]
    other = p != x
    return x[other], p[other], _RESOURCE
