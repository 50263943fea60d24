"""Each used resource's busy time per equal window in numpy: the materialised twin of
``utilisation_windows``.

``analysis/sql/utilisation_windows.sql`` stays the definition (unmaterialised runs, run
sets, a window count set after materialising). ``Run.materialize`` computes the view's
busy times here instead: the busy islands are read once in their order (by resource, then
time), each island's windows found by ``searchsorted`` over the window bounds DuckDB
computes (the SQL's own ``w``), its clipped length the SQL's ``least(...) - greatest(...)``
of the same doubles, and the lengths added into their window in island order
(``np.add.at``, one after the other; 0.0 in a window without any). The rest -- the
resources' names and kinds, the window bounds, ``util`` -- is the view's SQL over those sums.

Not bit for bit the SQL's sums: DuckDB adds a window's islands in the order its hash join
happens to emit them (which moves with its memory budget), here in time order; the two
differ in the last bits (on gemm at a million ops, 128 of 71,740 windows, by up to 119 ulps,
1.8e-14 relative; the report and timeline, which print util to 6 decimals, byte-identical).
``tests/test_islands.py`` compares them on real runs.

Why: DuckDB evaluates the view as a hash join of every window with every island of its
resource (build side: the islands, 23 M at a million gemm ops, ~350 MB spilled under the
run's 512 MB budget), 4.2 CPU s and the headline's peak; here one pass over the islands.

When ``Run.materialize`` computes ``_busy_islands`` (its numpy twin) before this view, the
pass is made there, on each chunk of islands as it is made (``WindowSums``; ``WANT`` and
``SUMS`` in the run's shared scans), in the order the islands' file holds them, so the
sums are the same bit for bit and the 23 M islands are not read back from the file (gemm
at a million ops: the view 2.7 -> 0.2 CPU s, ~1.8 s of it now in ``_busy_islands``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["busy_by_window", "rows", "rows_parts", "window_bounds", "WindowSums", "STREAM_ROWS",
           "WINDOWS_SQL", "VIEW_SQL", "WANT", "SUMS"]

#: islands read at a time
STREAM_ROWS = 1 << 19
#: ``shared``'s key asking ``islands.busy_island_parts`` to add up the windows' busy times as
#: it makes the islands (``Run.materialize``, when this view is materialised after it) ...
WANT = "_uw_want"
#: ... and the key of what it left: (window count, ``WindowSums.table()``)
SUMS = "_uw_sums"

#: the view's windows (as ``utilisation_windows.sql`` computes them)
WINDOWS_SQL = """SELECT g.w AS win, g.w * s.makespan_ns / c.n_windows AS t0_ns,
         (g.w + 1) * s.makespan_ns / c.n_windows AS t1_ns
  FROM _span s CROSS JOIN _config c
  CROSS JOIN (SELECT unnest(range(CAST((SELECT n_windows FROM _config) AS BIGINT))) AS w) g"""

#: the view's rows over ``_uw_busy`` (resource_kind, resource_idx, win, busy_ns: every
#: used resource's busy time in every window, 0.0 where none of its islands is)
VIEW_SQL = f"""WITH w AS ({WINDOWS_SQL})
SELECT b.resource_kind, b.resource_idx, r.resource_id, r.kind, w.win, w.t0_ns, w.t1_ns,
       b.busy_ns, least(1.0, b.busy_ns / nullif(w.t1_ns - w.t0_ns, 0)) AS util
FROM _uw_busy b JOIN w USING (win)
JOIN _resources r USING (resource_kind, resource_idx)
ORDER BY b.resource_kind, b.resource_idx, w.win"""

_KINDS = ("link", "node")


def window_bounds(con: Any) -> tuple[np.ndarray, np.ndarray]:
    """The current windows' bounds (``WINDOWS_SQL``), t0_ns and t1_ns by window."""
    w = con.sql(f"SELECT win, t0_ns, t1_ns FROM ({WINDOWS_SQL}) ORDER BY win").to_arrow_table()
    return w.column("t0_ns").to_numpy(), w.column("t1_ns").to_numpy()


class WindowSums:
    """Busy time per (resource, window), islands (resource key: link 0 / node 1 << 32 |
    index, as ``islands`` keys them) added a batch at a time, each window's in island order."""

    def __init__(self, win_t0: np.ndarray, win_t1: np.ndarray) -> None:
        self.win_t0, self.win_t1, self.n = win_t0, win_t1, len(win_t0)
        self.rank_of: dict[int, int] = {}       # resource key -> rank, in order met
        self.acc: np.ndarray = np.zeros(0, np.float64)   # busy time per (rank, window)

    def add(self, key: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> None:
        n, win_t0, win_t1, rank_of = self.n, self.win_t0, self.win_t1, self.rank_of
        if len(key) and bool((key[1:] >= key[:-1]).all()):    # (islands come by resource)
            new = np.r_[True, key[1:] != key[:-1]]
            uniq, inv = key[new], np.cumsum(new) - 1
        else:
            uniq, inv = np.unique(key, return_inverse=True)
        for k in uniq.tolist():
            rank_of.setdefault(k, len(rank_of))
        size = len(rank_of) * n
        acc = np.concatenate([self.acc, np.zeros(size - len(self.acc))])
        at = np.array([rank_of[k] for k in uniq.tolist()], np.int64)[inv] * n
        # the windows each island overlaps: w.t1_ns > b.t0_ns and w.t0_ns < b.t1_ns
        first = np.searchsorted(win_t1, t0, "right")
        cnt = np.maximum(np.searchsorted(win_t0, t1, "left") - first, 0)
        # each island's part in each of its windows, min(w.t1_ns, b.t1_ns) - max(w.t0_ns,
        # b.t0_ns), added into the window in island order. The islands of a resource come
        # in time order and are apart, so a window holds first the part of the one island
        # that began in an earlier window (if any), then the first parts of the islands
        # beginning in it: the later parts of the islands spanning windows (few) go first,
        # then every island's first part, and ``bincount`` adds them in that order (after
        # each window's sum so far: 0.0 + x is x, and a sum is never -0.0).
        one = cnt > 0
        if not one.all():
            first, at, s, e, cnt = first[one], at[one], t0[one], t1[one], cnt[one]
        else:
            s, e = t0, t1
        part = np.minimum(win_t1[first], e) - np.maximum(win_t0[first], s)
        idx = [np.arange(size), at + first]
        parts = [acc, part]
        more = np.flatnonzero(cnt > 1)
        if len(more):
            k = cnt[more] - 1
            isl = np.repeat(more, k)
            win = (np.repeat(first[more] + 1 - np.cumsum(k) + k, k)
                   + np.arange(int(k.sum())))
            idx.insert(1, at[isl] + win)
            parts.insert(1, np.minimum(win_t1[win], e[isl]) - np.maximum(win_t0[win], s[isl]))
        self.acc = np.bincount(np.concatenate(idx), np.concatenate(parts), minlength=size)

    def table(self) -> pa.Table:
        """(resource_kind, resource_idx, win, busy_ns) by resource and window."""
        n = self.n
        keys = np.array(sorted(self.rank_of), np.int64)
        ranks = np.array([self.rank_of[k] for k in keys.tolist()], np.int64)
        at = (ranks[:, None] * n + np.arange(n)[None, :]).ravel()
        t = _key_table(np.repeat(keys, n))
        t = t.append_column("win", pa.array(np.tile(np.arange(n, dtype=np.int64), len(keys))))
        return t.append_column("busy_ns", pa.array(self.acc[at], pa.float64()))


def busy_by_window(con: Any) -> pa.Table:
    """Every used resource's busy time in each window (resource_kind, resource_idx, win,
    busy_ns), from ``_busy_islands`` and the current window count, by resource and window."""
    sums = WindowSums(*window_bounds(con))
    reader = con.sql("SELECT CASE resource_kind WHEN 'link' THEN 0 ELSE 1 END AS k, "
                     "resource_idx, t0_ns, t1_ns FROM _busy_islands").to_arrow_reader(STREAM_ROWS)
    for b in reader:
        sums.add((b.column(0).to_numpy().astype(np.int64) << 32)
                 | b.column(1).to_numpy().astype(np.int64),
                 b.column(2).to_numpy(), b.column(3).to_numpy())
    del reader
    return sums.table()


def _key_table(k: np.ndarray) -> pa.Table:
    kind = pa.DictionaryArray.from_arrays(pa.array((k >> 32).astype(np.int32)),
                                          pa.array(_KINDS)).cast(pa.string())
    return pa.table({"resource_kind": kind,
                     "resource_idx": pa.array((k & 0xFFFFFFFF).astype(np.int32))})


def rows(con: Any, shared: dict[str, Any] | None = None) -> pa.Table:
    """The rows of ``utilisation_windows`` for the current window count, by resource and
    window. ``shared``: where ``islands.busy_island_parts`` left the busy times it added up
    as it made the islands (``SUMS``: the window count and ``WindowSums.table``), used if
    they are for the current count, else the islands are read again."""
    got = shared.pop(SUMS, None) if shared is not None else None
    busy = got[1] if got is not None and got[0] == _n_windows(con) else busy_by_window(con)
    con.register("_uw_busy", busy)
    try:
        return con.sql(VIEW_SQL).to_arrow_table()
    finally:
        con.unregister("_uw_busy")


def _n_windows(con: Any) -> int:
    return int(con.sql("SELECT n_windows FROM _config").fetchall()[0][0])


def rows_parts(con: Any, shared: dict[str, Any] | None = None) -> Iterator[pa.Table]:
    """``rows`` as one table (the twins' interface)."""
    yield rows(con, shared)
