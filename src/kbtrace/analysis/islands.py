"""Interval islands in numpy: the materialised twins of the ``_busy_islands`` and
``_pe_segments`` views.

The SQL files (``analysis/sql/_busy_islands.sql``, ``_pe_segments.sql``) stay the definition:
what a query over an unmaterialised run or a run set evaluates. ``Run.materialize`` computes
these two views with the functions here instead (single runs): the same rows -- islands are
minima and maxima, stage masks integer sums, segment bounds the same ``greatest`` / ``least``
/ difference of the same doubles -- which ``tests/test_islands.py`` checks row for row on
real runs. Why: DuckDB evaluates an island view as two window passes (the running maximum of
the earlier ends, then a running count of island starts), each over its own sort of every
hop: ~1-2 us a hop, the largest part of ``kbtrace run``'s headline at a million ops. Here it
is one ``lexsort`` and a running maximum per resource (``np.maximum.accumulate``), and for the
stage segments one more sort of the island bounds: a cumulative sum over all PEs at once is
each PE's active-category mask, since every PE's bits add back to 0 at its last bound. Both
return their rows in ``ORDER BY ALL`` order (what materialising sorts the SQL's rows into).

Memory: the hops are not held. They arrive from DuckDB unsorted, ``STREAM_ROWS`` at a
time, and are dealt to ``PARTS`` parts by resource (by PE for the segments); past
``SORT_ROWS`` held, the parts go to files in the run's temporary directory. Consecutive
parts are then sorted in numpy ``SORT_ROWS`` or more rows at a time, each chunk holding
every hop of its resources (PEs), so its islands and segments are final. On gemm at 1.0 M
ops (29.4 M hops) holding them all in numpy peaked at 3.6 GiB; sorting them in DuckDB
instead (streamed in order, under the run's 1 GB budget) took 16.2 + 21.3 CPU s for the
two views, this 7.0-8.7 + 7.5-7.9 s with the same rows, the materialisation's peak RSS
1,302 -> 1,272 MiB (2026-11-26). Then taken 256 k rows at a time and sorted 512 k or more
(1 M and 2 M before): each view's peak on that run, materialised alone after ``open_run``
(~210 MiB), 618-628 / 694-728 -> 358-362 / 436-447 MiB, at no cost in CPU.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kbtrace import schema

__all__ = ["busy_islands", "pe_segments", "islands", "TWINS", "STREAM_ROWS", "SORT_ROWS",
           "PARTS"]

#: hop rows taken from DuckDB at a time
STREAM_ROWS = 1 << 18
#: rows held before they go to files, and sorted at a time (at least: whole parts)
SORT_ROWS = 1 << 19
#: the rows are dealt to this many parts, by key range (whole groups of keys each)
PARTS = 256

#: stages by priority (``schema.BREAKDOWN_STAGES``), the bit of each in the PE's active mask
#: (as ``_pe_segments.sql`` numbers them: gemm = 1 ... other = 256)
_STAGE_BITS = tuple((name, 1 << i) for i, name in enumerate(schema.BREAKDOWN_STAGES))
_BIT_SQL = ("CASE category " + " ".join(f"WHEN '{c}' THEN {b}" for c, b in _STAGE_BITS[:-1])
            + " ELSE 256 END")


def islands(key: np.ndarray, s: np.ndarray, e: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Union of the intervals ``[s, e]`` of each ``key``: (key, start, end) per island, by key
    then start. An interval starting after every earlier one (by start, then end) of its key
    ended opens an island; touching intervals join one (as ``s > prev_end`` in the SQL)."""
    if len(key) == 0:
        return key, s, e
    o = np.lexsort((e, s, key))
    return _islands_sorted(key[o], s[o], e[o])


def _islands_sorted(key: np.ndarray, s: np.ndarray, e: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``islands`` of intervals already sorted by key, then start."""
    if len(key) == 0:
        return key, s, e
    first = np.empty(len(key), dtype=bool)
    first[0] = True
    np.not_equal(key[1:], key[:-1], out=first[1:])
    bounds = np.flatnonzero(first).tolist() + [len(key)]
    run_end = np.empty_like(e)          # the latest end so far within the key
    for a, b in pairwise(bounds):
        np.maximum.accumulate(e[a:b], out=run_end[a:b])
    new = first
    new[1:] |= s[1:] > run_end[:-1]
    start = np.flatnonzero(new)
    last = np.r_[start[1:] - 1, len(key) - 1]
    return key[start], s[start], run_end[last]


def _strings(idx: np.ndarray, names: tuple[str, ...]) -> pa.Array:
    """``names[idx]`` as an Arrow string column (built in Arrow, not as Python strings)."""
    return pa.DictionaryArray.from_arrays(pa.array(idx.astype(np.int32)),
                                          pa.array(names)).cast(pa.string())


def _arrays(con: Any, sql: str) -> dict[str, np.ndarray]:
    t = con.sql(sql).to_arrow_table()
    return {n: t.column(n).to_numpy() for n in t.column_names}


def _temp_base(con: Any) -> str | None:
    """DuckDB's temporary directory (the run's, ``open_run``'s), where the sort files go;
    None for the system's."""
    got = con.sql("SELECT current_setting('temp_directory')").fetchall()
    base = got[0][0] if got and got[0][0] else None
    return base if base and os.path.isdir(base) else None


def _sorted_chunks(con: Any, sql: str, groups: np.ndarray, shift: int
                   ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, int, int]]:
    """The ``(key, s, e)`` rows of ``sql`` sorted by key, s, e, in chunks that each hold
    every row of their groups (``key >> shift``): (key, s, e, p0, p1) per chunk, which
    holds the parts ``[p0, p1)`` (``_part``). The rows are streamed from DuckDB unsorted,
    ``STREAM_ROWS`` at a time, and dealt to ``PARTS`` parts by group (ranges of
    ``groups``, the sorted distinct groups expected); past ``SORT_ROWS`` held, the parts
    go to files (Arrow IPC, uncompressed) in DuckDB's temporary directory. Then
    consecutive parts are read and sorted in numpy (``np.lexsort``) ``SORT_ROWS`` or
    more at a time. One sort of each row in numpy, no sort in DuckDB (there, under the
    run's 1 GB budget, the sort of 28 M hops spilled: 18.5 CPU s against 3 here)."""
    held: list[list[pa.RecordBatch]] = [[] for _ in range(PARTS)]
    files: list[Any] = []
    n_held, tmp, spilled, base = 0, Path(), False, _temp_base(con)
    con.execute(f"SET threads TO {os.cpu_count() or 1}")   # any row order: all is sorted
    try:
        reader = con.sql(f"SELECT key, s, e FROM ({sql})").to_arrow_reader(STREAM_ROWS)
        for batch in reader:
            if not batch.num_rows:
                continue
            p = _part(batch.column(0).to_numpy() >> shift, groups)
            o = np.argsort(p, kind="stable")
            cuts = np.searchsorted(p[o], np.arange(PARTS + 1))
            batch = batch.take(pa.array(o))
            for i in np.flatnonzero(np.diff(cuts)).tolist():
                piece = batch.slice(int(cuts[i]), int(cuts[i + 1] - cuts[i]))
                if files:
                    files[i].write_batch(piece)
                else:
                    held[i].append(piece)
            n_held += 0 if files else batch.num_rows
            if not files and n_held > SORT_ROWS:         # spill from now on
                tmp = Path(tempfile.mkdtemp(prefix="islands-", dir=base))
                files = [pa.ipc.new_stream(str(tmp / f"{i}.arrow"), batch.schema)
                         for i in range(PARTS)]
                for i, pieces in enumerate(held):
                    for piece in pieces:
                        files[i].write_batch(piece)
                held = [[] for _ in range(PARTS)]
        spilled = bool(files)
        while files:
            files.pop().close()
        del reader
        con.execute("SET threads TO 1")
        chunk: list[pa.RecordBatch] = []
        p0 = 0
        for i in range(PARTS):
            if spilled:
                with pa.OSFile(str(tmp / f"{i}.arrow")) as src:
                    chunk.extend(pa.ipc.open_stream(src).read_all().to_batches())
                os.unlink(tmp / f"{i}.arrow")
            else:
                chunk.extend(held[i])
                held[i] = []
            if sum(b.num_rows for b in chunk) >= SORT_ROWS or i == PARTS - 1:
                cols = [np.concatenate([b.column(j).to_numpy() for b in chunk]) if chunk
                        else np.empty(0, np.int64 if j == 0 else np.float64)
                        for j in range(3)]
                chunk, p0, p_from = [], i + 1, p0
                o = np.lexsort((cols[2], cols[1], cols[0]))
                cols = [c[o] for c in cols]     # (one copy at a time, the unsorted freed)
                del o
                yield cols[0], cols[1], cols[2], p_from, i + 1
                del cols
                pa.default_memory_pool().release_unused()   # the batches' buffers
    finally:
        con.execute("SET threads TO 1")
        for f in files:         # (an exception while spilling)
            f.close()
        if tmp != Path():
            shutil.rmtree(tmp, ignore_errors=True)


def _part(group: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """The part (0 .. ``PARTS`` - 1) of each group: by its rank among ``groups``, so each
    part holds about as many groups, and a larger group is never in an earlier part."""
    if not len(groups):
        return np.zeros(len(group), np.int64)
    rank = np.minimum(np.searchsorted(groups, group), len(groups) - 1)
    return rank * PARTS // len(groups)


def busy_islands(con: Any) -> pa.Table:
    """The rows of ``_busy_islands`` (resource_kind, resource_idx, t0_ns, t1_ns)."""
    return pa.concat_tables(busy_island_parts(con))


def busy_island_parts(con: Any) -> Iterator[pa.Table]:
    """``busy_islands`` a batch of rows at a time (at least one table, maybe empty)."""
    # link (0) < node (1); each chunk's islands go to Arrow at once (no numpy copy of all)
    res = np.unique(np.concatenate([
        _arrays(con, "SELECT CAST(link_idx AS BIGINT) AS k FROM links")["k"],
        _arrays(con, "SELECT CAST(node_idx AS BIGINT) | (CAST(1 AS BIGINT) << 32) AS k FROM nodes")["k"]]))
    for key, s, e, _, _ in _sorted_chunks(
        con, "SELECT (CAST(link_idx < 0 AS BIGINT) << 32) | CAST(CASE WHEN link_idx >= 0 "
             "THEN link_idx ELSE node_idx END AS BIGINT) AS key, t_busy_start_ns AS s, "
             "t_leave_ns AS e FROM _hop_ctx WHERE busy_ns > 0", res, 0):
        yield _busy_rows(*_islands_sorted(key, s, e))


def _busy_rows(k: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> pa.Table:
    return pa.table({"resource_kind": _strings(k >> 32, ("link", "node")),
                     "resource_idx": pa.array((k & 0xFFFFFFFF).astype(np.int32)),
                     "t0_ns": t0, "t1_ns": t1})


def _pe_key(c: dict[str, np.ndarray]) -> np.ndarray:
    return ((c["sip"].astype(np.int64) << 32) | (c["cube"].astype(np.int64) << 16)
            | c["pe"].astype(np.int64))


def pe_segments(con: Any) -> pa.Table:
    """The rows of ``_pe_segments`` (sip, cube, pe, t0_ns, t1_ns, dur_ns, stage, has_compute,
    has_comm): each PE's span cut where a category's island starts or ends."""
    return pa.concat_tables(pe_segment_parts(con))


def pe_segment_parts(con: Any) -> Iterator[pa.Table]:
    """``pe_segments`` a batch of rows at a time: the PEs' islands streamed (see the module
    docstring), a PE cut once all its islands are in."""
    pe_cols = "sip, cube, pe"
    not_null = "sip IS NOT NULL AND cube IS NOT NULL AND pe IS NOT NULL"
    sp = _arrays(con, f"SELECT {pe_cols}, t0_ns, t1_ns FROM _pe_span WHERE {not_null} "
                      f"ORDER BY {pe_cols}")
    span_k = _pe_key(sp)
    key = ("((CAST(sip AS BIGINT) << 32) | (CAST(cube AS BIGINT) << 16) | CAST(pe AS BIGINT)) "
           "<< 9 | bit")
    rows = (f"SELECT {key} AS key, s, e FROM ("
            f"SELECT sip, cube, pe, {_BIT_SQL} AS bit, t_enter_ns AS s, t_leave_ns AS e "
            f"FROM _hop_ctx WHERE {not_null} UNION ALL "
            f"SELECT sip, cube, pe, {dict(_STAGE_BITS)['hbm_queue']}, t_enter_ns, "
            f"t_enter_ns + queue_ns FROM _hop_ctx "
            f"WHERE {not_null} AND stage = 'hbm' AND queue_ns > 0 AND category <> 'other')")
    span_p = _part(span_k, span_k)
    for ck, cs, ce, p0, p1 in _sorted_chunks(con, rows, span_k, 9):
        k, a, b = _islands_sorted(ck, cs, ce)       # a chunk holds whole PEs, and their spans:
        j0, j1 = np.searchsorted(span_p, [p0, p1])  # those of the same parts
        yield _segments(k.astype(np.int64), a.astype(np.float64), b.astype(np.float64),
                        span_k[j0:j1], sp["t0_ns"][j0:j1], sp["t1_ns"][j0:j1])


def _segments(k: np.ndarray, s: np.ndarray, e: np.ndarray, span_k: np.ndarray,
              span_t0: np.ndarray, span_t1: np.ndarray) -> pa.Table:
    """The segments of the PEs whose islands (``k`` = PE key << 9 | bit, by key then start)
    and spans (``span_k``, ascending) are given: all of each PE's."""
    pk, b = k >> 9, k & 511
    # the island bounds and the spans' ends, as changes of each PE's active-category mask
    ev_k = np.concatenate([pk, pk, span_k, span_k])
    ev_t = np.concatenate([s, e, span_t0, span_t1])
    ev_d = np.concatenate([b, -b, np.zeros(2 * len(span_k), np.int64)])
    o = np.lexsort((ev_t, ev_k))
    ev_k, ev_t, ev_d = ev_k[o], ev_t[o], ev_d[o]
    if len(ev_k):
        first = np.r_[True, (ev_k[1:] != ev_k[:-1]) | (ev_t[1:] != ev_t[:-1])]
        at = np.flatnonzero(first)
        pt_k, pt_t, pt_d = ev_k[at], ev_t[at], np.add.reduceat(ev_d, at)
    else:
        pt_k, pt_t, pt_d = ev_k, ev_t, ev_d
    mask = np.cumsum(pt_d)          # each PE's bits add back to 0 at its last bound
    nxt = np.r_[pt_k[1:] == pt_k[:-1], False]       # lead(t) within the PE exists
    t1 = np.r_[pt_t[1:], 0.0]
    # clipped to the PE's span (the SQL's join: a PE without a span has no segments)
    i = np.minimum(np.searchsorted(span_k, pt_k), len(span_k) - 1)
    has_span = span_k[i] == pt_k if len(span_k) else np.zeros(len(pt_k), dtype=bool)
    a = np.maximum(pt_t, span_t0[i]) if len(span_k) else pt_t
    bb = np.minimum(t1, span_t1[i]) if len(span_k) else t1
    keep = nxt & has_span & (bb > a)
    pt_k, a, bb, mask = pt_k[keep], a[keep], bb[keep], mask[keep]
    stage = np.full(len(mask), len(_STAGE_BITS), dtype=np.int32)      # idle
    for j in range(len(_STAGE_BITS) - 1, -1, -1):   # the highest priority written last
        stage[(mask & _STAGE_BITS[j][1]) != 0] = j
    return pa.table({
        "sip": pa.array((pt_k >> 32).astype(np.int16)),
        "cube": pa.array(((pt_k >> 16) & 0xFFFF).astype(np.int16)),
        "pe": pa.array((pt_k & 0xFFFF).astype(np.int16)),
        "t0_ns": a, "t1_ns": bb, "dur_ns": bb - a,
        "stage": _strings(stage, tuple(n for n, _ in _STAGE_BITS) + ("idle",)),
        "has_compute": (mask & 15) != 0, "has_comm": (mask & 240) != 0})


#: view -> the function computing its rows a batch at a time (``Run.materialize``, single runs)
TWINS = {"_busy_islands": busy_island_parts, "_pe_segments": pe_segment_parts}
