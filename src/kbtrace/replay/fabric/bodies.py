# cython: boundscheck=False, wraparound=False
# (compiled: ``hold_bodies`` reads a link's records and their slots by index, in range by
# construction; the pure-Python run, whose arrays check every index, is the test of that:
# tests/test_replay_core.py)
"""Fast mode's stream bodies held at mesh routers by the heads that arrive before them.

Flit mode's mesh router serves one FIFO: a head pays the router's overhead, a body flit
passes, each in arrival order, so a stream's flits that arrive after another head wait for
that head's overhead. Fast mode books a stream's head at a node (``heads.serve_head``) and
its tail by the closed form; here its tail is held. Heads booked before the stream hold its
tail (``body_hold``, from ``routes.hop_seq``: the tail ready at the next link no earlier than
each such head's overhead end plus the flit times of the stream's flits that arrive after
that head); heads booked after it push it (``hold_bodies`` from ``heads.serve_head``: its
tail leaves the link later, ``fair._push``). Only where flows share links fairly (``fast``;
``fast-fcfs`` books as before). Nothing is noted per hop for this: a head served at a router
finds the streams it holds among the live bookings of the links into the router
(``ledger.Recs``, kept for ``fair`` anyway), by a C compare of each one's start and tail in
its slot (``ledger.Slots``); a flow is read only where its head came before and its tail
after, or where its times were taken out to move (``fair._times``: ``Slots.retimed``).
A body within its head's overhead is held by any head; a longer one only by a single flit's
head (a one-flit read or write, an IPCQ credit): a stream's head is followed by its own body,
and where the two streams go on along the same link the fair share serves their flits
together there (``fair``); holding a longer body behind another stream's head too made both
all_gather (8.70 -> 8.88%) and llama_layer (4.38 -> 4.64%) on default.yaml worse at p95,
holding none of the short ones there ring_allreduce (0.00 -> 12.55%). A head that arrives
with the stream's head, served after it, holds it too. A body within
its head's overhead there (a 512 B IPCQ payload: two flits at 256 GB/s, 1 ns within 2 ns) is
taken to arrive evenly; a longer one (a 2 KiB read: eight flits over ~10 ns) as the flow's
booking on the link before serves it (``_work_by``). The free-path closed form does not look
for heads: a stream whose tail reaches a router after a head reserved there is booked hop by
hop at that node (``routes.held``). A head booked later that finds the node free (the closed
form) still does not hold a stream's body. A stream all of whose work had arrived at the link
into the router when the clock passed it (its ``Recs`` record dropped) is not held, nor one
whose link into the router carries no stream (no booking there).

Found on llama_layer (default.yaml): a 2 KiB read's last flit reached router r0c0 after the
heads of two one-flit reads from the same HBM slice, and flit mode held it 1.6 ns behind them
(``tests/test_replay_bodies.py``).

Imports ``booking`` and ``fair``; ``heads``, ``routes`` and ``fast`` import this (no cycle).
"""

from __future__ import annotations

from typing import Any

from kbtrace.replay.fabric.booking import Spans
from kbtrace.replay.fabric.fair import Flow, _push, booked
from kbtrace.replay.intervals import TIME_EPS

__all__ = ["body_hold", "hold_bodies", "router_inputs"]

#: ``ledger``'s GONE, LIVE, REC and HOP (C values in its compiled twin, not importable from
#: it; tests/test_replay_bodies.py checks they agree)
GONE, LIVE, REC, HOP = 0, 1, 3, 5


def router_inputs(fab: Any, topo: Any) -> list[list]:
    """Per node, if it is a mesh router, the links into it (where ``hold_bodies`` looks):
    each one's bookings (``ledger.Recs``), latency and flit time (ns); else none."""
    ins: list[list] = [[] for _ in topo.nodes]
    for lk in topo.links:
        if fab.node_kind[lk.dst] == "router":
            bw = fab.link_bw[lk.idx]
            ins[lk.dst].append((fab.link_flows[lk.idx], fab.link_prop[lk.idx],
                                fab.flit_bytes / bw if bw > 0 else 0.0))
    return ins


def body_hold(fab: Any, rt: Any, j: int, n: int, iv: Spans, ov: float, ft: float, a: float,
              t_in: float, t: float) -> float:
    """The stream of route ``rt`` has its head at hop ``j``'s node ``n`` (reservations ``iv``,
    overhead ``ov``; the flit time ``ft`` on the link after) at ``a`` (served there) and its
    tail there at ``t_in``; ``t``: its tail ready at the link after. At a mesh router its
    flits after the head wait behind every head that arrived there before them, as flit mode's
    node serves one FIFO: returns ``t``, no earlier than the end of each overhead there of a
    head that arrived after ``a`` (a single flit's, if the body is longer than ``ov``; its
    arrival noted by ``Spans.own``) plus the flit times of the flits that arrived
    after that head (its flits arrive evenly until ``t_in`` where that is within its own
    overhead, else as the flow's booking on the link before serves them; a head that arrived
    with it, served after it, counts too). Heads booked later find it among its bookings
    (``hold_bodies``)."""
    if t_in <= a + TIME_EPS or not fab.body_in[n]:
        return t
    nf = -(-rt.nb // fab.flit_bytes)
    if nf < 2:
        return t
    f = fab._f
    arr = None
    lng = t_in > a + ov + TIME_EPS      # a longer body: counted as it arrives
    if lng and (f is None or j == 0 or f.links[j - 1] is None):
        return t
    tab = fab.flow_slots
    i = iv.bisect_right(a)
    if i & 1:
        i -= 1
    cur = a
    while i < iv.n:
        s_r = iv.at(i)
        e_r = iv.at(i + 1)
        if s_r >= t_in and s_r > cur + TIME_EPS:
            break
        o = tab.owner(iv, i, n)
        if o is not None:
            if type(o) is tuple:
                g = o[0]
                ar = o[2]
            else:
                g = o
                ar = s_r
            if (a - TIME_EPS < ar < t_in - TIME_EPS and g is not f     # (a tie: after it)
                    and (not lng or not g.fin and g.rt.nb <= fab.flit_bytes)):
                if lng and arr is None:     # (the flits not all there by ar)
                    arr = _pieces(f, j - 1) or []
                k = _flits_after(nf, ar, a, t_in, arr if lng else None, rt.hops[j - 1])
                x = e_r + (k - 1) * ft
                if k > 0 and x > t:
                    t = x
        if e_r > cur:
            cur = e_r
        i += 2
    return t


def _pieces(f: Flow, j: int) -> list | None:
    """``fair.booked(f, j).pieces()`` without making the record where none was made yet (the
    booking's values in its slot, ``ledger.Slots``, are what the record would hold); None:
    nothing booked at hop ``j``."""
    x: Any = f.links[j]
    if x is None:
        return None
    if x is not True:
        return x.pieces()
    s, e, busy, _tail = f.fab.flow_slots.values(f.slot, j)
    r = busy / (e - s)
    return [(s, e, r if r < 1.0 else 1.0)]


def _flits_after(nf: int, x: float, a: float, t_in: float, pcs: list | None,
                 pm: tuple) -> int:
    """How many of a stream's ``nf`` flits arrive at the router after ``x``: evenly from its
    head at ``a`` until its tail at ``t_in`` (``pcs`` None: a body within its head's
    overhead), else as its booking on the link before (hop tuple ``pm``) serves them (its
    pieces ``pcs``, ``_pieces``)."""
    if pcs is None:
        return nf - 1 - int((x - a) / ((t_in - a) / (nf - 1)))
    return nf - int(_work_by(pcs, x - pm[8]) / pm[5] + 1e-9)


def _work_by(pcs: list, x: float) -> float:
    """The work of pieces ``pcs`` (``(start, end, share)``, in order) done by ``x``."""
    w = 0.0
    for a, b, r in pcs:
        if a >= x:
            break
        w += r * ((b if b < x else x) - a)
    return w


def hold_bodies(fab: Any, ins: list, now: float, h: float, e: float, f: Flow | None,
                one: bool, ov: float) -> None:
    """A head (of flow ``f``; ``one``: a single flit's) arrived at a mesh router at ``h`` and
    is served until ``e``: the flits of
    streams whose heads arrived there before it but which arrive after it wait for it; each
    such stream's tail leaves the link after the node later (``fair._push``). The streams are
    the flows booked on the links into the router (``ins``: their ``Recs`` and latencies,
    ``FastFabric.body_in``) still arriving there after ``now`` (as ``Recs.scan`` keeps them),
    whose head there (start on that link, plus its head flit and latency) came before ``h``
    and whose tail (leaving it, plus the latency) after, and which go on as a stream: the
    records' values in their slots are compared as C doubles, and a flow is read only where
    they pass, or where its times moved (its state not ``LIVE``). A link whose records are
    mostly of flows complete or all arrived drops those (``Recs.prune``). Where only bodies
    within the router's overhead ``ov`` are held (not ``one``), a stream not moved whose work
    had all arrived at the link ``ov`` plus a flit time before its head could reach the
    router by ``h`` is not one (its ``a_end`` in the record: its slot is not read)."""
    tab = fab.flow_slots
    sf = -1 if f is None else f.slot
    g = fab._f
    sb = -1 if g is None else g.slot
    hi = h + TIME_EPS
    nh = tab.hops
    got = None
    for lst, p, fl in ins:
        lo = h - ov - fl - p - TIME_EPS     # (a body within ov: its start after lo)
        m = lst.n
        if not m:
            continue
        v = lst.v
        dead = 0
        for i in range(m):
            q = REC * i
            sl = int(v[q + 1])
            st = tab.st[sl]
            if st == GONE:
                dead += 1
                continue
            jj = int(v[q + 2])
            if v[q] <= now and (st == LIVE or not tab.moved_at(sl, jj)):
                dead += 1
                continue
            if sl in (sf, sb) or not one and st == LIVE and v[q] <= lo:
                continue
            w = HOP * (nh * sl + jj)
            if tab.hv[w] + p >= hi:             # its head after (its start only moves later)
                continue
            if st == LIVE and tab.hv[w + 3] + p <= hi:      # all of it there by h
                continue
            if got is None:
                got = []
            got.append(sl)
            got.append(jj)
        if dead > 8 and 2 * dead > m:
            lst.prune(now)
    if got is not None:
        for i in range(0, len(got), 2):     # (a push may move the next: each read now)
            _hold(fab, h, e, tab.flows[got[i]], got[i + 1], now, one)


def _hold(fab: Any, h: float, e: float, g: Flow | None, jj: int, now: float,
          one: bool) -> None:
    """``hold_bodies`` for flow ``g`` booked at its hop ``jj`` on the link into the router
    (a longer body only if the head is a single flit's, ``one``)."""
    if g is None or g.fin:
        return
    rt = g.rt
    j = jj + 1
    if j >= len(rt.links) or rt.hops[j][4] != 2 or g.links[j] is None:
        return
    x: Any = g.links[jj]
    pm = rt.hops[jj]
    if x is True:
        s, _e, _busy, tl = g.fab.flow_slots.values(g.slot, jj)
    else:
        if x.a_end <= now:      # (all arrived at the link: as ``Recs.scan`` drops it)
            return
        s = x.s
        tl = x.tail
    a = s + pm[5] + pm[8]
    if not a - TIME_EPS < h:
        return
    t0 = tl + pm[8]
    t_in = t0
    lv = g.lv
    if lv is not None and lv[jj] > t_in:
        t_in = lv[jj]
    if not h < t_in - TIME_EPS:
        return
    pcs = None
    if t0 > a + fab.node_ov[rt.nodes[j]] + TIME_EPS:      # (a longer body: as it arrives)
        if not one:
            return
        pcs = _pieces(g, jj) or []
    k = _flits_after(-(-rt.nb // fab.flit_bytes), h, a, t_in, pcs, pm)
    if k <= 0:
        return
    hp = rt.hops[j]
    tail = e + (k - 1) * hp[5] + hp[7]
    y: Any = g.links[j]
    if tail > (g.fab.flow_slots.values(g.slot, j)[3] if y is True else y.tail) + TIME_EPS:
        b: Any = booked(g, j)
        b.tail = tail
        fab.push_depth += 1
        _push(fab, g, j, tail, h)
        fab.push_depth -= 1
