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

Memory: the hops are not held. One scan of ``_hop_ctx`` (``_scan``) feeds both views: its
rows (``_hop_rows``: the hops joined to ``op_timing`` and categorised in numpy, not DuckDB's
join) arrive ``STREAM_ROWS`` at a time; each batch's busy intervals are
dealt to ``PARTS`` parts by resource, and its PE category intervals, ``premerge``d (a
transfer's hops follow one another and overlap: 29.4 M -> 2.7 M rows at a million gemm ops),
to parts by PE (``Parts``); past ``SORT_ROWS`` held, the batches go to an unnamed file in
the run's temporary directory. The view materialised second finds its rows left by the first
(``shared``: ``Run.materialize`` passes the run's). Consecutive parts are then sorted in
numpy ``SORT_ROWS`` or more rows at a time, each chunk holding every interval of its
resources (PEs), so its islands and segments are final. History (gemm at 1.0 M ops, 29.4 M
hops): holding every hop in numpy peaked at 3.6 GiB; sorting in DuckDB instead took 16.2 +
21.3 CPU s; a scan per view with the parts in Arrow IPC files 6.5-7.4 + 5.7-6.6 s; one scan
for both, the segments' rows premerged, ~5.3 + 1.8 s, the same rows (2026-11-26); the
scan's join in numpy, 7.1-9.3 -> 2.5-2.6 s of the 1.0 M-op run's scan (2026-11-27).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from itertools import pairwise
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbtrace import schema
from kbtrace.analysis import utilwindows

__all__ = ["busy_islands", "pe_segments", "islands", "premerge", "plain", "Parts", "TWINS",
           "STREAM_ROWS", "SORT_ROWS", "PARTS", "RESOURCE_KEY"]

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
    """``names[idx]`` as an Arrow dictionary column (``plain`` makes it strings): the twins'
    Parquet files take it as it is, as a dictionary page and the codes, where a string
    column was encoded again, each value hashed (gemm at 1.0 M ops: ~1 CPU s of the
    files' 2.2; DuckDB reads either as the same VARCHAR column)."""
    return pa.DictionaryArray.from_arrays(pa.array(idx.astype(np.int32)), pa.array(names))


def plain(t: pa.Table) -> pa.Table:
    """``t`` with its dictionary columns (a twin's strings) as the columns of their values:
    the view's rows as DuckDB gives them."""
    return t.cast(pa.schema([pa.field(f.name, f.type.value_type, f.nullable)
                             if pa.types.is_dictionary(f.type) else f for f in t.schema]))


def _arrays(con: Any, sql: str) -> dict[str, np.ndarray]:
    t = con.sql(sql).to_arrow_table()
    return {n: t.column(n).to_numpy() for n in t.column_names}


def _temp_base(con: Any) -> str | None:
    """DuckDB's temporary directory (the run's, ``open_run``'s), where the sort files go;
    None for the system's."""
    got = con.sql("SELECT current_setting('temp_directory')").fetchall()
    base = got[0][0] if got and got[0][0] else None
    return base if base and os.path.isdir(base) else None


def _part(group: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """The part (0 .. ``PARTS`` - 1) of each group: by its rank among ``groups``, so each
    part holds about as many groups, and a larger group is never in an earlier part."""
    dtype = np.uint8 if PARTS <= 256 else np.uint16     # (a stable sort of these is a radix)
    if not len(groups):
        return np.zeros(len(group), dtype)
    rank = np.minimum(np.searchsorted(groups, group), len(groups) - 1)
    return (rank * PARTS // len(groups)).astype(dtype)


def premerge(key: np.ndarray, s: np.ndarray, e: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Consecutive rows of one ``key`` whose closed intervals ``[s, e]`` overlap or touch, each
    run as one row ``[min s, max e]``: the same islands come out of ``islands`` (a run's
    union is connected, and the islands of a key are the connected pieces of its union; an
    interval with ``e < s`` or a NaN, which ``islands`` does not treat as a set, is left as
    it is and joins nothing). The hops of a transfer follow one another in the scan, head to
    tail, so a PE's category rows shrink ~11x (gemm at a million ops: 29.4 M -> 2.7 M)."""
    if len(key) < 2:
        return key, s, e
    ok = e >= s
    link = ((key[1:] == key[:-1]) & (s[1:] <= e[:-1]) & (s[:-1] <= e[1:])
            & ok[1:] & ok[:-1])
    start = np.flatnonzero(np.r_[True, ~link])
    if len(start) == len(key):
        return key, s, e
    return key[start], np.minimum.reduceat(s, start), np.maximum.reduceat(e, start)


_REC = np.dtype([("k", "<i8"), ("s", "<f8"), ("e", "<f8")])


class Parts:
    """Rows (``dtype``'s fields: a key, then other columns) dealt to ``PARTS`` parts by group
    (``key >> shift``, ranked among ``groups``, the sorted distinct groups expected), a batch
    at a time: each batch sorted by part (a radix sort of one byte) and kept as one
    contiguous array per column, with its part bounds; past ``SORT_ROWS`` held, the batches
    go to one unnamed temporary file (in ``base``, the run's spill directory; a batch's
    columns one after the other), which is gone when it is closed. Then ``read`` gives the
    columns of consecutive parts (``bounds``: ``SORT_ROWS`` rows or more at a time);
    ``chunks`` sorts them, for the islands. Columns, not records: every gather, write,
    read and sort is over contiguous arrays (gemm at a million ops, 28 M busy rows: the
    records' strided gathers and the copies out of them before each sort were ~1 CPU s)."""

    def __init__(self, groups: np.ndarray, shift: int, base: str | None,
                 dtype: np.dtype[Any] = _REC) -> None:
        self.groups, self.shift, self.base, self.dtype = groups, shift, base, dtype
        self.types = [dtype[n] for n in dtype.names or ()]     # (the columns')
        self.held: list[tuple[np.ndarray, ...] | None] = []   # a batch's columns, None once
        self.at: list[int] = []             # in the file, then its first byte's place there
        self.size: list[int] = []           # its rows
        self.cuts: list[np.ndarray] = []            # its part bounds
        self.counts = np.zeros(PARTS, np.int64)
        self.n_held = self.n_file = 0
        self.file: Any = None
        self.spans: dict[str, np.ndarray] = {}      # (the PEs' spans, for the segments)
        # keys hi << 32 | lo with few (hi, lo) (the resources'): each one's part in a table
        self.lut: np.ndarray | None = None
        if len(groups) and groups[0] >= 0 and shift == 0:
            hi_n, lo_n = int(groups[-1] >> 32) + 1, int((groups & 0xFFFFFFFF).max()) + 1
            if hi_n * lo_n <= 1 << 22:
                every = ((np.arange(hi_n, dtype=np.int64)[:, None] << 32)
                         | np.arange(lo_n, dtype=np.int64)[None, :]).ravel()
                self.lut, self.lo_n = _part(every, groups), lo_n

    def add(self, key: np.ndarray, *cols: np.ndarray) -> None:
        """A batch: the keys and the other columns, in ``dtype``'s order."""
        if not len(key):
            return
        p = None
        if self.lut is not None:
            at = (key >> 32) * self.lo_n + (key & 0xFFFFFFFF)
            if ((at >= 0).all() and (at < len(self.lut)).all()
                    and ((key & 0xFFFFFFFF) < self.lo_n).all()):
                p = self.lut[at]
        if p is None:
            p = _part(key >> self.shift, self.groups)
        o = np.argsort(p, kind="stable")
        batch = tuple(np.asarray(col, t)[o]
                      for col, t in zip((key, *cols), self.types, strict=True))
        n = np.bincount(p, minlength=PARTS)
        self.counts += n
        self.cuts.append(np.r_[0, np.cumsum(n)])
        self.held.append(batch)
        self.at.append(0)
        self.size.append(len(key))
        self.n_held += len(key)
        if self.file is None and self.n_held > SORT_ROWS:
            # closed by close() (chunks' end, Run.close), else with the object
            self.file = tempfile.TemporaryFile(dir=self.base)  # noqa: SIM115
        if self.file is not None:
            for i, r in enumerate(self.held):
                if r is not None:
                    self.held[i], self.at[i] = None, self.n_file
                    for col in r:
                        self.file.write(col.view(np.uint8))
                        self.n_file += col.nbytes
            self.n_held = 0

    def _read(self, i: int, a: int, b: int, out: list[np.ndarray], at_row: int) -> None:
        """Rows ``[a, b)`` of batch ``i`` into ``out``'s columns from row ``at_row`` on."""
        r = self.held[i]
        if r is not None:
            for col, dst in zip(r, out, strict=True):
                dst[at_row:at_row + b - a] = col[a:b]
            return
        at = self.at[i]
        for t, dst in zip(self.types, out, strict=True):
            self.file.seek(at + a * t.itemsize)
            self.file.readinto(dst[at_row:at_row + b - a].view(np.uint8))
            at += self.size[i] * t.itemsize

    def bounds(self, counts: np.ndarray | None = None) -> list[tuple[int, int]]:
        """Consecutive part ranges ``[p0, p1)`` of ``SORT_ROWS`` rows or more (``counts``:
        rows per part, by default this one's), the last one to ``PARTS``: at least one."""
        counts = self.counts if counts is None else counts
        out, p0, n = [], 0, 0
        for i in range(PARTS):
            n += int(counts[i])
            if n >= SORT_ROWS or i == PARTS - 1:
                out.append((p0, i + 1))
                p0, n = i + 1, 0
        return out

    def read(self, p0: int, p1: int) -> tuple[np.ndarray, ...]:
        """The columns (``dtype``'s fields, in order) of the rows of parts ``[p0, p1)``, in
        no particular order: each a contiguous array."""
        spans = [(j, int(c[p0]), int(c[p1])) for j, c in enumerate(self.cuts) if c[p1] > c[p0]]
        # each column allocated once and read into (not pieces joined: twice the rows held)
        out = [np.empty(sum(b - a for _, a, b in spans), t) for t in self.types]
        at_row = 0
        for j, a, b in spans:
            self._read(j, a, b, out, at_row)
            at_row += b - a
        return tuple(out)

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, int, int]]:
        """The rows (``_REC``) sorted by key, s, e, in chunks of whole parts: (key, s, e,
        p0, p1) per chunk, which holds the parts ``[p0, p1)``; at least one (maybe empty).
        The file is closed at the end."""
        try:
            for p0, p1 in self.bounds():
                key, s, e = self.read(p0, p1)
                o = np.lexsort((e, s, key))
                key = key[o]    # a column at a time: the unsorted one freed as it goes
                s = s[o]
                e = e[o]
                del o
                yield key, s, e, p0, p1
                del key, s, e
        finally:
            self.close()

    def close(self) -> None:
        self.held, self.cuts, self.size = [], [], []
        if self.file is not None:
            self.file.close()
            self.file = None


def _resource_keys(con: Any) -> np.ndarray:
    """Every resource as ``_busy_islands`` keys it (link 0 < node 1, << 32 | index), sorted."""
    return np.unique(np.concatenate([
        _arrays(con, "SELECT CAST(link_idx AS BIGINT) AS k FROM links")["k"],
        _arrays(con, "SELECT CAST(node_idx AS BIGINT) | (CAST(1 AS BIGINT) << 32) AS k "
                     "FROM nodes")["k"]]))


_NOT_NULL = "sip IS NOT NULL AND cube IS NOT NULL AND pe IS NOT NULL"
#: a hop's resource as ``_busy_islands`` keys it: (link 0 / node 1) << 32 | its index
RESOURCE_KEY = ("(CAST(link_idx < 0 AS BIGINT) << 32) | CAST(CASE WHEN link_idx >= 0 THEN "
                "link_idx ELSE node_idx END AS BIGINT)")
#: one row per hop: what both views take of it (a PE key << 9 | the category's bit, the
#: resource key; ``_busy_islands.sql`` and ``_pe_segments.sql`` say which hops count)
_SCAN_SQL = (
    f"SELECT {_NOT_NULL} AS placed, CASE WHEN {_NOT_NULL} THEN ((CAST(sip AS BIGINT) << 32) "
    "| (CAST(cube AS BIGINT) << 16) | CAST(pe AS BIGINT)) << 9 | " + _BIT_SQL + " ELSE 0 END "
    f"AS pk, busy_ns > 0 AS busy, {RESOURCE_KEY} AS rk, stage = 'hbm' AND queue_ns > 0 AND "
    "category <> 'other' AS hq, t_enter_ns, t_leave_ns, t_busy_start_ns, queue_ns, op_id "
    "FROM _hop_ctx")


#: hop stages whose category is the stage itself, and those whose category is their op's
#: transfer (``_hop_ctx.sql``); any other stage is 'other'. Their codes in ``_RAW_SQL``: 1, 2, ...
_OWN = ("dma_read", "fetch", "gemm", "math", "store", "dma_write", "ipcq")
_CARRY = ("fabric", "hbm", "sram")
_HBM = 1 + (_OWN + _CARRY).index("hbm")
#: one row per hop, what the scan computes from (the stage as its code, 0: 'other')
_RAW_SQL = ("SELECT op_id, CAST(CASE CAST(stage AS VARCHAR) "
            + " ".join(f"WHEN '{st}' THEN {i}" for i, st in enumerate(_OWN + _CARRY, 1))
            + " ELSE 0 END AS UTINYINT) AS sc, link_idx, node_idx, t_enter_ns, t_leave_ns, "
            "busy_ns, queue_ns FROM hops")
#: op kinds as ``_hop_ctx.sql`` tells them apart: 1 host copy (its hops are 'other'), 2 store
#: (a transfer's hops are dma_write), 3 IPCQ (ipcq); 0 any other (and no kind: dma_read)
_KIND_CODE = {"h2d": 1, "d2h": 1, "store": 2, "send": 3, "recv": 3}


def _category_bits() -> np.ndarray:
    """The category's bit in a PE's mask (``_BIT_SQL``) per (stage code, kind code)."""
    bit = dict(_STAGE_BITS)
    lut = np.full((1 + len(_OWN) + len(_CARRY), 4), bit["other"], np.int64)
    for i, st in enumerate(_OWN, 1):
        lut[i, [0, 2, 3]] = bit[st]
    for i in range(1 + len(_OWN), len(lut)):
        lut[i, [0, 2, 3]] = bit["dma_read"], bit["dma_write"], bit["ipcq"]
    return lut


def _op_ctx(con: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per op (``op_timing``, indexed by op_id): its PE key << 9 (0 unplaced), whether it is
    placed, its kind code (``_KIND_CODE``); None unless the op_ids are 0, 1, 2, ... in order
    (a run's are: then a hop's op is at its op_id, and no op is joined twice)."""
    t = con.sql("SELECT op_id, sip, cube, pe, CAST(kind AS VARCHAR) AS kind FROM op_timing"
                ).to_arrow_table()
    op = t.column("op_id").to_numpy()
    if not np.array_equal(op, np.arange(len(op))):
        return None
    placed = np.ones(len(op), dtype=bool)
    key = np.zeros(len(op), np.int64)
    for c, sh in (("sip", 32), ("cube", 16), ("pe", 0)):
        col = t.column(c)
        placed &= pc.is_valid(col).to_numpy(zero_copy_only=False)
        key |= pc.fill_null(col, 0).to_numpy().astype(np.int64) << sh
    kinds = pc.dictionary_encode(t.column("kind")).combine_chunks()
    lut = np.array([_KIND_CODE.get(k, 0) for k in kinds.dictionary.to_pylist()] + [0], np.uint8)
    idx = pc.fill_null(kinds.indices, len(kinds.dictionary)).to_numpy()
    return np.where(placed, key << 9, 0), placed, lut[idx]


def _raw_hops(con: Any, hops: Any) -> Iterator[tuple[np.ndarray, ...]]:
    """``_RAW_SQL``'s columns as numpy arrays, a batch at a time; ``hops``: the Parquet file
    the ``hops`` view reads (a single run's), read with pyarrow, the stage codes taken from
    its dictionary (gemm at 1.0 M ops: 1.3 CPU s, DuckDB's ``_RAW_SQL`` 2.7)."""
    if hops is None:
        for b in con.sql(_RAW_SQL).to_arrow_reader(STREAM_ROWS):
            yield tuple(b.column(i).to_numpy() for i in range(8))
        return
    import pyarrow.parquet as pq

    code = {st: i for i, st in enumerate(_OWN + _CARRY, 1)}
    cols = ["op_id", "stage", "link_idx", "node_idx", "t_enter_ns", "t_leave_ns", "busy_ns",
            "queue_ns"]
    # not pre-buffered: the reader otherwise holds the file's column chunks (gemm at 1.0 M
    # ops: the scan's peak 458 MiB, against 247 through DuckDB)
    with pq.ParquetFile(hops, pre_buffer=False) as f:
        for b in f.iter_batches(batch_size=STREAM_ROWS, columns=cols, use_threads=False):
            st = b.column(1)
            if pa.types.is_dictionary(st.type):
                lut = np.array([code.get(v, 0) for v in st.dictionary.to_pylist()] + [0],
                               np.uint8)
                sc = lut[pc.fill_null(st.indices, len(st.dictionary)).to_numpy()]
            else:
                sc = np.array([code.get(v, 0) for v in st.to_pylist()], np.uint8)
            yield (b.column(0).to_numpy(), sc,
                   *(b.column(i).to_numpy() for i in range(2, 8)))


def _hop_rows(con: Any, hops: Any = None, fabric: Any = None
              ) -> Iterator[tuple[np.ndarray, ...]]:
    """``_SCAN_SQL``'s columns as numpy arrays, a batch of hops at a time: (placed, pk, busy,
    rk, hq, t_enter_ns, t_leave_ns, t_busy_start_ns, queue_ns, op_id). ``_hop_ctx``'s join
    and category are done here, from ``hops`` and ``op_timing`` read apart (gemm at 1.0 M
    ops, 29.4 M hops: ~2.5 CPU s, where DuckDB took 7.3-9.3 to evaluate ``_SCAN_SQL``); the
    SQL where ``op_timing``'s op_ids are not 0, 1, 2, ... ``hops``: the file of the ``hops``
    view, when it reads one (``_raw_hops``). ``fabric``: an ``_earliest.Earliest`` given
    every hop's entry time on a link or at HBM (set ``complete`` at the end; not where the
    SQL does the join: its rows lack the hops of no op)."""
    ctx = _op_ctx(con)
    if ctx is None:
        for b in con.sql(_SCAN_SQL).to_arrow_reader(STREAM_ROWS):
            yield tuple(b.column(i).to_numpy(zero_copy_only=False) for i in range(10))
        return
    op_key, op_placed, op_kind = ctx
    bits, other = _category_bits(), dict(_STAGE_BITS)["other"]
    for op, sc, link, node, s, e, busy, q in _raw_hops(con, hops):
        if fabric is not None:      # (every hop, as perfetto's query of the hops view)
            fabric.add(s[(link >= 0) | (sc == _HBM)])
        joined = (op >= 0) & (op < len(op_key))      # (the join drops a hop of no op)
        if not joined.all():
            op, sc, link, node, s, e, busy, q = (x[joined] for x in (op, sc, link, node, s,
                                                                     e, busy, q))
        bit = bits[sc, op_kind[op]]
        placed = op_placed[op]
        pk = np.where(placed, op_key[op] | bit, 0)
        rk = np.where(link < 0, (1 << 32) | node.astype(np.int64), link.astype(np.int64))
        hq = (sc == _HBM) & (q > 0) & (bit != other)
        yield placed, pk, busy > 0, rk, hq, s, e, np.maximum(s, e - busy), q, op
    if fabric is not None:
        fabric.complete = True


def _scan(con: Any, collect: Any = None, hops: Any = None, fabric: Any = None
          ) -> dict[str, Any]:
    """One pass over ``_hop_ctx`` for both views: the busy intervals dealt by resource, the
    PEs' category intervals (and HBM queueing) ``premerge``d and dealt by PE. ``collect``:
    another view's collector (``critpred.Collect``), handed every row too; what its
    ``done(rows)`` returns goes with the parts (``"_crit_pred"``), unless None.
    ``fabric``: fed the fabric hops' entry times (``_hop_rows``)."""
    base = _temp_base(con)
    sp = _arrays(con, f"SELECT sip, cube, pe, t0_ns, t1_ns FROM _pe_span WHERE {_NOT_NULL} "
                      "ORDER BY sip, cube, pe")
    busy = Parts(_resource_keys(con), 0, base)
    pe = Parts(_pe_key(sp), 9, base)
    pe.spans = sp
    q_bit = dict(_STAGE_BITS)["hbm_queue"]
    other = collect(con) if collect is not None else None
    rows = 0
    con.execute(f"SET threads TO {os.cpu_count() or 1}")   # any row order: all is sorted
    try:
        for placed, pk, is_busy, rk, hq, s, e, bs, q, op in _hop_rows(con, hops, fabric):
            busy.add(rk[is_busy], bs[is_busy], e[is_busy])
            pe.add(*premerge(pk[placed], s[placed], e[placed]))
            hq = hq & placed
            pe.add(*premerge((pk[hq] & ~511) | q_bit, s[hq], s[hq] + q[hq]))
            if other is not None:
                other.add(rk, op, s, e, q)
            rows += len(op)
    except BaseException:
        busy.close()
        pe.close()
        if other is not None:
            other.close()
        raise
    finally:
        con.execute("SET threads TO 1")
    out: dict[str, Any] = {"_busy_islands": busy, "_pe_segments": pe}
    got = other.done(rows) if other is not None else None
    if got is not None:
        out["_crit_pred"] = got
    return out


def _parts(con: Any, view: str, shared: dict[str, Any] | None) -> Parts:
    """``view``'s rows from the scan: the ones ``shared`` holds (another view's scan left
    them there), or a new scan, whose rows of the other views are left in ``shared`` (and
    which takes ``shared["_collect"]``, a collector for a view materialised later, and reads
    ``shared[HOPS_FILE]``, the hops' file, if it is there)."""
    if shared is not None and view in shared:
        return cast(Parts, shared.pop(view))
    got = _scan(con, shared.pop("_collect", None) if shared is not None else None,
                shared.get(HOPS_FILE) if shared is not None else None,
                shared.get(FABRIC) if shared is not None else None)
    mine = got.pop(view)
    for other, parts in got.items():       # (each has a close())
        if shared is None:
            parts.close()
            continue
        old = shared.pop(other, None)
        if old is not None:
            old.close()
        shared[other] = parts
    return mine


def busy_islands(con: Any) -> pa.Table:
    """The rows of ``_busy_islands`` (resource_kind, resource_idx, t0_ns, t1_ns)."""
    return plain(pa.concat_tables(busy_island_parts(con)))


def busy_island_parts(con: Any, shared: dict[str, Any] | None = None) -> Iterator[pa.Table]:
    """``busy_islands`` a batch of rows at a time (at least one table, maybe empty; its
    strings as a dictionary column, ``plain``).
    ``shared``: where the scan leaves ``_pe_segments``' rows (``_parts``); with
    ``utilwindows.WANT`` in it, the current windows' busy times are added up from the
    islands as they are made and left there (``utilwindows.SUMS``), so the twin of
    ``utilisation_windows`` need not read the 23 M islands of a million gemm ops back."""
    sums = None
    if shared is not None and shared.pop(utilwindows.WANT, False):
        sums = utilwindows.WindowSums(*utilwindows.window_bounds(con))
    for key, s, e, _, _ in _parts(con, "_busy_islands", shared).chunks():
        isl = _islands_sorted(key, s, e)
        del key, s, e       # (not held while the next chunk is read and sorted)
        if sums is not None:    # the islands in the order the view's file holds them
            sums.add(*isl)
        rows = _busy_rows(*isl)
        del isl
        yield rows
        del rows
    if sums is not None and shared is not None:
        shared[utilwindows.SUMS] = (sums.n, sums.table())


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
    return plain(pa.concat_tables(pe_segment_parts(con)))


def pe_segment_parts(con: Any, shared: dict[str, Any] | None = None) -> Iterator[pa.Table]:
    """``pe_segments`` a batch of rows at a time (strings as in ``busy_island_parts``): the
    PEs' islands from the scan (see the module docstring), a PE cut once all its islands
    are in. ``shared``: as ``busy_island_parts``'."""
    parts = _parts(con, "_pe_segments", shared)
    sp = parts.spans
    span_k = _pe_key(sp)
    span_p = _part(span_k, span_k)
    for ck, cs, ce, p0, p1 in parts.chunks():
        k, a, b = _islands_sorted(ck, cs, ce)       # a chunk holds whole PEs, and their spans:
        del ck, cs, ce      # (not held while the next chunk is read and sorted)
        j0, j1 = np.searchsorted(span_p, [p0, p1])  # those of the same parts
        rows = _segments(k, a, b, span_k[j0:j1], sp["t0_ns"][j0:j1], sp["t1_ns"][j0:j1])
        del k, a, b
        yield rows
        del rows


def _segments(k: np.ndarray, s: np.ndarray, e: np.ndarray, span_k: np.ndarray,
              span_t0: np.ndarray, span_t1: np.ndarray) -> pa.Table:
    """The segments of the PEs whose islands (``k`` = PE key << 9 | bit, by key then start)
    and spans (``span_k``, ascending) are given: all of each PE's."""
    pk, b = k >> 9, k & 511
    # the island bounds and the spans' ends, as changes of each PE's active-category mask
    ev_k = np.concatenate([pk, pk, span_k, span_k])
    ev_t = np.concatenate([s, e, span_t0, span_t1])
    ev_d = np.concatenate([b, -b, np.zeros(2 * len(span_k), np.int64)])
    del pk, b
    o = np.lexsort((ev_t, ev_k))
    ev_k = ev_k[o]      # a column at a time (the temporaries freed as they go)
    ev_t = ev_t[o]
    ev_d = ev_d[o]
    del o
    if len(ev_k):
        first = np.r_[True, (ev_k[1:] != ev_k[:-1]) | (ev_t[1:] != ev_t[:-1])]
        at = np.flatnonzero(first)
        del first
        pt_k, pt_t, pt_d = ev_k[at], ev_t[at], np.add.reduceat(ev_d, at)
        del at
    else:
        pt_k, pt_t, pt_d = ev_k, ev_t, ev_d
    del ev_k, ev_t, ev_d
    mask = np.cumsum(pt_d)          # each PE's bits add back to 0 at its last bound
    nxt = np.r_[pt_k[1:] == pt_k[:-1], False]       # lead(t) within the PE exists
    t1 = np.r_[pt_t[1:], 0.0]
    # clipped to the PE's span (the SQL's join: a PE without a span has no segments)
    i = np.minimum(np.searchsorted(span_k, pt_k), len(span_k) - 1)
    has_span = span_k[i] == pt_k if len(span_k) else np.zeros(len(pt_k), dtype=bool)
    a = np.maximum(pt_t, span_t0[i]) if len(span_k) else pt_t
    bb = np.minimum(t1, span_t1[i]) if len(span_k) else t1
    keep = nxt & has_span & (bb > a)
    del nxt, has_span, i, t1, pt_t, pt_d
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


#: ``shared``'s key for the Parquet file the ``hops`` view reads (``Run.materialize`` sets it
#: for a single run): the scan reads it with pyarrow instead of through DuckDB
HOPS_FILE = "_hops_file"
#: ``shared``'s key for an ``_earliest.Earliest`` the scan feeds (``Run.materialize`` sets it)
FABRIC = "_fabric"
#: view -> the function computing its rows a batch at a time (``Run.materialize``, single runs)
TWINS = {"_busy_islands": busy_island_parts, "_pe_segments": pe_segment_parts}
