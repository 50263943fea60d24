"""Columnar recording of replay results: op timing arrays + batched hop rows.

Hop rows arrive from two sources, both appended in creation order:

* explicit rows (``hop`` / ``rows``): ten float64 fields each, written in place into a
  buffer (``rowbuf.HopRows``),
  ``(op, tile, stage_code, node, link, t_enter, t_leave, busy, queue, nbytes)``;
* compact transfers (``transfer``, fast mode): one record per stretch of a
  transfer on a free path, ``(position, op, tile, plan, h0, t0, done, n)``
  (``rowbuf.CompactRows``),
  standing for the first ``n`` rows of the plan. A *plan* (registered once per
  route suffix and size with ``add_plan``) holds each row's
  constants and closed-form offsets: ``t_enter = h0 + EN``, ``t_leave =
  max(t0 + LA, h0 + LB)`` (or ``done`` for the terminal row), queue 0. The
  rows are expanded with numpy when the batch is finalised, so a transfer costs
  one record of eight numbers however long its path.

Pending rows are materialised in creation order (each compact transfer records
its position among the explicit rows; its rows are scattered into place). When the
ops completed since the last batch own ``batch_rows`` pending rows or more (or
at ``close``) the batch is finalised vectorised with numpy, in completion
order of the ops; rows of ops still in flight stay pending:

* ``hop`` index = path order = rows of the op stably sorted by ``t_enter``
  (ties: creation order);
* ``crit_ns``: the op's rows stably sorted by ``t_leave`` advance its
  completion frontier, starting from ``t_issue``; each row is attributed
  ``t_leave - frontier`` (0 if not beyond it). Since the rows are sorted, the
  frontier before a row is ``max(t_issue, previous t_leave)``. The remainder up
  to ``t_end`` (if any) goes to the last row, so an op's ``crit_ns`` sum to
  ``t_end - t_issue``;
* the op's ``queue_ns`` = sum over its rows, in hop order, of
  ``min(queue, crit)``; its ``t_end`` = max(completion, last ``t_leave``).

Memory is bounded by the rows of ops in flight plus one batch. ``close()``
finalises the last batch; per-op ``t_end`` / ``queue`` are final only after it.
A row recorded for an op whose rows were already written is an error.

For the physical invariants every finalised row with ``busy_ns > 0`` yields
``(resource, t_enter + queue, t_leave, busy)``; a link is its own resource, a
node-side row's resource is ``rid(node, stage)``. Each batch's intervals go to
the ``busy`` checker (``invariants.BusyCheck``) with a watermark no later row
starts before: the earliest issue time of the ops issued (``opcore.OpCore.issue``)
and not yet finalised, or the flush time if none is in flight. The checker keeps only the
windows that may still grow, so no per-hop state outlives its batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from kbtrace import schema
from kbtrace._io import ROW_GROUP_SIZE, BatchWriter
from kbtrace.errors import InvariantError
from kbtrace.replay.colsort import lexsort2
from kbtrace.replay.intervals import row_faults
from kbtrace.replay.rowbuf import CompactRows, DoneRows, HopRows, IssueRows

__all__ = ["Recorder", "STAGE_CODE"]



class BusySink(Protocol):
    """Where finalised busy intervals go (``invariants.BusyCheck``): per batch the rows'
    ``(resource, start, end, busy)`` columns and a watermark no later row starts before."""

    def add(self, res: np.ndarray, s: np.ndarray, e: np.ndarray, b: np.ndarray,
            watermark: float) -> None: ...
    def close(self) -> float: ...


_COMPUTE = ("gemm", "math")
STAGE_CODE = {s: i for i, s in enumerate(schema.STAGES)}
_STAGE_DICT = pa.array(schema.STAGES, pa.string())
_COLS = ("op", "tile", "stage", "node", "link", "enter", "leave", "busy", "queue", "nbytes")
_OP, _TILE, _STAGE, _NODE, _LINK, _EN, _LV, _BUSY, _Q, _NB = range(10)     # their rows
# a plan row: (stage_code, node, link, busy, EN, LA, LB, terminal)
_PLAN_ROW_DT = (np.int64, np.int64, np.int64, np.float64, np.float64, np.float64, np.float64, bool)


def _put(arrays: tuple[np.ndarray, ...], at: int, cols, dtypes) -> tuple[np.ndarray, ...]:
    """Write columns ``cols`` into ``arrays`` from index ``at``, growing them by doubling."""
    out = []
    for a, c, dt in zip(arrays, cols, dtypes, strict=True):
        c = np.asarray(c, dtype=dt)
        need = at + len(c)
        if need > len(a):
            g = np.empty(max(need, 2 * len(a), 64), dtype=dt)
            g[:at] = a[:at]
            a = g
        a[at:need] = c
        out.append(a)
    return tuple(out)


class Recorder:
    def __init__(self, out_dir: Path, n_ops: int, n_links: int, batch_rows: int,
                 res_alias: dict[int, int] | None = None,
                 rows: tuple[type, type, type] = (HopRows, CompactRows, DoneRows),
                 kernels: Any = None) -> None:
        """``rows``: the classes of the pending-row buffers and of the completions since the
        last flush (``rowbuf``'s, or their compiled twins: ``fabric.core.row_buffers()``); ``kernels``: the compiled batch sorts
        (``fabric.core.seg_kernels()``), or None for numpy's (the same order)."""
        self.hops = BatchWriter(out_dir / "hops.parquet", schema.HOPS, batch_rows=batch_rows,
                                bulk=True)
        self.batch_rows = batch_rows
        self._kernels = kernels
        self.t_issue = np.full(n_ops, np.nan)
        self.t_start = np.full(n_ops, np.nan)
        self.t_end = np.full(n_ops, np.nan)
        self.queue = np.zeros(n_ops)
        #: per op the code of its engine's node id in ``engine_names`` (-1: not completed)
        self.engine = np.full(n_ops, -1, dtype=np.int32)
        self.n_links = n_links
        self.res_alias = res_alias or {}
        self._res: dict[tuple[int, str], int] = {}
        self.res_names: list[tuple[int, str]] = []
        self.n_hops = 0
        # pending rows
        self._x: HopRows = rows[0]()        # explicit rows
        self.hop_rows = self._x             # (``opcore.OpCore`` writes HBM rows into it)
        #: ``hop`` with the stage as its ``STAGE_CODE`` (the buffer's own ``add``: the hot
        #: callers, the PE's servers, skip a call and a dict look-up per row)
        self.row = self._x.add
        self._c: CompactRows = rows[1](x=self._x)   # compact transfers (``rows``: theirs)
        #: ``transfer(op, tile, plan, h0, t0, done, n)``: a transfer (or the leading part of
        #: one) on a free path: the first ``n`` rows of ``plan`` from head / tail ready times
        #: ``h0`` / ``t0`` (expanded at finalisation), placed after the explicit rows so far
        #: (the buffer's own method: the booking walk calls it with no Python frame)
        self.transfer = self._c.transfer
        #: ``rows(rows)``: explicit rows, tuples in the internal layout (stage as its
        #: ``STAGE_CODE``), in creation order (the buffer's own ``extend``: the booking code
        #: calls it with no Python frame)
        self.rows = self._x.extend
        self._carry: np.ndarray | None = None   # rows (columns) of ops in flight at last flush
        self._rid_of = np.full(0, -1, dtype=np.int64)   # node * 64 + stage -> rid (grows)
        #: ops completed since the last flush (completion order), their raw timing and engine
        #: code (``engine_names``: the engines' node ids by code); ``op_done`` adds to it (and
        #: fast mode's ``opcore.OpCore.complete``, compiled, directly)
        self.dones: DoneRows = rows[2](self._x, self._c, batch_rows)
        self.engine_names: list[str] = self.dones.names
        self._rank = np.full(n_ops, -1, dtype=np.int64)
        self._n_ranked = 0
        # compact transfer plans: per plan (row offset, bytes) and flat per-row constants, as
        # growable numpy arrays; plans registered since the last build wait as tuples
        self._p_new: list[tuple[int, int, list[tuple]]] = []
        self._p_n = self._p_rows_n = 0                  # plans / rows registered
        self._p_built = self._p_rows_built = 0          # ... of which in the arrays
        self._p_plan: tuple[np.ndarray, ...] = (np.empty(0, dtype=np.int64),) * 2
        self._p_row: tuple[np.ndarray, ...] = tuple(np.empty(0, dtype=t) for t in _PLAN_ROW_DT)
        # invariant 1, fed per batch; (t_issue, op) of issued ops, in issue (= time) order
        self.busy: BusySink | None = None
        #: ``(t_issue, op)`` of each op issued, in issue order (``rowbuf.IssueRows``, added to
        #: by ``opcore.OpCore.issue``)
        self.iss: IssueRows = self.dones.iss
        self._iss_lo = 0                    # the first of them not known finalised

    # ------------------------------------------------------------------ resources
    def rid(self, node: int, stage: str) -> int:
        """Invariant resource id of a node-side hop (links use their own index)."""
        key = (self.res_alias.get(node, node), "compute" if stage in _COMPUTE else stage)
        rid = self._res.get(key)
        if rid is None:
            rid = self._res[key] = self.n_links + len(self.res_names)
            self.res_names.append(key)
        return rid

    # ------------------------------------------------------------------ recording
    def hop(self, op: int, tile: int, stage: str, node: int, link: int, enter: float,
            leave: float, busy: float, queue: float, nbytes: int) -> None:
        self._x.add(op, tile, STAGE_CODE[stage], node, link, enter, leave, busy, queue, nbytes)

    def add_plan(self, rows: list[tuple], nbytes: int) -> int:
        """Register a compact-transfer plan; return its id.

        ``rows``: per hop row (the terminal row last),
        ``(stage_code, node, link, busy, EN, LA, LB, terminal)``.
        """
        pid = self._p_n
        self._p_new.append((self._p_rows_n, nbytes, rows))
        self._p_n += 1
        self._p_rows_n += len(rows)
        return pid

    def drop_plans(self) -> None:
        """Forget every compact-transfer plan (ids restart at 0). Only right after a flush:
        no pending compact record may refer to a plan."""
        if self._c.n:
            raise InvariantError("compact transfer plans dropped while transfers refer to "
                                 "them (flush first)")
        self._p_new = []
        self._p_n = self._p_rows_n = self._p_built = self._p_rows_built = 0

    @property
    def n_done(self) -> int:
        """Ops completed so far."""
        return self._n_ranked + self.dones.n

    def op_done(self, op: int, t_issue: float, t_start: float, t_end: float, engine: str) -> None:
        """Op ``op`` completed at ``t_end`` on ``engine`` (its node id); flushes a full batch."""
        if self.dones.add(op, t_issue, t_start, t_end, engine):
            self.flush(t_end)

    def _watermark(self, now: float) -> float:
        """No row finalised after this flush starts before the returned time: the issue time
        of the first op issued (issue order is time order) not finalised yet, if it is
        earlier. The ops before it are forgotten (the arrays are cut once half of them is)."""
        lo, n = self._iss_lo, self.iss.n
        issued = self.iss.take()
        if lo < n:
            fin = self._rank[issued[lo:, 1].astype(np.int64)] >= 0
            lo += int(fin.argmin()) if not fin.all() else n - lo
        t_lo = float(issued[lo, 0]) if lo < n else now
        if lo > 4096 and 2 * lo > n:
            self.iss.drop(lo)
            lo = 0
        self._iss_lo = lo
        return min(now, t_lo)

    # ------------------------------------------------------------------ finalisation
    def _plans_np(self) -> tuple[np.ndarray, ...]:
        """``(off, nbytes)`` per plan and the per-row constants, plans registered so far.

        Only the plans added since the last call are converted (into arrays grown by
        doubling), so the cost over a run is linear in the plans, however many batches."""
        if self._p_new:
            off, nb, rows = zip(*self._p_new, strict=True)
            flat = [r for rs in rows for r in rs]
            self._p_new = []
            self._p_plan = _put(self._p_plan, self._p_built, (off, nb), (np.int64, np.int64))
            self._p_row = _put(self._p_row, self._p_rows_built, zip(*flat, strict=True),
                               _PLAN_ROW_DT)
            self._p_built, self._p_rows_built = self._p_n, self._p_rows_n
        n, m = self._p_built, self._p_rows_built
        return (*(a[:n] for a in self._p_plan), *(a[:m] for a in self._p_row))

    def _pending(self) -> np.ndarray | None:
        """All pending rows as a ``(10, m)`` array of columns (``_COLS``), in creation
        order (None: none); no state change.

        Explicit row ``i`` follows every compact row of the transfers recorded at
        position ``<= i``; the compact rows are scattered into place, not sorted.
        """
        nx, nc = self._x.n, self._c.n
        carry = self._carry
        if not nx and not nc:
            return carry
        if nx:
            X = self._x.take()
        if not nc:
            new = np.ascontiguousarray(X.T)
        elif self._kernels is not None:         # the same columns, one compiled pass
            C = self._c.take()
            tot = int(C[:, 7].sum())
            return self._kernels.expand(C, X if nx else np.empty((0, 10)), *self._plans_np(),
                                        nx + tot, carry)      # (the carry first)
        else:
            C = self._c.take()
            off, pnb, pst, pnd, plk, pbusy, pen, pla, plb, pterm = self._plans_np()
            pos = C[:, 0].astype(np.int64)
            pid = C[:, 3].astype(np.int64)
            nrows = C[:, 7].astype(np.int64)
            tot = int(nrows.sum())
            cum = np.cumsum(nrows)
            first = cum - nrows                     # compact rows created before each transfer
            rep = np.repeat(np.arange(nc), nrows)
            within = np.arange(tot) - first[rep]
            idx = off[pid][rep] + within
            h0, t0 = C[:, 4][rep], C[:, 5][rep]
            leave = np.maximum(t0 + pla[idx], h0 + plb[idx])
            term = np.flatnonzero(pterm[idx])
            leave[term] = C[:, 6][rep[term]]
            m = nx + tot
            at_c = pos[rep] + np.arange(tot)        # creation index of each compact row
            new = np.empty((10, m))
            if nx:
                k = np.searchsorted(pos, np.arange(nx), side="right")
                at_x = np.arange(nx) + np.where(k > 0, cum[np.maximum(k - 1, 0)], 0)
            for i, v in enumerate((C[:, 1][rep], C[:, 2][rep], pst[idx], pnd[idx], plk[idx],
                                   h0 + pen[idx], leave, pbusy[idx], None, pnb[pid][rep])):
                col = new[i]
                if v is None:
                    col[at_c] = 0.0
                else:
                    col[at_c] = v
                if nx:
                    col[at_x] = X[:, i]
        if carry is None:
            return new
        return np.concatenate((carry, new), axis=1)

    def _intervals_of(self, r: np.ndarray, rank: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The busy intervals of rows ``r`` (compiled: those ``rank`` does not mark -1)."""
        if self._kernels is not None:       # one compiled pass; node-side rows first seen:
            res, s, e, b = self._kernels.intervals(r, self._rid_of, rank)   # -1 - their key
            miss = np.flatnonzero(res < 0)
            if miss.size:
                key = -1 - res[miss]
                self._rids(key)
                res[miss] = self._rid_of[key]
            return res, s, e, b
        busy = r[_BUSY]
        sel = np.flatnonzero(busy > 0)
        link = r[_LINK][sel].astype(np.int64)
        side = np.flatnonzero(link < 0)
        if side.size:
            key = r[_NODE][sel][side].astype(np.int64) * 64 + r[_STAGE][sel][side].astype(np.int64)
            self._rids(key)
            link[side] = self._rid_of[key]
        return (link, r[_EN][sel] + r[_Q][sel], r[_LV][sel], busy[sel])

    def _rids(self, key: np.ndarray) -> None:
        """Resource ids for node-side keys (``node * 64 + stage``) not seen before, in key
        order, into the ``_rid_of`` look-up table."""
        top = int(key.max()) + 1
        if top > len(self._rid_of):
            self._rid_of = np.concatenate(
                (self._rid_of, np.full(top - len(self._rid_of), -1, dtype=np.int64)))
        miss = self._rid_of[key] < 0
        if miss.any():
            for k in np.unique(key[miss]).tolist():
                self._rid_of[k] = self.rid(k >> 6, schema.STAGES[k & 63])

    def _sort(self, minor: np.ndarray, major: np.ndarray) -> np.ndarray:
        """``np.lexsort((minor, major))``: compiled (``segsort.order``) where it is given and
        applies (``major`` a narrow range, as the op ranks of a batch are; no NaN), else
        ``colsort.lexsort2``."""
        k = self._kernels
        if k is not None and len(major):
            lo = int(major.min())
            span = int(major.max()) - lo + 1
            if span <= 4 * len(major) + 1024 and not np.isnan(minor).any():
                return k.order(np.ascontiguousarray(minor, dtype=np.float64),
                               np.ascontiguousarray(major, dtype=np.int64), lo, span)
        return lexsort2(minor, major)

    def flush(self, now: float = np.inf) -> None:
        """Finalise the rows of the ops completed so far (hop, crit, per-op t_end / queue).

        ``now``: the simulated time (default: the run is over)."""
        n_done = self.dones.n
        if n_done:
            ops_d, D = self._store_engines()
            self.t_issue[ops_d] = D[:, 1]
            self.t_start[ops_d] = D[:, 2]
            self.t_end[ops_d] = D[:, 3]
            self._rank[ops_d] = np.arange(self._n_ranked, self._n_ranked + n_done)
            rank_lo = self._n_ranked
            self._n_ranked += n_done
            self.dones.clear()
        else:
            rank_lo = self._n_ranked
        r = self._pending()
        self._x.clear()
        self._c.clear()
        if r is None:
            self._carry = None
            return
        k = self._kernels
        ranked = None                       # (compiled: per row of r its rank, -1: carried)
        if k is not None:                   # rows of completed ops and the others, one pass
            got = k.split(r, self._rank, rank_lo)
            if isinstance(got, int):
                self._late(r, -1 - got)
            r, self._carry, rank, lo_r, hi_r, nan, n = got
            if not n:
                return
            if self._carry is not None:
                if nan or hi_r - lo_r + 1 > 4 * n + 1024:     # numpy's sorts: those rows only
                    keep = np.flatnonzero(rank >= 0)
                    r, rank = np.take(r, keep, axis=1), rank[keep]
                else:
                    ranked = rank
        else:
            op = r[_OP].astype(np.int64)
            rank = self._rank[op]
            late = np.flatnonzero((rank >= 0) & (rank < rank_lo))
            if late.size:
                self._late(r, int(late[0]))
            fin = rank >= 0
            if not fin.all():                   # (``take``: C-contiguous rows, and fastest)
                keep = np.flatnonzero(fin)
                self._carry = np.take(r, np.flatnonzero(~fin), axis=1)
                r = np.take(r, keep, axis=1)
                op, rank = op[keep], rank[keep]
            else:
                self._carry = None
            n = len(op)
            if not n:
                return
        enter, leave, queue = r[_EN], r[_LV], r[_Q]
        if k is not None and not nan and hi_r - lo_r + 1 <= 4 * n + 1024:
            order, lo = k.order2(enter, leave, rank, lo_r, hi_r - lo_r + 1, n)
        else:
            order = self._sort(enter, rank)     # hop order within ops (ties by creation)
            lo = self._sort(leave, rank)        # crit order
        if k is not None:                   # the columns in hop order and crit, one pass
            cols, starts, seg_ops = k.finish(r, order, lo, self.t_issue, self.t_end)
            q_o, crit_o = cols[9], cols[10]
        else:
            rk = rank[order]
            starts = np.flatnonzero(np.r_[True, rk[1:] != rk[:-1]])
            lens = np.diff(np.r_[starts, n])
            ends = starts + lens - 1
            seg_ops = op[order][starts]
            seg = np.repeat(np.arange(len(starts)), lens)
            issue = self.t_issue[seg_ops]
            lv = leave[lo]
            t_end = np.maximum(self.t_end[seg_ops], np.maximum.reduceat(lv, starts))
            front = np.empty(n)
            front[1:] = lv[:-1]
            front[starts] = -np.inf
            np.maximum(front, issue[seg], out=front)
            crit_s = np.where(lv > front, lv - front, 0.0)
            f_end = np.maximum(issue, lv[ends])
            tail = t_end > f_end
            crit_s[ends[tail]] += t_end[tail] - f_end[tail]
            crit = np.empty(n)
            crit[lo] = crit_s
            self.t_end[seg_ops] = t_end
            q_o, crit_o = queue[order], crit[order]
            cols = [op[order], (np.arange(n) - starts[seg]).astype(np.int32),
                    r[_TILE][order].astype(np.int32), r[_STAGE][order].astype(np.int16),
                    r[_NODE][order].astype(np.int32), r[_LINK][order].astype(np.int32),
                    enter[order], leave[order], r[_BUSY][order], q_o, crit_o,
                    r[_NB][order].astype(np.int64)]
        self.queue[seg_ops] = np.add.reduceat(np.minimum(q_o, crit_o), starts)
        # codes come from STAGE_CODE, so they index _STAGE_DICT by construction: skip the
        # validation pass (its first call in a process costs ~6 ms)
        cols[3] = pa.DictionaryArray.from_arrays(pa.array(cols[3]), _STAGE_DICT, safe=False)
        self.hops.write_arrays(cols, n)
        self.n_hops += n
        w = self._watermark(now)    # (also trims the issued-op queue when nothing is checked)
        if self.busy is not None:
            try:
                self.busy.add(*self._intervals_of(r, ranked), w)
            except InvariantError as e:
                if ranked is not None:
                    r = np.take(r, np.flatnonzero(ranked >= 0), axis=1)
                raise InvariantError(f"{e}{self._culprit(r)}; this is a kbtrace model bug, not "
                                     f"an input error: please report it with the trace (another "
                                     f"--fidelity may avoid it)") from None

    def _culprit(self, r: np.ndarray) -> str:
        """The op whose hop row of batch ``r`` breaks invariant 1 on its own (busy longer
        than the row's interval, or the interval ending before it starts), as ``" (op N's
        stage row)"``; empty where only a merged window is over 100%. Only rows with a busy
        time are checked (``_intervals_of``), so a negative busy time cannot be the cause."""
        b = r[_BUSY]
        negative, over = row_faults(r[_EN] + r[_Q], r[_LV], b)
        bad = np.flatnonzero((b > 0) & (negative | over))
        if not bad.size:
            return ""
        i = int(bad[0])
        return f" (op {int(r[_OP][i])}'s {schema.STAGES[int(r[_STAGE][i])]} row)"

    def _late(self, r: np.ndarray, i: int) -> None:
        """Row ``i`` of ``r`` belongs to an op whose rows were written: the error."""
        raise InvariantError(f"a hop row of op {int(r[_OP][i])} was recorded after the op "
                             f"completed and its rows were written (stage "
                             f"{schema.STAGES[int(r[_STAGE][i])]})")

    def _store_engines(self) -> tuple[np.ndarray, np.ndarray]:
        """Store the engine codes of the ops completed since the last flush (``dones``, not
        emptied: ``flush`` stores the rest of their timing); their ids and their rows
        ``(op, t_issue, t_start, t_end, engine code)``."""
        D = self.dones.take()
        ops_d = D[:, 0].astype(np.int64)
        self.engine[ops_d] = D[:, 4].astype(np.int32)
        return ops_d, D

    def close(self) -> None:
        """Finalise the last batch and close the hop writer (atomic rename)."""
        self.flush()
        if self._carry is not None:
            o = int(self._carry[_OP][0])
            raise InvariantError(f"op {o} has hop rows but never completed")
        self.hops.close()

    def write_op_timing(self, path: Path, batches: Iterable[pa.RecordBatch]) -> None:
        """Write ``op_timing.parquet``: the trace's identifying columns (``batches``, in
        ``op_id`` order) beside this run's per-op timing, ``ROW_GROUP_SIZE`` rows at a time
        (the same row groups and bytes as one table written whole, without that table)."""
        if self.dones.n:    # (ops completed since the last flush: a test writes without one)
            self._store_engines()
        # the engine column's dictionary: node ids in order of first appearance by op_id
        # (what dictionary-encoding the whole column gives; Parquet writes it as it is)
        codes, first = np.unique(self.engine, return_index=True)
        first, codes = first[codes >= 0], codes[codes >= 0]
        order = codes[np.argsort(first, kind="stable")]
        remap = np.full(len(self.engine_names) + 1, -1, dtype=np.int32)
        remap[order] = np.arange(len(order), dtype=np.int32)
        names = pa.array([self.engine_names[c] for c in order.tolist()], pa.string())
        w = BatchWriter(path, schema.OP_TIMING)
        try:
            at = 0
            for part in _rechunk(batches, ROW_GROUP_SIZE):
                n = part.num_rows
                sl = slice(at, at + n)
                idx = remap[self.engine[sl]]          # -1 (none) -> the last entry, -1
                engine = pa.DictionaryArray.from_arrays(
                    pa.array(idx, pa.int32(), mask=idx < 0), names)
                timing = {"engine": engine,
                          "t_issue_ns": self.t_issue[sl], "t_start_ns": self.t_start[sl],
                          "t_end_ns": self.t_end[sl], "queue_ns": self.queue[sl]}
                arrays = []
                for f in schema.OP_TIMING:
                    v = timing.get(f.name)
                    if v is None:
                        v = part.column(f.name).combine_chunks()
                    arrays.append(pa.array(v, f.type) if isinstance(v, np.ndarray)
                                  else v.cast(f.type))
                w.write_arrays(arrays, n)
                at += n
            w.close()
        except BaseException:
            w.abort()
            raise


def _rechunk(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """``batches`` as tables of exactly ``rows`` rows (the last one shorter)."""
    held: list[pa.RecordBatch] = []
    n = 0
    for b in batches:
        held.append(b)
        n += b.num_rows
        while n >= rows:
            t = pa.Table.from_batches(held).combine_chunks()
            yield t.slice(0, rows)
            rest = t.slice(rows)
            held, n = rest.to_batches(), rest.num_rows
    if n:
        yield pa.Table.from_batches(held).combine_chunks()
