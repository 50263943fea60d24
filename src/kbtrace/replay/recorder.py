"""Columnar recording of replay results: op timing arrays + batched hop rows.

Hops are buffered per op while the op is in flight (one small tuple per hop)
and, when the op completes, get their ``hop`` index (path order = order of
``t_enter``, ties by creation) and their ``crit_ns``: hops sorted by
``t_leave`` advance the op's completion frontier; each hop is attributed
``t_leave - frontier`` (clipped at 0), starting from ``t_issue``. An op's
``crit_ns`` therefore sum to ``t_end - t_issue``. Rows then go to a
``BatchWriter`` (per-column lists, flushed every ``batch_rows``), so memory is
bounded by the ops in flight plus one batch. Rows are in op-completion order.

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
        self._open: dict[int, list[tuple]] = {}
        self.t_issue = np.full(n_ops, np.nan)
        self.t_start = np.full(n_ops, np.nan)
        self.t_end = np.full(n_ops, np.nan)
        self.queue = np.zeros(n_ops)
        self.engine: list[str | None] = [None] * n_ops
        self.n_links = n_links
        self.res_alias = res_alias or {}
        self._res: dict[tuple[int, str], int] = {}
        self.res_names: list[tuple[int, str]] = []
        self.iv_res = array("q")
        self.iv_start = array("d")
        self.iv_end = array("d")
        self.iv_busy = array("d")
        self.n_hops = 0

    def hop(self, op: int, tile: int, stage: str, node: int, link: int, enter: float,
            leave: float, busy: float, queue: float, nbytes: int) -> None:
        lst = self._open.get(op)
        if lst is None:
            lst = self._open[op] = []
        lst.append((enter, tile, stage, node, link, leave, busy, queue, nbytes))
        if busy > 0:
            if link >= 0:
                rid = link
            else:
                key = (self.res_alias.get(node, node), "compute" if stage in _COMPUTE else stage)
                rid = self._res.get(key, -1)
                if rid < 0:
                    rid = self._res[key] = self.n_links + len(self.res_names)
                    self.res_names.append(key)
            self.iv_res.append(rid)
            self.iv_start.append(enter + queue)
            self.iv_end.append(leave)
            self.iv_busy.append(busy)

    def op_done(self, op: int, t_issue: float, t_start: float, t_end: float, engine: str) -> None:
        rows = self._open.pop(op, None)
        if rows:
            n = len(rows)
            leave_c = [r[5] for r in rows]
            t_end = max(t_end, max(leave_c))
            crit_c = [0.0] * n
            front = t_issue
            i = 0
            for i in sorted(range(n), key=leave_c.__getitem__):   # ties: creation order
                lv = leave_c[i]
                if lv > front:
                    crit_c[i] = lv - front
                    front = lv
            if t_end > front:
                crit_c[i] += t_end - front
            order = sorted(range(n), key=[r[0] for r in rows].__getitem__)  # hop = path order
            rows = [rows[j] for j in order]
            crit = [crit_c[j] for j in order]
            enter, tile, stage, node, link, leave, busy, queue, nbytes = zip(*rows, strict=True)
            c = self.hops.columns
            c[0].extend([op] * n)
            c[1].extend(range(n))
            c[2].extend(tile)
            c[3].extend(stage)
            c[4].extend(node)
            c[5].extend(link)
            c[6].extend(enter)
            c[7].extend(leave)
            c[8].extend(busy)
            c[9].extend(queue)
            c[10].extend(crit)
            c[11].extend(nbytes)
            self.queue[op] = sum(q if q < cr else cr for q, cr in zip(queue, crit, strict=True))
            self.n_hops += n
            self.hops.commit(n)
        self.t_issue[op] = t_issue
        self.t_start[op] = t_start
        self.t_end[op] = t_end
        self.engine[op] = engine

    @property
    def open_ops(self) -> list[int]:
        return sorted(self._open)
