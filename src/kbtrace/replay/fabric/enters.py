"""Fast mode's hop rows of a flow whose head moved: entered as the head now arrives.

A flow's head that a node serves later than booked (``heads.serve_head``) reaches every
further node later (``fair._push``, ``heads.head_at``); the flow's rows wait for its
completion (``fair.Flow.segs``), so its rows are written once, there, with these times
(``fair.expand``). ``fair._push`` notes each new arrival (``entered``, kept in ``Flow.hn``:
row -> (arrival, start of its link booking)), and ``enter_rows`` writes them, as late as the
model allows: a stream's link booking keeps its time when its head moves (``fair``: its rows
widen over it), and a row's service (``t_enter + queue_ns``) holds its booking, so its row
enters no later than that booking starts (else a link's rows could be busier than their
windows: ``invariants``); a single flit's booking moves with its head (``heads.relink``); no
row enters after the row after it on the path. Only the rows change: the flow's timing goes
on from the booked enter times (``fair._times``).

Imports nothing of the package (``fair`` imports this).
"""

from __future__ import annotations

from typing import Any

__all__ = ["INF", "entered", "enter_rows", "row_at"]

INF = float("inf")


def entered(g: Any, j: int, ha: float, s0: float) -> None:
    """Flow ``g``'s head now enters its row ``j`` at ``ha``, later than booked: noted for its
    rows (``fair.expand``), not for its timing (``fair._push`` and ``heads.head_at`` go on
    from the booked enter times, ``fair._times``). ``s0``: where its link booking there starts
    (it keeps its time: the row's service, ``t_enter + queue_ns``, starts no later), or
    ``INF``."""
    hn = g.hn
    if hn is None:
        g.hn = {j: (ha, s0)}
        return
    v = hn.get(j)
    if v is None or ha > v[0]:
        hn[j] = (ha, s0)


def enter_rows(f: Any, rows: list) -> None:
    """Flow ``f``'s rows entered as ``f.hn`` notes where that is later: no later than their
    link booking's start less their queueing (a single flit's as ``heads.relink`` left it),
    nor than the rows after them (in path order), their queueing no longer than fits
    (``row_at``)."""
    hn = f.hn
    sl = f.sl
    m = INF
    for k in range(len(rows) - 1, -1, -1):
        rw = rows[k]
        x = rw[5]
        v = hn.get(k)
        if v is not None:
            x, s0 = v
            q = rw[8]
            if sl is not None and k in sl and sl[k]:
                s0 = sl[k][0][0]
            if x > s0 - q:
                x = s0 - q
        if x > m:
            x = m
        m = x
        if x > rw[5]:
            row_at(rows, k, x, rw[6])
    f.hn = None


def row_at(rows: list, k: int, en: float, lv: float) -> None:
    """Row ``k`` entered at ``en``, leaving at ``lv``, its queueing no longer than fits (also
    ``pull``'s)."""
    rw = rows[k]
    q = rw[8]
    if en + q + rw[7] > lv:
        q = lv - rw[7] - en
        if q < 0.0:
            q = 0.0
    rows[k] = (rw[0], rw[1], rw[2], rw[3], rw[4], en, lv, rw[7], q, rw[9])
