"""Per-PE HBM controller slice (ADR-0034): address-selected pseudo-channels.

The controller is the single owner of its pseudo-channel state. A burst at
physical address ``addr`` lands on ``pc = (addr >> log2(burst_bytes)) &
(num_pcs - 1)`` and commits at ``start = max(t, pc_avail[pc]) (+ turnaround
penalty)``, ``finish = start + nbytes / (pc_bw_gbps * efficiency)``; reads and
writes share ``pc_avail`` (one command bus per PC). Both fidelity modes call the
same arithmetic, so HBM timing never differs between them for the same
arrival times.
"""

from __future__ import annotations

from kbtrace.topology.params import HbmParams

__all__ = ["HbmController"]


class HbmController:
    __slots__ = ("node_idx", "pc_avail", "last_dir", "shift", "mask", "bw", "burst",
                 "penalty", "n_pcs", "busy_ns")

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
        self.busy_ns = 0.0

    def commit(self, addr: int, nbytes: int, t: float, write: int) -> float:
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
        self.busy_ns += dur
        return finish

    def read(self, addr: int, nbytes: int, t: float) -> list[float]:
        """Schedule every burst of a read that arrived at ``t``; finish time per burst.

        Same arithmetic as ``commit`` per burst, inlined (the hot loop of fast mode).
        """
        burst, shift, mask, bw, pen = self.burst, self.shift, self.mask, self.bw, self.penalty
        avail, last_dir = self.pc_avail, self.last_dir
        busy = self.busy_ns
        out = []
        off = 0
        full = burst / bw
        while off < nbytes:
            if nbytes - off > burst:
                sz, dur = burst, full
            else:
                sz = nbytes - off
                dur = sz / bw
            pc = ((addr + off) >> shift) & mask
            start = avail[pc]
            if start < t:
                start = t
            if pen and last_dir[pc] == 1:
                start += pen
            finish = start + dur
            avail[pc] = finish
            last_dir[pc] = 0
            busy += dur
            out.append(finish)
            off += sz
        self.busy_ns = busy
        return out

    def write_stream(self, addr: int, nbytes: int, head: float, tail: float) -> float:
        """Commit a write whose flits arrive evenly between ``head`` and ``tail``; last finish.

        Same arithmetic as ``commit`` per burst, inlined.
        """
        burst, shift, mask, bw, pen = self.burst, self.shift, self.mask, self.bw, self.penalty
        avail, last_dir = self.pc_avail, self.last_dir
        busy = self.busy_ns
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
            t = head + i * step
            pc = ((addr + off) >> shift) & mask
            start = avail[pc]
            if start < t:
                start = t
            if pen and last_dir[pc] == 0:
                start += pen
            f = start + dur
            avail[pc] = f
            last_dir[pc] = 1
            busy += dur
            if f > last:
                last = f
            off += sz
        self.busy_ns = busy
        return last
