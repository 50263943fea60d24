"""The timeline's transfer flows as columns (``perfetto._flows``; issue 22, target 2).

A transfer's flow starts on its issuing op's slice (``s``), steps through each link slice it
crossed in path order (``t``), and ends on the matching receive for an IPCQ send, else on
its last link slice (``f``). ``fabric_slices`` hands each link slice's (op_id, tile, hop, pid,
tid, start) to ``Chains`` as arrays, a batch at a time; ``chain_flows`` sorts them by (op_id,
tile, hop, pid, tid, start) -- the order of the chains' keys and of each chain's sorted tuples
before -- and encodes the points of the first ``limit`` chains whose op has a slice, byte for
byte what the per-point f-strings wrote (gemm at a million ops: 50,000 flows, ~290 k points;
a dict of tuple lists and a Python call per point were ~1 CPU s of the report).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from kbtrace.analysis._perfetto_ops import Encoded, _ints, _joined, us_strings

__all__ = ["Chains", "chain_flows"]

_I64 = np.int64
#: points encoded at a time
_ROWS = 1 << 16


class Chains:
    """The link slices of transfers, as columns appended a batch at a time."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, ...]] = []

    def add(self, op_id: np.ndarray, tile: np.ndarray, hop: np.ndarray, pid: np.ndarray,
            tid: np.ndarray, s: np.ndarray) -> None:
        if len(op_id):
            self._parts.append(tuple(np.asarray(x, _I64)
                                     for x in (op_id, tile, hop, pid, tid, s)))

    def columns(self) -> tuple[np.ndarray, ...]:
        """(op_id, tile, hop, pid, tid, s), sorted by all six in that order."""
        if not self._parts:
            return tuple(np.empty(0, _I64) for _ in range(6))
        cols = tuple(np.concatenate(c) for c in zip(*self._parts, strict=True))
        o = np.lexsort(cols[::-1])
        return tuple(c[o] for c in cols)

    def to_dict(self) -> dict[tuple[int, int], list[tuple[int, int, int, int]]]:
        """(op_id, tile) -> its (hop, pid, tid, s) tuples, sorted (for tests)."""
        out: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
        op, tile, *rest = (c.tolist() for c in self.columns())
        for o, t, *row in zip(op, tile, *rest, strict=True):
            out.setdefault((o, t), []).append((row[0], row[1], row[2], row[3]))
        return out


def _in_slot(slot: Any, op: np.ndarray) -> np.ndarray:
    """``op in slot`` for each op id."""
    ok = (op >= 0) & (op < len(slot.has))
    ok[ok] = slot.has[op[ok]]
    return ok


def chain_flows(chains: Chains, slot: Any, recv_of: dict[int, int], limit: int
                ) -> tuple[int, int, Iterator[Encoded]]:
    """(chains whose op has a slice, flows drawn = min(that, ``limit``), their points'
    ``Encoded`` batches). Flow ids 1, 2, ... in chain order; every point inside the slice it
    binds to (the start clamped to the op's slice, the end to the receive's)."""
    op, tile, _hop, pid, tid, s = chains.columns()
    first = (np.flatnonzero(np.r_[True, (op[1:] != op[:-1]) | (tile[1:] != tile[:-1])])
             if len(op) else np.empty(0, _I64))
    c_op = op[first]
    keep = np.flatnonzero(_in_slot(slot, c_op))
    total, n = len(keep), min(len(keep), max(0, limit))
    keep = keep[:n]
    return total, n, _points(keep, first, len(op), c_op, pid, tid, s, slot, recv_of)


def _points(keep: np.ndarray, first: np.ndarray, n_rows: int, c_op: np.ndarray,
            pid: np.ndarray, tid: np.ndarray, s: np.ndarray, slot: Any,
            recv_of: dict[int, int]) -> Iterator[Encoded]:
    if not len(keep):
        return
    a = first[keep]                                     # each flow's rows: [a, b)
    b = np.r_[first[1:], n_rows][keep]
    ops = c_op[keep]
    o_pid, o_tid = slot.pt[ops, 0].astype(_I64), slot.pt[ops, 1].astype(_I64)
    o_s, o_e = slot.se[ops, 0], slot.se[ops, 1]
    # sends with a matching receive: the flow's category, and its end on the receive's slice
    is_recv = np.zeros(len(ops), bool)
    dst = np.full(len(ops), -1, _I64)
    if recv_of:
        keys = np.fromiter(recv_of.keys(), _I64, len(recv_of))
        vals = np.fromiter(recv_of.values(), _I64, len(recv_of))
        o = np.argsort(keys, kind="stable")
        keys, vals = keys[o], vals[o]
        at = np.minimum(np.searchsorted(keys, ops), len(keys) - 1)
        is_recv = keys[at] == ops
        dst = np.where(is_recv, vals[at], -1)
    has_dst = is_recv & _in_slot(slot, dst)
    d = np.where(has_dst, dst, 0)
    fid = np.arange(1, len(ops) + 1, dtype=_I64)
    length = b - a
    # the points of flow j: its start, its hops a .. b - 1, and the receive's end if any
    n_pts = 1 + length + has_dst
    flow = np.repeat(np.arange(len(ops)), n_pts)
    pos = np.arange(len(flow)) - np.repeat(np.cumsum(n_pts) - n_pts, n_pts)
    is_start, is_end = pos == 0, has_dst[flow] & (pos == n_pts[flow] - 1)
    row = np.clip(a[flow] + pos - 1, 0, max(n_rows - 1, 0))
    p_pid = np.where(is_start, o_pid[flow], np.where(is_end, slot.pt[d, 0][flow], pid[row]))
    p_tid = np.where(is_start, o_tid[flow], np.where(is_end, slot.pt[d, 1][flow], tid[row]))
    first_s, last_s = s[a], s[b - 1]
    ts = np.where(is_start, np.maximum(o_s, np.minimum(first_s, o_e))[flow],
                  np.where(is_end, np.maximum(slot.se[d, 0], np.minimum(
                      last_s, slot.se[d, 1]))[flow], s[row]))
    # ph: s, t, or f (the receive's end, else the last hop)
    ph = np.where(is_start, 0, np.where(is_end | (~has_dst[flow] & (pos == n_pts[flow] - 1)),
                                        2, 1))
    ph_text = pa.array(["s", "t", "f"], pa.string())
    tail = pa.array(['"}', '"}', '","bp":"e"}'], pa.string())
    cat = pa.array(["transfer", "ipcq"], pa.string())
    c = is_recv[flow].astype(_I64)
    for i in range(0, len(flow), _ROWS):
        j = slice(i, i + _ROWS)
        phj, cj = pa.array(ph[j]), pa.array(c[j])
        catj = cat.take(cj)
        yield Encoded(_joined([
            '{"ph":"', ph_text.take(phj), '","id":', _ints(fid[flow[j]]), ',"pid":',
            _ints(p_pid[j]), ',"tid":', _ints(p_tid[j]), ',"ts":"', us_strings(ts[j]),
            '","name":"', catj, '","cat":"flow.', catj, tail.take(phj)]), len(ph[j]))
