"""Columnar recording of replay results: op timing arrays + batched hop rows.

Hops are buffered per op while the op is in flight (one small tuple per hop,
``(t_enter, tile, stage, node, link, t_leave, busy, queue, nbytes)``). When the
op completes its rows move, unsorted, to the pending batch (ops in completion
order). When the batch holds ``batch_rows`` rows (checked after each op, so
batches hold whole ops) it is finalised vectorised with numpy:

* ``hop`` index = path order = stable sort of the op's rows by ``t_enter``
  (ties: creation order);
* ``crit_ns``: the op's rows stably sorted by ``t_leave`` advance its
  completion frontier, starting from ``t_issue``; each row is attributed
  ``t_leave - frontier`` (0 if not beyond it). Since the rows are sorted, the
  frontier before a row is ``max(t_issue, previous t_leave)``. The remainder up
  to ``t_end`` (if any) goes to the last row, so an op's ``crit_ns`` sum to
  ``t_end - t_issue``;
* the op's ``queue_ns`` = sum over its rows, in hop order, of
  ``min(queue, crit)``; its ``t_end`` = max(completion, last ``t_leave``).

The columns then go to a ``BatchWriter`` (one flush per batch), so memory is
bounded by the ops in flight plus one batch; rows are in op-completion order.
``close()`` finalises the last batch; per-op ``t_end`` / ``queue`` are final
only after it.

For the physical invariants every hop with ``busy_ns > 0`` also appends
``(resource, start, end, busy)`` to compact typed arrays.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np

from kbtrace import schema
from kbtrace._io import BatchWriter

__all__ = ["Recorder"]

_COMPUTE = ("gemm", "math")


class Recorder:
    def __init__(self, out_dir: Path, n_ops: int, n_links: int, batch_rows: int,
                 res_alias: dict[int, int] | None = None) -> None:
        self.hops = BatchWriter(out_dir / "hops.parquet", schema.HOPS, batch_rows=batch_rows)
        self.batch_rows = batch_rows
        self._open: dict[int, list[tuple]] = {}
        self.t_issue = np.full(n_ops, np.nan)
        self.t_start = np.full(n_ops, np.nan)
        self.t_end = np.full(n_ops, np.nan)
        self.queue = np.zeros(n_ops)
        self.engine: list[str | None] = [None] * n_ops
        self.n_links = n_links
        self.res_alias = res_alias or {}
        self._res: dict[tuple[int, str], int] = {}
        self._rid: dict[tuple[int, str], int] = {}
        self.res_names: list[tuple[int, str]] = []
        self.iv_res = array("q")
        self.iv_start = array("d")
        self.iv_end = array("d")
        self.iv_busy = array("d")
        self.n_hops = 0
        # pending batch: rows of completed ops, and per op (op_id, n rows, t_issue, t_end)
        self._rows: list[tuple] = []
        self._seg_op: list[int] = []
        self._seg_n: list[int] = []
        self._seg_issue: list[float] = []
        self._seg_end: list[float] = []

    def rid(self, node: int, stage: str) -> int:
        """Invariant resource id of a node-side hop (links use their own index)."""
        rid = self._rid.get((node, stage))
        if rid is None:
            key = (self.res_alias.get(node, node), "compute" if stage in _COMPUTE else stage)
            rid = self._res.get(key, -1)
            if rid < 0:
                rid = self._res[key] = self.n_links + len(self.res_names)
                self.res_names.append(key)
            self._rid[(node, stage)] = rid
        return rid

    def hop(self, op: int, tile: int, stage: str, node: int, link: int, enter: float,
            leave: float, busy: float, queue: float, nbytes: int) -> None:
        lst = self._open.get(op)
        if lst is None:
            lst = self._open[op] = []
        lst.append((enter, tile, stage, node, link, leave, busy, queue, nbytes))
        if busy > 0:
            if link < 0:
                link = self._rid.get((node, stage)) or self.rid(node, stage)
            self.iv_res.append(link)
            self.iv_start.append(enter + queue)
            self.iv_end.append(leave)
            self.iv_busy.append(busy)

    def hops_bulk(self, op: int, rows: list[tuple], iv_res: list[int], iv_start: list[float],
                  iv_end: list[float], iv_busy: list[float]) -> None:
        """Add several hop rows of one op at once (rows in creation order), with their
        invariant intervals (already filtered to ``busy > 0``)."""
        lst = self._open.get(op)
        if lst is None:
            self._open[op] = rows
        else:
            lst.extend(rows)
        if iv_res:
            self.iv_res.extend(iv_res)
            self.iv_start.extend(iv_start)
            self.iv_end.extend(iv_end)
            self.iv_busy.extend(iv_busy)

    def op_done(self, op: int, t_issue: float, t_start: float, t_end: float, engine: str) -> None:
        rows = self._open.pop(op, None)
        self.t_issue[op] = t_issue
        self.t_start[op] = t_start
        self.t_end[op] = t_end
        self.engine[op] = engine
        if rows:
            self._rows.extend(rows)
            self._seg_op.append(op)
            self._seg_n.append(len(rows))
            self._seg_issue.append(t_issue)
            self._seg_end.append(t_end)
            if len(self._rows) >= self.batch_rows:
                self.flush()

    def flush(self) -> None:
        """Finalise the pending batch (hop, crit, per-op t_end / queue) and write it."""
        rows = self._rows
        if not rows:
            return
        n = len(rows)
        lens = np.array(self._seg_n, dtype=np.int64)
        ops = np.array(self._seg_op, dtype=np.int64)
        nseg = len(lens)
        seg = np.repeat(np.arange(nseg), lens)
        starts = np.zeros(nseg, dtype=np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        ends = starts + lens - 1
        enter, tile, stage, node, link, leave, busy, queue, nbytes = zip(*rows, strict=True)
        enter = np.array(enter, dtype=np.float64)
        leave = np.array(leave, dtype=np.float64)
        queue = np.array(queue, dtype=np.float64)
        issue = np.array(self._seg_issue, dtype=np.float64)
        t_end = np.maximum(np.array(self._seg_end, dtype=np.float64),
                           np.maximum.reduceat(leave, starts))
        # crit: rows sorted (stably) by t_leave within their op
        lo = np.lexsort((leave, seg))
        lv = leave[lo]
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
        # hop order: rows sorted (stably) by t_enter within their op
        order = np.lexsort((enter, seg))
        qmin = np.minimum(queue[order], crit[order]).tolist()
        qsum = [sum(qmin[a:a + k]) for a, k in zip(starts.tolist(), self._seg_n, strict=True)]
        self.t_end[ops] = t_end
        self.queue[ops] = qsum
        c = self.hops.columns
        c[0] = ops[seg]
        c[1] = (np.arange(n) - starts[seg]).astype(np.int32)
        c[2] = np.array(tile, dtype=np.int32)[order]
        c[3] = [stage[i] for i in order.tolist()]     # str list: pyarrow's fast path
        c[4] = np.array(node, dtype=np.int32)[order]
        c[5] = np.array(link, dtype=np.int32)[order]
        c[6] = enter[order]
        c[7] = leave[order]
        c[8] = np.array(busy, dtype=np.float64)[order]
        c[9] = queue[order]
        c[10] = crit[order]
        c[11] = np.array(nbytes, dtype=np.int64)[order]
        self.n_hops += n
        self._rows = []
        self._seg_op, self._seg_n, self._seg_issue, self._seg_end = [], [], [], []
        self.hops.commit(n)
        self.hops.flush()

    def close(self) -> None:
        """Finalise the last batch and close the hop writer (atomic rename)."""
        self.flush()
        self.hops.close()

    @property
    def open_ops(self) -> list[int]:
        return sorted(self._open)
