"""Per-PE HBM controller slice (ADR-0034): address-selected pseudo-channels.

The controller is the single owner of its pseudo-channel state. A burst at
physical address ``addr`` lands on ``pc = (addr >> log2(burst_bytes)) &
(num_pcs - 1)`` and commits at ``start = max(t, pc_avail[pc]) (+ turnaround
penalty)``, ``finish = start + nbytes / (pc_bw_gbps * efficiency)``; reads and
writes share ``pc_avail`` (one command bus per PC). Both fidelity modes call the
same arithmetic, so HBM timing never differs between them for the same
arrival times -- with one exception. fast mode commits a whole write when its head
arrives, for the times its bursts will arrive (evenly between head and tail): those not yet
arrived are booked ahead (``write_stream``, with ``pc_iv`` set: per PC, the bursts booked
ahead in arrival order, ``pc_avail`` the end of what has arrived). Each PC still serves in
arrival order, as flit mode's, which commits each flit as it arrives: a read, or a burst
that arrives before bursts booked ahead, goes before them, and they move back one after
another (``_rechain``), each moved write's completion with them (``heads.HbmWrite.push``).
(Four readers and three writers of one slice: fast 2.02% late, per-op p95 170%, when writes
queued reads behind their bursts booked ahead; 1.61% and 65% when each took the earliest
gap; 0.00% and 26% in arrival order.)

Pseudo-channel log (``ReplayOptions.hbm_pcs``, off by default): with ``log`` set to a list,
every service the controller grants is appended as ``(op_id, pc, write, start, finish,
nbytes)`` -- one entry per burst, or per run of back-to-back bursts of one read on one PC --
and ``pc_table`` merges each op's back-to-back services on a PC into one row of
``schema.HBM_PCS`` (``hbm_pcs.parquet``: the Perfetto export's per-pseudo-channel tracks).
The callers name the op they serve in ``op_id``; without a log nothing is kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from kbtrace import schema
from kbtrace.topology.params import HbmParams

__all__ = ["HbmController", "Bursts", "known_bursts", "pc_table"]


class Bursts:
    """A read's burst finish times, worked out when first asked for (``times``): fast mode
    keeps them with each flow an HBM read sends (``fair.Flow.rd``), and reads them only where
    a stream meets the read at its first link, so most reads never build the list (a boxed
    float per burst: ~26 per op on gemm). ``f0[j]``: when the read's ``j``-th pseudo-channel
    started on it (its turnaround penalty included); ``times`` makes the same additions in the
    same order as ``HbmController.read_into``'s running sum on each pseudo-channel."""
    __slots__ = ("n", "npcs", "full", "tail", "f0", "_t")

    def __init__(self) -> None:
        self.n = self.npcs = 0
        self.full = self.tail = 0.0
        self.f0: list[float] = []
        self._t: list[float] | None = None

    def times(self) -> list[float]:
        """Each burst's finish time, in burst order."""
        if self._t is None:
            n, npcs, full, tail = self.n, self.npcs, self.full, self.tail
            out = [0.0] * n
            for j in range(len(self.f0)):
                cnt = (n - 1 - j) // npcs + 1
                k_tail = cnt - 1 if j + (cnt - 1) * npcs == n - 1 else -1
                f = self.f0[j]
                for k in range(cnt):
                    f += tail if k == k_tail else full
                    out[j + k * npcs] = f
            self._t = out
        return self._t


def known_bursts(times: list[float]) -> Bursts:
    """``Bursts`` whose times are given (``FastFabric.send`` takes a list too)."""
    b = Bursts()
    b._t = times
    return b


class HbmController:
    __slots__ = ("node_idx", "pc_avail", "last_dir", "shift", "mask", "bw", "burst",
                 "penalty", "n_pcs", "pc_iv", "log")

    def __init__(self, node_idx: int, p: HbmParams) -> None:
        self.node_idx = node_idx
        self.n_pcs = p.pcs_per_pe
        self.pc_avail = [0.0] * p.pcs_per_pe
        self.last_dir = [-1] * p.pcs_per_pe
        self.shift = max(0, p.burst_bytes.bit_length() - 1)
        self.mask = p.pcs_per_pe - 1
        self.bw = p.pc_bw_gbps * p.efficiency
        self.burst = p.burst_bytes
        self.penalty = p.switch_penalty_ns
        #: fast mode: per PC, the write bursts booked ahead of their arrival (``write_stream``)
        self.pc_iv: list[list[list[Any]]] | None = None
        self.log: list[tuple[int, int, int, float, float, int]] | None = None   # hbm_pcs

    def commit(self, addr: int, nbytes: int, t: float, write: int, op_id: int = -1) -> float:
        """Commit one burst arriving at ``t``; return its finish time."""
        pc = (addr >> self.shift) & self.mask
        start = self.pc_avail[pc]
        if start < t:
            start = t
        if self.penalty and self.last_dir[pc] not in (-1, write):
            start += self.penalty
        dur = nbytes / self.bw
        finish = start + dur
        self.pc_avail[pc] = finish
        self.last_dir[pc] = write
        if self.log is not None:
            self.log.append((op_id, pc, write, start, finish, nbytes))
        return finish

    def read(self, addr: int, nbytes: int, t: float, op_id: int = -1) -> list[float]:
        """Schedule every burst of a read that arrived at ``t``; finish time per burst."""
        return self.read_bursts(addr, nbytes, t, op_id)[0]

    def read_bursts(self, addr: int, nbytes: int, t: float,
                    op_id: int = -1) -> tuple[list[float], float, float]:
        """``read``, with its (first, last) burst finish times (``read_into``'s, no pass over
        the list); no bursts and (t, t) for ``nbytes <= 0``."""
        if nbytes <= 0:
            return [], t, t
        b, first, last = self.read_lazy(addr, nbytes, t, op_id)
        return b.times(), first, last

    def read_lazy(self, addr: int, nbytes: int, t: float,
                  op_id: int = -1) -> tuple[Bursts, float, float]:
        """``read_bursts`` with the times left to be asked for (``Bursts.times``): the same PC
        state and (first, last); ``nbytes > 0``."""
        b = Bursts()
        first, last = self.read_into(addr, nbytes, t, op_id, b)
        return b, first, last

    def read_span(self, addr: int, nbytes: int, t: float,
                  op_id: int = -1) -> tuple[float, float]:
        """``read`` reduced to its (first, last) burst finish times: same PC state, same bits."""
        if nbytes <= 0:
            return t, t
        return self.read_into(addr, nbytes, t, op_id)

    def read_into(self, addr: int, nbytes: int, t: float, op_id: int = -1,
                  lazy: Bursts | None = None) -> tuple[float, float]:
        """Schedule a read's bursts (``nbytes > 0``); return (first, last) finish: ``min`` /
        ``max`` of the bursts' (a PC's finish times only grow) without a list of them.
        ``lazy``: filled in so that it can work each burst's out when asked (``Bursts``).

        Same arithmetic as ``commit`` per burst. Consecutive bursts go round-robin over
        the pseudo-channels (burst and PC count are powers of 2), and all arrive at
        ``t``, so on one PC every burst after the first starts when the previous one
        finishes: the PC's finish times are a running sum (the same additions in the
        same order as burst-by-burst ``commit`` calls).
        """
        burst, shift, mask, bw = self.burst, self.shift, self.mask, self.bw
        if burst != 1 << shift or self.n_pcs & mask:    # pragma: no cover - params forbid
            fs = [self.commit(addr + off, min(burst, nbytes - off), t, 0, op_id)
                  for off in range(0, nbytes, burst)]
            if lazy is not None:
                lazy._t = fs
            return min(fs), max(fs)
        avail, last_dir, pen, npcs = self.pc_avail, self.last_dir, self.penalty, self.n_pcs
        ivs, log = self.pc_iv, self.log
        n = -(-nbytes // burst)
        full = burst / bw
        tail_b = nbytes - (n - 1) * burst
        tail = full if tail_b == burst else tail_b / bw
        p0 = (addr >> shift) & mask
        if lazy is not None:
            lazy.n, lazy.npcs, lazy.full, lazy.tail = n, npcs, full, tail
        first, last = float("inf"), float("-inf")
        for j in range(npcs if n > npcs else n):
            pc = (p0 + j) & mask
            cnt = (n - 1 - j) // npcs + 1
            k_tail = cnt - 1 if j + (cnt - 1) * npcs == n - 1 else -1   # PC's (short) tail burst
            if ivs is not None and ivs[pc]:
                self._fold(pc, t)       # fast: write bursts that arrived by now are final
            f = avail[pc]
            if f < t:
                f = t
            if pen and last_dir[pc] == 1:
                f += pen
            f0 = f
            if lazy is not None:
                lazy.f0.append(f0)
            if k_tail < 0:      # the same additions as ``Bursts.times``, first and last kept
                f += full
                f1 = f
                for _ in range(cnt - 1):
                    f += full
            else:
                for k in range(cnt):
                    f += tail if k == k_tail else full
                    if k == 0:
                        f1 = f
            if f1 < first:
                first = f1
            avail[pc] = f
            if ivs is not None and ivs[pc]:     # fast: write bursts booked ahead queue after
                self._rechain(pc, 0, f)
            last_dir[pc] = 0
            if log is not None:     # the PC's bursts of this read, back to back
                log.append((op_id, pc, 0, f0, f,
                            cnt * burst - (burst - tail_b if k_tail >= 0 else 0)))
            if f > last:
                last = f
        return first, last

    def write_stream(self, addr: int, nbytes: int, head: float, tail: float,
                     now: float, op_id: int = -1, w: Any = None,
                     at: list[float] | None = None) -> float:
        """fast mode: commit a write whose flits arrive evenly between ``head`` (now) and
        ``tail`` (``at``: per burst, when it arrives instead); its last finish. Each PC
        serves in arrival order, as flit mode's, which commits each flit as it arrives: a
        burst arriving by now queues after what arrived before it; one arriving later is
        booked ahead (``pc_iv[pc]``: ``[arrival, duration, finish, write, op, bytes]`` in
        arrival order) and moves back, with its write's completion (``w.push()``), when a
        read or an earlier-arriving burst is booked before it later. ``w``: the write's
        ``heads.HbmWrite`` (its bursts booked ahead are added to ``w.pend``)."""
        burst, shift, mask, bw, pen = self.burst, self.shift, self.mask, self.bw, self.penalty
        avail, last_dir, ivs = self.pc_avail, self.last_dir, self.pc_iv
        assert ivs is not None, "write_stream needs pc_iv (fast mode)"
        n = max(1, -(-nbytes // burst))
        step = (tail - head) / (n - 1) if n > 1 else 0.0
        last = head
        off = 0
        full = burst / bw
        for i in range(n):
            if nbytes - off > burst:
                sz, dur = burst, full
            else:
                sz = nbytes - off
                dur = sz / bw
            t = head + i * step if at is None else at[i]
            pc = ((addr + off) >> shift) & mask
            if pen and last_dir[pc] == 0:
                t += pen
            last_dir[pc] = 1
            pend = ivs[pc]
            if pend:
                self._fold(pc, now)
            if t <= now:                    # arrived: after what arrived before it
                s0 = avail[pc]
                f = (t if t > s0 else s0) + dur
                avail[pc] = f
                if self.log is not None:
                    self.log.append((op_id, pc, 1, f - dur, f, sz))
                if pend:
                    self._rechain(pc, 0, f)
            else:                           # booked ahead, in arrival order
                k = len(pend)
                while k and pend[k - 1][0] > t:
                    k -= 1
                prev = pend[k - 1][2] if k else avail[pc]
                f = (t if t > prev else prev) + dur
                x = [t, dur, f, w, op_id, sz]
                pend.insert(k, x)
                if w is not None:
                    w.pend.append(x)
                if k + 1 < len(pend):
                    self._rechain(pc, k + 1, f)
            if f > last:
                last = f
            off += sz
        return last

    def _fold(self, pc: int, now: float) -> None:
        """fast mode: PC ``pc``'s write bursts booked ahead that have arrived by ``now`` are
        final (nothing can be booked before them any more): into ``pc_avail`` and the log."""
        assert self.pc_iv is not None
        pend = self.pc_iv[pc]
        k = 0
        n = len(pend)
        while k < n and pend[k][0] <= now:
            k += 1
        if k:
            if pend[k - 1][2] > self.pc_avail[pc]:
                self.pc_avail[pc] = pend[k - 1][2]
            if self.log is not None:
                for _t, dur, f, _w, op, sz in pend[:k]:
                    self.log.append((op, pc, 1, f - dur, f, sz))
            del pend[:k]

    def _rechain(self, pc: int, k: int, prev: float) -> None:
        """fast mode: PC ``pc``'s bursts booked ahead from the ``k``-th on start no earlier
        than ``prev``, one after another in arrival order; the writes of those that move
        back move their completion (``push``)."""
        assert self.pc_iv is not None
        moved = []
        for x in self.pc_iv[pc][k:]:
            f = (x[0] if x[0] > prev else prev) + x[1]
            if f <= x[2]:           # it (and so every one after it) keeps its time
                break
            x[2] = f
            prev = f
            if x[3] is not None and x[3] not in moved:
                moved.append(x[3])
        for w in moved:
            w.push()

    def settle(self) -> None:
        """fast mode, at the end of the run: every burst booked ahead is final (logged)."""
        if self.pc_iv is not None:
            for pc in range(self.n_pcs):
                self._fold(pc, float("inf"))


def pc_table(ctrls: Iterable[HbmController]) -> pa.Table:
    """The controllers' pseudo-channel logs as ``schema.HBM_PCS`` rows: per controller and PC
    in time order, an op's services that follow each other without a gap merged into one row
    (one row per op per PC for an uncontended read); sorted by (node_idx, pc, t_start_ns)."""
    node, op, pc, wr, t0, t1, nb = [], [], [], [], [], [], []
    for h in ctrls:
        h.settle()
        if not h.log:
            continue
        a = np.array([e[:5] for e in h.log], dtype=np.float64)
        b = np.array([e[5] for e in h.log], dtype=np.int64)
        order = np.lexsort((a[:, 0], a[:, 3], a[:, 1]))   # by pc, start, op
        a, b = a[order], b[order]
        # a new row where the PC, op or direction changes or the service does not start
        # where the previous one ended (to 1e-6 ns: a gap-fitted burst's start is its
        # finish minus its duration)
        new = np.ones(len(a), dtype=bool)
        new[1:] = ((a[1:, 1] != a[:-1, 1]) | (a[1:, 0] != a[:-1, 0])
                   | (a[1:, 2] != a[:-1, 2]) | (np.abs(a[1:, 3] - a[:-1, 4]) > 1e-6))
        first = np.flatnonzero(new)
        last = np.r_[first[1:] - 1, len(a) - 1]
        node.append(np.full(len(first), h.node_idx, dtype=np.int32))
        op.append(a[first, 0].astype(np.int64))
        pc.append(a[first, 1].astype(np.int32))
        wr.append(a[first, 2] != 0)
        t0.append(a[first, 3])
        t1.append(a[last, 4])
        nb.append(np.add.reduceat(b, first))
    cols = [node, op, pc, wr, t0, t1, nb]
    f = schema.HBM_PCS
    arrays = [pa.array(np.concatenate(c), f.field(i).type) if c else
              pa.array([], f.field(i).type) for i, c in enumerate(cols)]
    return pa.Table.from_arrays(arrays, schema=f)
