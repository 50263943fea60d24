"""Fast mode's stream bodies held at mesh routers by the heads that arrive before them.

Flit mode's mesh router serves one FIFO: a head pays the router's overhead, a body flit
passes, each in arrival order, so a stream's flits that arrive after another head wait for
that head's overhead. Fast mode books a stream's head at a node (``heads.serve_head``) and
its tail by the closed form; here its tail is held. Heads booked before the stream hold its
tail (``body_hold``, from ``routes.hop_seq``: the tail ready at the next link no earlier than
each such head's overhead end plus the flit times of the stream's flits that arrive after
that head); heads booked after it push it (``fair.note_body`` notes the stream per router,
``hold_bodies`` from ``heads.serve_head``: its tail leaves the link later, ``fair._push``).
A head that arrives with the stream's head, served after it, holds it too. A body within
its head's overhead there (a 512 B IPCQ payload: two flits at 256 GB/s, 1 ns within 2 ns) is
taken to arrive evenly; a longer one (a 2 KiB read: eight flits over ~10 ns) as the flow's
booking on the link before serves it (``_work_by``). The free-path closed form does not look
for heads: a stream whose tail reaches a router after a head reserved there is booked hop by
hop at that node (``routes.held``). A head booked later that finds the node free (the closed
form) still does not hold a stream's body.

Found on llama_layer (default.yaml): a 2 KiB read's last flit reached router r0c0 after the
heads of two one-flit reads from the same HBM slice, and flit mode held it 1.6 ns behind them
(``tests/test_replay_bodies.py``).

Imports ``fair``; ``heads`` and ``routes`` import this (no cycle).
"""

from __future__ import annotations

from typing import Any

from kbtrace.replay.fabric.fair import Flow, _push, note_body
from kbtrace.replay.intervals import TIME_EPS

__all__ = ["body_hold", "hold_bodies", "live_tail"]


def body_hold(fab: Any, rt: Any, j: int, a: float, t_in: float, t: float) -> float:
    """The stream of route ``rt`` has its head at hop ``j``'s node at ``a`` (served there) and
    its tail there at ``t_in``; ``t``: its tail ready at the link after. At a mesh router its
    flits after the head wait behind every head that arrived there before them, as flit mode's
    node serves one FIFO: returns ``t``, no earlier than the end of each overhead there of a
    head that arrived after ``a`` (its arrival noted in ``FastFabric.node_own``) plus the
    flit times of the flits that arrived after that head (its flits arrive evenly until
    ``t_in`` where that is within its own overhead, else as the flow's booking on the link
    before serves them; a head that arrived with it, served after it, counts too). The flow
    being booked is noted for heads booked later (``note_body``)."""
    n = rt.nodes[j]
    nf = -(-rt.nb // fab.flit_bytes)
    if nf < 2 or t_in <= a + TIME_EPS or fab.node_kind[n] != "router":
        return t
    f = fab._f
    arr = None
    fw = p0 = 0.0
    if t_in > a + fab.node_ov[n] + TIME_EPS:    # a longer body: counted as it arrives
        b = f.links[j - 1] if f is not None and j > 0 else None
        if b is None:
            return t
        arr = b.pieces()
        fw = rt.hops[j - 1][5]
        p0 = rt.hops[j - 1][8]
    if f is not None:
        note_body(fab, n, a, t_in, f, j)
    iv = rt.hops[j][0]
    ft = rt.hops[j][5]
    dt = (t_in - a) / (nf - 1)
    own = fab.node_own[n]
    i = iv.bisect_right(a)
    if i & 1:
        i -= 1
    cur = a
    while i < iv.n:
        s_r = iv.at(i)
        e_r = iv.at(i + 1)
        if s_r >= t_in and s_r > cur + TIME_EPS:
            break
        o = own.get(s_r)
        if o is not None:
            if type(o) is tuple:
                g = o[0]
                ar = o[2]
            else:
                g = o
                ar = s_r
            if a - TIME_EPS < ar < t_in - TIME_EPS and g is not f:     # (a tie: after it)
                if arr is None:
                    k = nf - 1 - int((ar - a) / dt)
                else:               # (the flits not all there by ar)
                    k = nf - int(_work_by(arr, ar - p0) / fw + 1e-9)
                x = e_r + (k - 1) * ft
                if k > 0 and x > t:
                    t = x
        if e_r > cur:
            cur = e_r
        i += 2
    return t


def _work_by(pcs: list, x: float) -> float:
    """The work of pieces ``pcs`` (``(start, end, share)``, in order) done by ``x``."""
    w = 0.0
    for a, b, r in pcs:
        if a >= x:
            break
        w += r * ((b if b < x else x) - a)
    return w


def hold_bodies(fab: Any, n: int, h: float, e: float, f: Flow | None) -> None:
    """A head arrived at node ``n`` at ``h`` and is served until ``e``: the flits of streams
    noted there (``fair.note_body``) whose heads arrived before it but which arrive after it wait
    for it; each such stream's tail leaves the link after the node later (``fair._push``).
    Notes of streams complete or all arrived are dropped."""
    lst = fab.node_body[n]
    now = fab.env.now
    fb = fab.flit_bytes
    keep = None                 # (made once a note is dropped: most calls drop none, and a
    i = -1                      # new list per call made the cyclic collector run more often)
    for it in lst:
        i += 1
        a, t0, g, j = it
        t_in = t0               # (``live_tail``, inline: most notes are only kept)
        lv = g.lv
        if lv is not None and lv[j - 1] > t_in:
            t_in = lv[j - 1]
        if g.fin or t_in <= now:
            if keep is None:
                keep = lst[:i]
            continue
        if keep is not None:
            keep.append(it)
        if not a - TIME_EPS < h < t_in - TIME_EPS or g is f or g is fab._f:
            continue
        nf = -(-g.rt.nb // fb)
        hp = g.rt.hops[j]
        b = g.links[j - 1] if t0 > a + fab.node_ov[n] + TIME_EPS else None
        if b is not None:       # (a longer body: as it arrives)
            pm = g.rt.hops[j - 1]
            k = nf - int(_work_by(b.pieces(), h - pm[8]) / pm[5] + 1e-9)
        else:
            k = nf - 1 - int((h - a) / ((t_in - a) / (nf - 1)))
        if k <= 0:
            continue
        tail = e + (k - 1) * hp[5] + hp[7]
        b = g.links[j]
        if b is not None and tail > b.tail + TIME_EPS:
            b.tail = tail
            fab.push_depth += 1
            _push(fab, g, j, tail, h)
            fab.push_depth -= 1
    if keep is not None:
        fab.node_body[n] = keep


def live_tail(it: tuple, now: float) -> float:
    """A stream note's (``fair.note_body``) tail at its node, later if the tail was moved
    since; -1.0 once the stream is complete or all its flits arrived by ``now``."""
    a, t_in, g, j = it
    if g.fin:
        return -1.0
    if g.lv is not None and g.lv[j - 1] > t_in:
        t_in = g.lv[j - 1]
    return t_in if t_in > now else -1.0
