"""Physical invariants checked on every replay (InvariantError on violation).

1. No resource busy over 100 %: per resource (a link, or a node's engine
   channel), busy intervals ``[t_enter + queue, t_leave]`` are merged into
   connected windows; the busy time inside a window must not exceed
   ``capacity * window length`` (capacity = DMA channel count, else 1), and no
   single hop may be busier than its own interval, nor have a negative busy time or
   length. Time comparisons allow ``tol(t) = EPS_NS + REL_EPS * |t|`` (relative, so slow
   but legal parameters with huge times do not fail on rounding). Checked *while the replay
   runs*, batch by batch (``BusyCheck``), so memory does not grow with the
   number of hops.
2. Bytes conserved: every transfer delivers exactly the bytes it sent (checked
   per transfer by the fabric at the destination; flit mode counts flits).
3. Per-resource timestamps monotone: each link/node server checks service starts
   never go back (flit mode), reservations are monotone by construction (fast).
4. Every IPCQ send was consumed by its matching recv.
5. Analytical lower bounds: each load/store/h2d/d2h lasts at least its routes'
   ``floor_ns`` (request leg + data leg; the probe formula ``lower_bound_ns`` less the
   node overheads a wormhole transfer hides behind an earlier, slower link), and the
   makespan is at least the largest ``t_issue + lower bound`` and the last launch barrier.
6. No op ends before it starts or starts before it is issued, and every op has an end.

2 and 3 are checked where they happen; 1 as each hop batch is finalised; 4 and 5
by ``check`` at the end of the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbtrace.errors import InvariantError
from kbtrace.replay.colsort import lexsort2
from kbtrace.replay.intervals import EPS_NS, REL_EPS, row_faults, tol

if TYPE_CHECKING:  # pragma: no cover
    from kbtrace.replay.context import SimContext

__all__ = ["check", "BusyCheck", "EPS_NS", "REL_EPS", "tol"]


def _res_name(sim: SimContext, rid: int) -> str:
    topo, rec = sim.topo, sim.rec
    if rid < rec.n_links:
        lk = topo.links[rid]
        return f"link {topo.nodes[lk.src].id}->{topo.nodes[lk.dst].id}"
    node, stage = rec.res_names[rid - rec.n_links]
    return f"{topo.nodes[node].id} ({stage})"


def _cap(sim: SimContext, rid: int) -> int:
    rec = sim.rec
    if rid < rec.n_links:
        return 1
    stage = rec.res_names[rid - rec.n_links][1]
    dma = sim.params.pe.dma
    return dma.read_channels if stage == "dma_read" else dma.write_channels \
        if stage == "dma_write" else 1


def _no_windows() -> tuple[np.ndarray, ...]:
    """Empty window summaries ``(resource, start, end, busy, count)``."""
    e = np.empty(0)
    return np.empty(0, dtype=np.int64), e, e, e, np.empty(0, dtype=np.int64)


class BusyCheck:
    """Invariant 1, streamed over the hop batches of a run.

    ``add(res, start, end, busy, watermark)`` takes the busy intervals of one
    finalised batch and a *watermark*: no interval of a later batch starts
    before it (the recorder passes the earliest issue time of the ops still in
    flight, or now: every row of an op starts at or after the op's issue).
    The new intervals and the windows carried from earlier batches (each a
    summary ``(resource, start, end, busy, count)``, which merges exactly like
    one interval: a window is connected) are swept together, sorted by
    (resource, start); a window opens at a resource's first interval or where
    a start lies beyond the resource's running maximum end (+ ``EPS_NS``). A
    window ending before the watermark can never grow again: it is checked
    (busy <= capacity * length + ``tol`` per interval) and dropped. Open
    windows are carried, so memory is bounded by the windows that reach past
    the oldest op in flight, not by the run's hop count. An interval starting
    before the previous watermark would break that reasoning and is an error.
    ``close()`` checks the rest and returns the highest window utilisation seen.
    """

    def __init__(self, sim: SimContext, kernels: Any = None) -> None:
        """``kernels``: the compiled sort and sweep (``fabric.core.seg_kernels()``), or None
        for the numpy passes (the same windows)."""
        self.sim = sim
        self._kernels = kernels
        self._w = -np.inf                       # watermark of the previous batch
        self._open = _no_windows()
        self._cap = np.zeros(0)                 # capacity per resource id (0 = not looked up)
        self.max_util = 0.0
        self.max_open = 0                       # most windows carried at once (memory)
        self.n_windows = 0                      # windows checked and dropped

    @property
    def n_open(self) -> int:
        return len(self._open[0])

    def add(self, res: np.ndarray, s: np.ndarray, e: np.ndarray, b: np.ndarray,
            watermark: float) -> None:
        if self._kernels is not None and self._compiled_add(res, s, e, b, watermark):
            return
        sim = self.sim
        if len(res):
            negative, over = row_faults(s, e, b)
            neg = np.flatnonzero(negative)
            if neg.size:
                i = int(neg[0])
                raise InvariantError(
                    f"{_res_name(sim, int(res[i]))}: negative time: busy {b[i]:.3f} ns in "
                    f"interval [{s[i]:.3f}, {e[i]:.3f}] ns (a duration below zero)")
            bad = np.flatnonzero(over)
            if bad.size:
                i = int(bad[0])
                raise InvariantError(
                    f"{_res_name(sim, int(res[i]))}: busy {b[i]:.3f} ns inside a "
                    f"{e[i] - s[i]:.3f} ns interval [{s[i]:.3f}, {e[i]:.3f}] ns (over 100%)")
            early = np.flatnonzero(s < self._w - tol(self._w))
            if early.size:
                i = int(early[0])
                raise InvariantError(
                    f"{_res_name(sim, int(res[i]))}: busy interval [{s[i]:.3f}, {e[i]:.3f}] ns "
                    f"starts before {self._w:.3f} ns, the earliest issue time of the ops in "
                    f"flight when the previous hop batch was written (a replay engine bug: an "
                    f"op's rows must not start before it is issued)")
        self._w = max(self._w, watermark)
        self._numpy_add(res, s, e, b)

    def _compiled_add(self, res: np.ndarray, s: np.ndarray, e: np.ndarray, b: np.ndarray,
                      watermark: float) -> bool:
        """``add`` in one compiled call (``segsort.busy_add``: the same checks, windows and
        results as the numpy passes); False where those must decide (a check fails: they
        raise; a time is not finite; resources too far apart to count), nothing done."""
        k = self._kernels
        w = max(self._w, watermark)
        for retry in (False, True):
            got = k.busy_add(*self._open, res, s, e, b, self._w, w, self._cap, EPS_NS, REL_EPS)
            if not isinstance(got, int):
                break
            if got != k.BUSY_CAPACITY or retry:
                return False
            self._caps(np.concatenate((self._open[0], res)))    # resources first seen
        self._w = w
        self._open, shut, u = got
        if shut:
            self.max_util = max(self.max_util, u)
            self.n_windows += shut
        self.max_open = max(self.max_open, self.n_open)
        return True

    def _numpy_add(self, res: np.ndarray, s: np.ndarray, e: np.ndarray, b: np.ndarray) -> None:
        """``add``'s sweep by numpy passes (the watermark already taken)."""
        o_res, o_s, o_e, o_b, o_c = self._open
        if len(o_res):
            res = np.concatenate((o_res, res))
            s, e, b = np.concatenate((o_s, s)), np.concatenate((o_e, e)), np.concatenate((o_b, b))
            c = np.concatenate((o_c, np.ones(len(res) - len(o_c), dtype=np.int64)))
        else:
            c = np.ones(len(res), dtype=np.int64)
        n = len(res)
        if not n:
            return
        order = lexsort2(s, res)
        res, s, e, b, c = res[order], s[order], e[order], b[order], c[order]
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(res[1:], res[:-1], out=first[1:])
        grp = np.cumsum(first) - 1
        by_end = np.argsort(e)      # (ties may go either way: tied ends give the same max)
        rank = np.empty(n, dtype=np.int64)
        rank[by_end] = np.arange(n)
        base = grp * n
        run_max = e[by_end[np.maximum.accumulate(base + rank) - base]]  # per-resource max end
        new = first.copy()
        new[1:] |= s[1:] > run_max[:-1] + tol(run_max[:-1])
        cidx = np.flatnonzero(new)
        self._close((res[cidx], s[cidx], np.maximum.reduceat(e, cidx),
                     np.add.reduceat(b, cidx), np.add.reduceat(c, cidx)))

    def _close(self, w: tuple[np.ndarray, ...]) -> None:
        """Of this batch's windows ``(resource, start, end, busy, count)``, check and drop those
        ending before the watermark; carry the others."""
        shut = w[2] + tol(w[2]) < self._w
        self._check(*(x[shut] for x in w))
        keep = ~shut
        self._open = tuple(x[keep] for x in w)
        self.max_open = max(self.max_open, self.n_open)

    def close(self) -> float:
        """Check every window still open (the run is over); the highest utilisation."""
        self._check(*self._open)
        self._open = _no_windows()
        return self.max_util

    def _caps(self, res: np.ndarray) -> np.ndarray:
        """The capacity of each resource of ``res`` (looked up once per resource)."""
        top = int(res.max()) + 1
        if top > len(self._cap):
            self._cap = np.concatenate((self._cap, np.zeros(top - len(self._cap))))
        miss = np.unique(res[self._cap[res] == 0])
        for r in miss.tolist():
            self._cap[r] = _cap(self.sim, r)
        return self._cap[res]

    def _check(self, res: np.ndarray, ws: np.ndarray, we: np.ndarray, wb: np.ndarray,
               wc: np.ndarray) -> None:
        if not len(res):
            return
        cap = self._caps(res)
        span = we - ws
        over = np.flatnonzero(wb > cap * span + tol(we) * wc)
        if over.size:
            j = int(over[0])
            raise InvariantError(
                f"{_res_name(self.sim, int(res[j]))}: busy {wb[j]:.3f} ns in window "
                f"[{ws[j]:.3f}, {we[j]:.3f}] ns of {span[j]:.3f} ns with capacity "
                f"{int(cap[j])} (over 100%)")
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.where(span > 0, wb / (cap * span), 0.0)
        self.max_util = max(self.max_util, float(u.max(initial=0.0)))
        self.n_windows += len(res)


def check(sim: SimContext, makespan: float) -> None:
    """Invariants 4 and 5 (and the rest of 1) once the run is over and every hop is finalised."""
    if sim.rec.busy is not None:
        sim.rec.busy.close()
    for sid, ev in sorted(sim._ready.items()):      # (keyed by send ids only)
        if not ev.processed:
            raise InvariantError(f"IPCQ send op {sid} was never delivered")
    consumed = set(sim._match.values())
    for oid, prog, seq in sim.source.send_rows:
        if oid not in consumed:
            raise InvariantError(f"IPCQ send op {oid} (program {prog}, seq {seq}) has "
                                 f"no matching recv (unmatched send)")
    rec, fab = sim.rec, sim.fabric
    ti, ts, te = rec.t_issue, rec.t_start, rec.t_end
    back = np.flatnonzero((ts < ti - tol(ts)) | (te < ts - tol(te)) | ~np.isfinite(te))
    if back.size:
        i = int(back[0])
        raise InvariantError(f"op {i} ({sim.source.kind(i)}) has a negative or undefined "
                             f"duration: issue {ti[i]:.3f}, start {ts[i]:.3f}, end {te[i]:.3f} ns")
    lb_end = max((ln["t_barrier_ns"] for ln in sim.launches), default=0.0)
    bounds: dict[tuple, float] = {}
    for ids, lbs, what in _memory_bounds(sim, bounds):
        lb_end = _above_bounds(rec, ids, lbs, what, lb_end, fab.fidelity)
    if makespan + tol(makespan) < lb_end:
        raise InvariantError(f"makespan {makespan:.3f} ns is below the analytical lower bound "
                             f"{lb_end:.3f} ns")


def _above_bounds(rec: Any, ids: np.ndarray | list[int], lbs: np.ndarray | list[float],
                  what: _What | list[tuple[str, int]], lb_end: float, fidelity: str) -> float:
    """Invariant 5 for memory ops ``ids`` (op_id order) with lower bounds ``lbs``: each lasted
    at least its bound (else the first that did not is the error); returns ``lb_end`` raised
    to the latest ``t_issue + bound`` (an undefined one, NaN, is passed over)."""
    if not len(ids):
        return lb_end
    at = np.array(ids, dtype=np.int64)
    lb = np.array(lbs)
    t_end, t_issue = rec.t_end[at], rec.t_issue[at]
    dur = t_end - t_issue
    low = np.flatnonzero(dur + tol(t_end) < lb)
    if low.size:
        i = int(low[0])
        kind, nb = what[i]
        raise InvariantError(f"op {ids[i]} ({kind}, {nb} B) took {dur[i]:.3f} ns, below its "
                             f"analytical lower bound {lbs[i]:.3f} ns ({fidelity} mode)")
    top = np.fmax.reduce(t_issue + lb)
    return lb_end if not top > lb_end else float(top)


def _lower_bound(topo, kind: str, a: int, mem: int, nb: int) -> float:
    """Route lower bound of one memory op: ``a`` is the DMA (load/store) or the host."""
    route = topo.route_summary
    if kind == "load":
        return route(a, mem).floor_ns(0) + route(mem, a).floor_ns(nb)
    if kind == "store":
        return route(a, mem).floor_ns(nb) + route(mem, a).floor_ns(0)
    if kind == "h2d":
        return route(a, mem).floor_ns(nb)
    return route(mem, a).floor_ns(nb)


#: the trace columns the lower bounds read
_MEM_COLS = ["op_id", "sip", "cube", "pe", "src_addr", "dst_addr", "nbytes"]


class _What:
    """``(kind, bytes)`` of the memory ops of a batch, by position (for the message)."""

    def __init__(self, names: list[Any], kinds: np.ndarray, nbytes: np.ndarray) -> None:
        self.names, self.kinds, self.nbytes = names, kinds, nbytes

    def __getitem__(self, i: int) -> tuple[str, int]:
        return self.names[int(self.kinds[i])], int(self.nbytes[i])


def _ints(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An integer column as int64 (uint64 addresses as their bits), nulls as 0."""
    if col.null_count:
        col = pc.fill_null(col, 0)
    a = np.asarray(col.to_numpy() if isinstance(col, pa.Array) else
                   col.combine_chunks().to_numpy())
    return a.view(np.int64) if a.dtype == np.uint64 else a.astype(np.int64)


def _memory_bounds(sim: SimContext, bounds: dict[tuple, float]
                   ) -> Iterator[tuple[np.ndarray, np.ndarray, _What]]:
    """Per read batch of the trace, its loads, stores and host copies: their op ids, route
    lower bounds and ``(kind, bytes)``. A bound is computed once per (kind, DMA or copy end,
    memory node, bytes) (``_lower_bound``, into ``bounds``); addresses are resolved once per
    batch each, in the order the ops first use them, and a DMA looked up once per PE."""
    src, topo = sim.source, sim.topo
    names = src.kind_values
    code = {k: i for i, k in enumerate(names) if k in ("load", "store", "h2d", "d2h")}
    reads = [code[k] for k in ("load", "d2h") if k in code]     # (their source is memory)
    dev = [code[k] for k in ("load", "store") if k in code]
    dmas: dict[tuple[int, ...], int] = {}
    at = 0
    for batch in src.scan(_MEM_COLS):
        n = batch.num_rows
        kinds = src.kinds[at:at + n]
        at += n
        rows = np.flatnonzero(np.isin(kinds, list(code.values())))
        if not len(rows):
            continue
        part = batch.take(pa.array(rows))
        kc = kinds[rows].astype(np.int64)
        ids, sip, cube, pe, sa, da, nb = (_ints(part.column(c)) for c in _MEM_COLS)
        addr = np.where(np.isin(kc, reads), sa, da).view(np.uint64)
        uniq, first, inv = np.unique(addr, return_index=True, return_inverse=True)
        mem_u = np.empty(len(uniq), dtype=np.int64)
        for j in np.argsort(first, kind="stable").tolist():
            mem_u[j] = sim.resolve(int(uniq[j]))
        mem = mem_u[inv.reshape(-1)]
        a = np.empty(len(rows), dtype=np.int64)
        on = np.isin(kc, dev)
        if on.any():
            pes, pinv = _rows_unique((sip[on], cube[on], pe[on]))
            d = np.empty(len(pes), dtype=np.int64)
            for j, pkey in enumerate(pes):
                if pkey not in dmas:
                    dmas[pkey] = topo.pe_node(_coord(*pkey), "dma").idx
                d[j] = dmas[pkey]
            a[on] = d[pinv]
        if not on.all():
            ends = {m: sim.copy_end(m) for m in np.unique(mem[~on]).tolist()}
            a[~on] = [ends[m] for m in mem[~on].tolist()]
        keys, kinv = _rows_unique((kc, a, mem, nb))
        lb_u = np.empty(len(keys))
        for j, (k_, a_, m_, nb_) in enumerate(keys):
            bkey = (str(names[k_]), a_, m_, nb_)
            lb = bounds.get(bkey)
            if lb is None:
                lb = bounds[bkey] = _lower_bound(topo, *bkey)
            lb_u[j] = lb
        yield ids, lb_u[kinv], _What(names, kc, nb)


def _rows_unique(cols: tuple[np.ndarray, ...]) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct rows of equal-length int64 columns (as tuples, in no set order) and
    each row's index among them (each column coded densely, the codes combined into one
    key: ``np.unique(axis=0)`` sorts the rows as bytes, ~10x slower)."""
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for c in cols:
        u, inv = np.unique(c, return_inverse=True)
        key = key * len(u) + inv.reshape(-1)
    _, first, kinv = np.unique(key, return_index=True, return_inverse=True)
    return list(zip(*(c[first].tolist() for c in cols), strict=True)), kinv.reshape(-1)


def _coord(sip: int, cube: int, pe: int) -> Any:
    from kbtrace.topology.model import PeCoord
    return PeCoord(sip, cube, pe)
