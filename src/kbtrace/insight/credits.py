"""IPCQ credits for the re-timing (``retime``): which receive's credit each send waits for.

Replay (``replay.engine.ipcq_channel``, ``replay.pe``): one buffer of ``n_slots`` per
(launch, sender, receiver, direction); a send takes ``k = max(1, min(n_slots,
ceil(nbytes / slot_bytes)))`` slots before it leaves (FIFO; its first ``ipcq`` row waits
for them) and the matching receive returns them when it completes. Receives complete in
order, so with ``K_i`` the slots the first ``i`` sends take, send ``i`` needs the credits
of the first ``J`` receives, ``J`` the smallest with ``n_slots + K_J >= K_i`` (none when
``K_i <= n_slots``). Another slot count or slot size changes ``J``: the re-timing then binds
each send's credit row to the end of receive ``J`` on the new timeline
(``Credits.binders``). A receive that ended after the send's credit row in the recording
is used at its recorded end (the pass goes in recorded order), and counted, so the
estimate is flagged there.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["Credits"]


class Credits:
    """The sends of a run, their credit rows, channels and matching receives."""

    def __init__(self, ops: dict[str, list[Any]], op_row: np.ndarray, seg_op: np.ndarray,
                 first: np.ndarray, last: np.ndarray, stage: np.ndarray, params: Any) -> None:
        p = params.pe.ipcq
        self.n_old, self.slot_old = int(p.n_slots), int(p.slot_bytes)
        recv_of: dict[int, int] = {}
        for oid, kind, m in zip(ops["op_id"], ops["kind"], ops["match_op_id"], strict=True):
            if kind == "recv" and m is not None:
                recv_of[int(m)] = int(oid)
        chans: dict[tuple[Any, ...], list[tuple[int, int, int, int, int]]] = {}
        for i, kind in enumerate(ops["kind"]):
            if kind != "send":
                continue
            oid = int(ops["op_id"][i])
            o = int(op_row[oid]) if oid < len(op_row) else -1
            r = recv_of.get(oid)
            ro = int(op_row[r]) if r is not None and r < len(op_row) else -1
            if o < 0 or ro < 0:
                continue
            rows = np.flatnonzero(stage[first[o]:last[o]] == "ipcq")
            if not len(rows):
                continue
            over = (json.loads(ops["extra_json"][i]).get("ipcq", {})
                    if ops["extra_json"][i] else {})
            key = (ops["launch"][i], ops["program"][i],
                   -1 if ops["peer_program"][i] is None else ops["peer_program"][i],
                   ops["direction"][i], over.get("n_slots"), over.get("slot_bytes"))
            chans.setdefault(key, []).append((oid, int(first[o] + rows[0]), ro,
                                              int(ops["nbytes"][i] or 0), o))
        self.chans = {k: sorted(v) for k, v in chans.items()}
        self.rows = np.array(sorted(r for v in self.chans.values() for _o, r, *_x in v),
                             dtype=np.int64)
        self._old = self._binders(self.n_old, self.slot_old)

    def _binders(self, n_slots: int, slot_bytes: int) -> dict[int, int]:
        """Per send's credit row, the op row of the receive whose credit it waits for
        (-1: none)."""
        out: dict[int, int] = {}
        for key, sends in self.chans.items():
            n = int(key[4]) if key[4] is not None else n_slots
            sb = int(key[5]) if key[5] is not None else slot_bytes
            k = np.array([max(1, min(n, -(-nb // sb))) for _o, _r, _ro, nb, _so in sends])
            cum = np.cumsum(k)
            need = cum - n                          # returns needed before send i goes
            j = np.searchsorted(cum, need, side="left")   # receives 0..j must be back
            for (_o, row, _ro, _nb, _so), ji, nd in zip(sends, j.tolist(), need.tolist(),
                                                         strict=True):
                out[row] = sends[ji][2] if nd > 0 else -1
        return out

    def binders(self, params: Any) -> dict[int, int] | None:
        """The credit rows whose receive changes on a topology with ``params`` (row ->
        receive op row, -1 none), or None when the slot count and size are unchanged."""
        p = params.pe.ipcq
        if (int(p.n_slots), int(p.slot_bytes)) == (self.n_old, self.slot_old):
            return None
        new = self._binders(int(p.n_slots), int(p.slot_bytes))
        return {r: v for r, v in new.items() if v != self._old.get(r)}

    def events(self, ev: list[tuple[Any, ...]], ev_at: dict[int, int], end: list[float],
               start: list[float], params: Any
               ) -> tuple[list[tuple[Any, ...]], list[tuple[int, int]]]:
        """The re-timing's events (``Retimer.ev``) with each send's credit row bound to the
        receive whose credit it waits for with ``params``' slot count (binder kind 2: an op's
        end), and the (row, receive) pairs whose receive ended after the row's recorded
        service ``start`` (the pass in recorded order reaches those late)."""
        ov = self.binders(params)
        if not ov:
            return ev, []
        evs = list(ev)
        stale = []
        for row, r in ov.items():
            i = ev_at[row]
            e = evs[i]
            evs[i] = (1, e[1], e[2], 2 if r >= 0 else 4, r, *e[5:])
            if r >= 0 and end[r] > start[row] + 1e-6:
                stale.append((row, r))
        return evs, stale
