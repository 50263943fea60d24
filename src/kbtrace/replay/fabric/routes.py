# cython: boundscheck=False, wraparound=False
# (compiled: the indices below are in range by construction; the pure-Python run, whose
# lists and arrays check every index, is the test of that: tests/test_replay_core.py)
"""Fast mode's routes and their free-path closed forms (``_Route``, ``_Plan``), and the walk
that books a transfer along a route in stretches (``book_route``, the heart of
``FastFabric.send``, which is ``send`` here: typed on the fabric's state, so the per-transfer
path reads its fields as C struct fields; ``stream``: a stream on a link that is not free).

Compiled with the fast-mode core (``setup.py``: ``_routes_c``, typed by ``routes.pxd``: the
route and plan are extension types read without attribute look-ups, the booking loop and a
plan's reservations run on C doubles); this file is the reference and
what runs where nothing was compiled. Both do the same floating-point operations in the
same order, so the outputs are byte-identical.
"""

from __future__ import annotations

from array import array
from typing import Any, Literal

from kbtrace.replay.fabric.bodies import body_hold
from kbtrace.replay.fabric.booking import (
    Spans,
    fit_rate,
    queue_rate,
    serve,
    take,
    take_rate,
    unreserve,
)
from kbtrace.replay.fabric.events import _Ev, after
from kbtrace.replay.fabric.fair import Flow, book, fair_hop, incumbents
from kbtrace.replay.fabric.heads import commit_later, prune_all, serve_flit, serve_head
from kbtrace.replay.fabric.pull import read_first
from kbtrace.replay.hbm import known_bursts
from kbtrace.replay.intervals import TIME_EPS
from kbtrace.replay.recorder import STAGE_CODE

__all__ = ["begin", "book_route", "held", "hop_seq", "send", "stream", "walk", "PRUNE_EVERY"]

#: transfers between two prunings of past intervals (``heads.prune_all``)
PRUNE_EVERY = 1024
_PRUNE = PRUNE_EVERY     # (compiled: a C integer)

_NEG_INF = float("-inf")


class _Route:
    """Everything about (route, nbytes) that does not depend on time, computed once.

    ``hops``: per link, ``(node Spans | None, node_ov, link Steps, link, mode, head, body,
    last, prop)`` (``booking``) with ``mode`` 0 = no serialisation, 1 = single flit, 2 = stream;
    ``head`` / ``body`` / ``last`` are ``first / bw``, ``(nbytes - last) / bw``,
    ``last / bw``. ``plans[j]``: the free-path closed form from hop ``j`` on, built the
    second time a transfer reaches hop ``j`` (``None``: never reached, ``False``: reached
    once). The first time, ``walk`` books it with the same arithmetic, keeping
    nothing. A route used once (e.g. all-to-all traffic) so holds no plans, and no result
    depends on what the cache holds.
    """
    __slots__ = ("nodes", "links", "hops", "stage", "node", "busy", "dst", "dst_iv", "dst_ov",
                 "hbm", "term_stage", "term_busy", "nb", "plans", "flit_max", "movable", "fixed")

    def __init__(self, fab: Any, src: int, dst: int, nb: int, shape: int = 0) -> None:
        nodes, links = fab.route(src, dst)
        hop_of = fab.hop_of
        code, bw, fb = fab.link_stage_code, fab.link_bw, fab.flit_bytes
        hops, stage, busy = [], [], []
        fm = 0.0            # a full flit's time on the path's slowest link
        for j, li in enumerate(links):      # (a loop: no generator per route)
            hp, b = hop_of(li, nb, j == 0, shape)
            hops.append(hp)
            busy.append(b)
            stage.append(code[li])
            if bw[li] > 0 and fb / bw[li] > fm:
                fm = fb / bw[li]
        self.nodes, self.links = nodes, links
        self.hops = tuple(hops)
        self.stage = tuple(stage)
        self.node = nodes[:len(nodes) - 1]
        self.busy = tuple(busy)
        self.dst = dst
        self.dst_ov = fab.node_ov[dst]
        self.dst_iv = fab.node_iv[dst] if self.dst_ov > 0 else None
        self.hbm = fab.hbm.get(dst)
        self.term_stage = STAGE_CODE[fab.term_stage[dst]]
        h = self.hbm
        self.term_busy = nb / (h.bw * h.n_pcs) if h is not None else 0.0
        self.nb = nb
        self.plans: list[_Plan | Literal[False] | None] = [None] * (len(links) + 1)
        self.flit_max = fm
        # a flow others may slow or push (``fair``): a transfer to a node without an HBM
        # commit (a stream, or a single flit whose head a head arriving first at a node may
        # push), an HBM write that streams on a link (its commit moves with its tail:
        # ``heads.HbmWrite.recommit``), or a one-flit HBM write through a node with an
        # overhead (``heads``)
        self.movable = (any(hp[4] for hp in self.hops) if self.hbm is None
                        else any(hp[4] == 2 or hp[0] is not None for hp in self.hops))
        # an HBM write that streams keeps its heads' node reservations (no head arriving
        # first pushes it; it takes the gaps before them): moving them made softmax on
        # default.yaml 1.20% -> 1.43% early, its worst op 6.8% -> 16% off
        self.fixed = self.hbm is not None and any(hp[4] == 2 for hp in self.hops)

    def build(self, fab: Any, j0: int) -> _Plan:
        pl = self.plans[j0] = _Plan(self, fab, j0)
        fab.held += pl.n_res + pl.n_rows
        return pl


class _Plan:
    """The free-path closed form of a route from hop ``j0`` on.

    The sequential recursion (``FastFabric._hop``) solved symbolically for a
    transfer that finds every resource free: from head / tail times ``h0 <= t0``
    at hop ``j0``, the head is at ``h0 + H`` and the tail at ``max(t0 + A, h0 +
    B)`` everywhere further on (max-plus linear). Per resource in path order (node
    overhead, link, destination overhead; ``n_res`` of them): ``sts[i]``, its state, and
    ``off[4 i:4 i + 4]``, ``(S, A, B, busy)`` (C doubles, not a tuple of Python floats per
    resource: ``take`` reads them for every transfer): the reservation is ``[h0 + S,
    max(t0 + A, h0 + B)]``, a node's exclusive (its ``Spans``; ``busy`` -1), a link's (its
    ``Steps``) at the share ``busy / length``; ``res_hop``: the hop (relative to ``j0``, ``n_hops`` = the destination)
    each belongs to; ``first``: each hop's first resource; ``start``: ``(H, A, B)`` at each hop's start; ``h_end`` /
    ``t_a`` / ``t_b``: head and tail at the destination; ``pid``: the recorder
    plan of the matching hop rows (terminal row last). ``bk[6 i:6 i + 6]``: what a flow notes
    of resource ``i`` (``take``), C doubles read where the plan's Python objects
    (``res_hop``, ``start``, the route's hop tuples) would each be a cache miss:
    ``(kind, hop, node or link, node overhead, A, B at the hop's start)``, ``kind`` 0 the
    destination's overhead, 1 a node's, 2 a node's at a mesh router of a stream hop (fair
    share only: its body is held there, ``bodies``), 3 a single
    flit's link, 4 a stream's link. ``recs[i]``: a stream link's bookings (``ledger.Recs``,
    ``FastFabric.link_flows``), where a flow's booking there is noted (``take``); else None.
    """
    __slots__ = ("j0", "n_hops", "n_res", "sts", "off", "res_hop", "first", "start", "h_in",
                 "h_end", "t_a", "t_b", "pid", "n_rows", "rows", "bk", "recs")

    def __init__(self, rt: _Route, fab: Any, j0: int) -> None:
        self.j0 = j0   # (not the route: a route holds its plans, and no cycle is left
                       # for the garbage collector when the cache is emptied)
        self._build(rt, fab, j0)

    def _build(self, rt: _Route, fab: Any, j0: int) -> None:
        """(``__init__``'s work; compiled: its times C doubles, written into ``off`` and
        ``bk`` as such, ``_put``.)"""
        hops = rt.hops[j0:]
        self.n_hops = len(hops)
        m = 2 * len(hops) + 1              # resources at most: a node and a link per hop
        self.off = array("d", bytes(32 * m))
        self.bk = array("d", bytes(48 * m))
        H, A, B = 0.0, 0.0, _NEG_INF
        res: list[Any] = []         # a Spans / Steps per resource
        recs: list[Any] = []        # a stream link's Recs per resource, else None
        res_hop: list[int] = []
        first: list[int] = []
        start: list[tuple[float, float, float]] = []
        rows = []
        for jr, (niv, ov, ln, _li, mode, hd_d, body, last_d, p) in enumerate(hops):
            j = j0 + jr
            bz = rt.busy[j]
            first.append(len(res))
            start.append((H, A, B))
            en = H
            if niv is not None:
                n = rt.nodes[j]
                self._put(len(res), H, _NEG_INF, H + ov, -1.0,
                          2.0 if mode == 2 and fab.fair and fab.node_kind[n] == "router" else 1.0,
                          j, n, fab.node_ov[n], A, B)
                res.append(niv)
                recs.append(None)
                res_hop.append(jr)
            if niv is not None or ov > 0:       # the node's overhead, reserved or not
                H += ov
                B = max(B, H)
            if mode == 2:
                self._put(len(res), H, A + last_d, max(H + body, B) + last_d, bz, 4.0, j,
                          rt.links[j], 0.0, 0.0, 0.0)
                res.append(ln)
                recs.append(fab.link_flows[rt.links[j]])
                res_hop.append(jr)
                A, B, H = A + last_d, max(B, H + body) + last_d, H + hd_d
            elif mode == 1:
                self._put(len(res), H, _NEG_INF, H + hd_d, bz, 3.0, j, rt.links[j], 0.0, 0.0,
                          0.0)
                res.append(ln)
                recs.append(None)
                res_hop.append(jr)
                A, B, H = _NEG_INF, H + hd_d, H + hd_d
            else:
                B = max(B, H)
            H, A, B = H + p, A + p, B + p
            rows.append((rt.stage[j], rt.node[j], rt.links[j], rt.busy[j], en, A, B, False))
        first.append(len(res))
        start.append((H, A, B))
        h_in = H
        if rt.dst_iv is not None:
            self._put(len(res), H, _NEG_INF, H + rt.dst_ov, -1.0, 0.0, j0 + self.n_hops, rt.dst,
                      0.0, 0.0, 0.0)
            res.append(rt.dst_iv)
            recs.append(None)
            res_hop.append(self.n_hops)
            H += rt.dst_ov
        B = max(B, H)
        rows.append((rt.term_stage, rt.dst, -1, rt.term_busy, h_in, 0.0, 0.0, True))
        self.sts, self.n_res = res, len(res)
        self.recs = recs
        self.res_hop, self.first, self.start = res_hop, first, start
        self.h_in, self.h_end, self.t_a, self.t_b = h_in, H, A, B
        self.n_rows = len(rows)
        self.rows = rows
        self.pid = fab.rec.add_plan(rows, rt.nb)

    def _put(self, i: int, s: float, a: float, b: float, busy: float, kind: float, j: float,
             x: float, ov: float, a0: float, b0: float) -> None:
        """Resource ``i``: its ``off[4 i:4 i + 4]`` and ``bk[6 i:6 i + 6]`` (the class
        docstring)."""
        q = 4 * i
        self.off[q] = s
        self.off[q + 1] = a
        self.off[q + 2] = b
        self.off[q + 3] = busy
        q = 6 * i
        self.bk[q] = kind
        self.bk[q + 1] = j
        self.bk[q + 2] = x
        self.bk[q + 3] = ov
        self.bk[q + 4] = a0
        self.bk[q + 5] = b0

    def take(self, h: float, t: float, key: float = -1.0, f: Any = None) -> int:
        """Reserve the plan's resources (``sts``, in path order) for a transfer whose head and
        tail reach its first hop at ``h`` / ``t``, each ``[h + S, max(t + A, h + B)]``,
        while each is free as the head reaches it (a node: ``booking.take``; a link:
        ``booking.take_rate``). Returns how many were (``n_res``: all); nothing of the
        next one is reserved.

        Nearly every reservation is an append to a resource free from its start on: two C
        doubles in a node's ``Spans``, two breakpoints and their shares in a link's
        ``Steps`` (compiled: no Python object made, the offsets read as C doubles).
        ``f``: the ``fair.Flow`` being booked (None: no flow), ``key`` its ``ledger.Slots.key``,
        noted beside each reservation of a node's overhead served as its head arrives (it may
        move: ``Spans.own``, ``heads.serve_head``); what it took of each link is noted as it
        is taken: a stream's with the link and in its slot (``Recs.book``), as ``fair.book``
        notes it, a single flit's with the flow (``Flow.booked_flit``)."""
        k = 0
        off = self.off
        for st in self.sts:
            q = 4 * k
            s = h + off[q]
            e = t + off[q + 1]
            x = h + off[q + 2]
            bz = off[q + 3]
            if x > e:
                e = x
            if bz < 0.0:        # a node's overhead: exclusive
                sp = st
                n = sp.n
                if not n or sp.tl <= s:
                    sp.push(s, e)
                    i = n
                else:   # a gap that takes the whole overhead, or a stall
                    i = sp.bisect_right(s)
                    if i & 1:
                        break
                    y = sp.t[i]
                    if e > y + TIME_EPS:
                        break
                    if self.bk[6 * k] == 2.0:      # a stream at a mesh router: a head
                        x = t + self.bk[6 * k + 4]  # reserved before its tail arrives
                        z = h + self.bk[6 * k + 5]  # holds its later flits (``held``)
                        if (x if x > z else z) > y + TIME_EPS:
                            break
                    sp.insert2(i, s, e if e < y else y)
                if key >= 0.0 and self.bk[6 * k] != 0.0:    # (not the destination's)
                    sp.own(i, key, s)
            else:
                ln = st
                n = ln.n
                if not n or ln.tl <= s:         # a link, free from s on: the share busy / span
                    r = bz / (e - s)
                    ln.push(s, r if r < 1.0 else 1.0, e)
                elif not take_rate(ln, s, e, bz):   # not enough bandwidth to spare
                    break
                if f is not None:
                    jj = int(self.bk[6 * k + 1])
                    if self.bk[6 * k] == 4.0:       # a stream's (``fair.book``, no pieces)
                        lst = self.recs[k]
                        lst.book(f.slot, jj, s, e, bz, e)
                        f.links[jj] = True
                    else:                           # a single flit's: no stream to share
                        r = bz / (e - s)
                        f.booked_flit(jj, [(s, e, r if r < 1.0 else 1.0)])
            k += 1
        return k


def held(sp: Spans, s: float, t_in: float) -> bool:
    """A stream's head served at a mesh router from ``s`` (reservations ``sp``), its tail
    arriving there at ``t_in``: is a head reserved there after ``s`` and before ``t_in``?
    Its later flits would wait for it (flit mode's node is one FIFO), which the free-path
    closed form does not see: the hop is booked by ``hop_seq`` (``bodies.body_hold``)."""
    i = sp.bisect_right(s)
    return not i & 1 and i < sp.n and sp.t[i] < t_in - TIME_EPS


def complete(fab: Any, tt: float, ack: float) -> _Ev:
    """The completion event of the transfer being booked, at ``tt`` (fired ``ack`` later,
    value ``tt``); a flow's (``fab._f``) can move (``fair``): it keeps the event and its time,
    and records its rows when the event fires (``Flow.done``)."""
    env = fab.env
    ev = after(env, tt + ack - env._now, tt)   # (``env.now`` without its property call)
    f = fab._f
    if f is not None:
        f.ev = ev
        f.tt = tt
        ev.callbacks.append(f.done)
    return ev


def send(fab: Any, op_id: int, tile: int, src: int, dst: int, nbytes: int, addr: int = 0,
         ready: list[float] | None = None, at: float | None = None, ack: float = 0.0,
         span: tuple[float, float] | None = None, shape: int = 0, group: int = 1,
         bursts: Any = None) -> _Ev:
    """``FastFabric.send`` (see there for the arguments): the route (made and cached on
    first use, ``FastFabric.new_route``), the head and tail ready times, the transfer's ``Flow``
    if it is one, then ``book_route``."""
    key = (src, dst, nbytes) if not shape else (src, dst, nbytes, shape)
    rt = fab.routes_nb.get(key)
    if rt is None:
        rt = fab.new_route(key, src, dst, nbytes, shape)
    now = fab.env._now                  # (``env.now`` without its property call)
    t0 = now if at is None else at
    if span is not None:
        h, t = span
        if group > 1:
            t += (group - 1) * rt.flit_max
    elif ready is None:
        h = t = t0
    else:
        h, t = min(ready), max(ready)
    fab.sends += 1
    if fab.sends % _PRUNE == 0:
        prune_all(fab, now)
    f = fab._f = begin(fab, rt, op_id, tile, ack)
    if f is not None and bursts is not None:
        f.rd = known_bursts(bursts) if isinstance(bursts, list) else bursts
    return book_route(fab, rt, f, op_id, tile, addr, h, t, ack, now)


def begin(fab: Any, rt: _Route, op_id: int, tile: int, ack: float) -> Flow | None:
    """The ``Flow`` of a transfer about to be booked on ``rt``, if it is one (a route whose
    bookings can move, in fair mode)."""
    if not rt.movable or not fab.fair:
        return None
    return Flow(fab, rt, op_id, tile, ack, rt.hbm is not None)


def stream(fab: Any, rt: _Route, j: int, h: float, t: float,
           now: float) -> tuple[float, float, float]:
    """Book a stream on hop ``j``'s link (head at ``h``, tail ready at ``t``): as it
    comes if it fits, else fairly with the flows booked there before it (``fair_hop``),
    else with what the link spares (``fit_rate``). ``(start, head, tail)``."""
    _niv, _ov, ln, _li, _mode, hd_d, body, last_d, _p = rt.hops[j]
    busy = rt.busy[j]
    f = fab._f
    li = rt.links[j]
    e = h + body
    if e < t:
        e = t
    e += last_d
    if take_rate(ln, h, e, busy):
        if f is not None:
            book(fab.link_flows, f, j, h, e, busy, None, e)
        return h, h + hd_d, e
    inc = incumbents(fab.link_flows, li, f, h, now)
    if j == 0 and f is not None and f.rd is not None and fab.link_own[li]:
        got = read_first(fab, rt, j, h, t, inc, f)
        if got is not None:
            return got
    if inc:
        return fair_hop(fab, rt, j, h, t, inc, f)
    if f is None:           # (``fit_rate`` past its failed ``take_rate``, done above)
        return queue_rate(ln, now, h, hd_d, e, t + last_d, busy)
    pcs: list = []
    s, hd, td = queue_rate(ln, now, h, hd_d, e, t + last_d, busy, pcs)
    book(fab.link_flows, f, j, h, e, busy, pcs, td)
    return s, hd, td


def book_route(fab: Any, rt: _Route, f: Any, op_id: int, tile: int, addr: int, h: float,
               t: float, ack: float, now: float) -> _Ev:
    """Book a transfer on ``rt`` whose head and tail are ready at ``h`` / ``t`` (``f``: its
    ``fair.Flow``, or None) for ``FastFabric.send`` (see there): plan by plan where the
    resources are free, hop by hop (``hop_seq``) where one is not. Returns the
    completion event."""
    env = fab.env
    rec = fab.rec
    j = 0
    while True:
        plo = rt.plans[j]
        if plo is None:      # first reach: book by the plan's arithmetic, keep nothing
            rt.plans[j] = False
            j, got, t = walk(fab, rt, j, op_id, tile, h, t, addr, ack)
            if j < 0:
                return got  # the completion event
            h = got
        else:
            pl = rt.build(fab, j) if plo is False else plo
            if f is None:           # the resources free as the head reaches them
                k = pl.take(h, t)
            else:
                tab = fab.flow_slots
                k = pl.take(h, t, -1.0 if rt.fixed else tab.key(f.slot), f)
            if k == pl.n_res:
                hh = h + pl.h_end
                tt = t + pl.t_a
                x = h + pl.t_b
                if x > tt:
                    tt = x
                if rt.hbm is not None:      # links now, the HBM commit when data arrives
                    if f is not None:
                        f.segs.append(("P", pl, h, t, 0.0, pl.n_rows - 1))
                    else:
                        rec.transfer(op_id, tile, pl.pid, h, t, 0.0, pl.n_rows - 1)
                    return commit_later(fab, rt, op_id, tile, addr, h + pl.h_in, hh, tt, 0.0,
                                        ack)
                if f is not None:
                    f.segs.append(("P", pl, h, t, tt, pl.n_rows))
                    return complete(fab, tt, ack)
                rec.transfer(op_id, tile, pl.pid, h, t, tt, pl.n_rows)
                return after(env, tt + ack - now, tt)
            # resource k is not free: undo its hop's earlier reservations
            jr = pl.res_hop[k]
            for i in range(pl.first[jr], k):
                S = pl.off[4 * i]
                unreserve(pl.sts[i], h + S)    # a node's (a hop's link is its last resource)
            if jr:
                if f is not None:
                    f.segs.append(("P", pl, h, t, 0.0, jr))
                else:
                    rec.transfer(op_id, tile, pl.pid, h, t, 0.0, jr)
            H, A, B = pl.start[jr]
            tt = t + A
            x = h + B
            h, t = h + H, (tt if tt > x else x)
            j = pl.j0 + jr
        # hop j (or the destination) is not free: book it sequentially, go on after it
        if j == len(rt.links):
            return fab._arrive(rt, op_id, tile, addr, h, t, now, ack)
        h, t = hop_seq(fab, rt, j, op_id, tile, h, t, now)
        j += 1


def walk(fab: Any, rt: _Route, j0: int, op_id: int, tile: int, h: float, t: float,
         addr: int, ack: float) -> tuple[int, Any, float]:
    """Book from hop ``j0`` as ``_Plan(rt, j0)`` would (the same floating-point operations,
    so the same result; ``fab``: the ``FastFabric``, its flow being booked ``fab._f``),
    computing its offsets as it goes and keeping none: the first transfer on a stretch
    pays no more than the walk up to its first resource that is not free. Rows are
    recorded explicitly (as ``Recorder._pending`` expands a compact record). Returns
    ``(-1, event, 0.0)`` when the transfer completed (the event ``FastFabric.send``
    returns), else ``(j, h, t)``: hop ``j`` (``len(links)``: the destination) is not free,
    and nothing of it is reserved; head and tail reach its start at ``h`` / ``t``."""
    hops = rt.hops
    f = fab._f
    H, A, B = 0.0, 0.0, _NEG_INF
    rows: list[tuple] = []
    nb = rt.nb
    j = j0
    n = len(hops)
    while j < n:
        niv, ov, ln, _li, mode, hd_d, body, last_d, p = hops[j]
        H0, A0, B0 = H, A, B
        if niv is not None:
            if (mode == 2 and fab.fair and niv.last() > h + H
                    and held(niv, h + H, max(t + A, h + B))
                    and fab.node_kind[rt.nodes[j]] == "router"):
                break           # (its later flits wait for a head: ``hop_seq``)
            if not take(niv, h + H, h + (H + ov)):
                break
        if niv is not None or ov > 0:       # the node's overhead, reserved or not
            H += ov
            B = max(B, H)
        if mode == 2:
            e = t + (A + last_d)
            x = h + (max(H + body, B) + last_d)
            if not take_rate(ln, h + H, x if x > e else e, rt.busy[j]):
                if niv is not None:
                    unreserve(niv, h + H0)
                break
            if f is not None:
                book(fab.link_flows, f, j, h + H, x if x > e else e, rt.busy[j], None,
                     x if x > e else e)
            A, B, H = A + last_d, max(B, H + body) + last_d, H + hd_d
        elif mode == 1:
            if not take_rate(ln, h + H, h + (H + hd_d), rt.busy[j]):
                if niv is not None:
                    unreserve(niv, h + H0)
                break
            if f is not None:        # (``take_rate``'s share)
                e = h + (H + hd_d)
                x = rt.busy[j] / (e - (h + H))
                f.booked_flit(j, [(h + H, e, x if x < 1.0 else 1.0)])
            A, B, H = _NEG_INF, H + hd_d, H + hd_d
        else:
            B = max(B, H)
        H, A, B = H + p, A + p, B + p
        e = t + A
        x = h + B
        rows.append((op_id, tile, rt.stage[j], rt.node[j], rt.links[j], h + H0,
                     x if x > e else e, rt.busy[j], 0.0, nb))
        if niv is not None and f is not None and not rt.fixed:     # (its head may move there)
            fab.flow_slots.own(niv, niv.find(h + H0), f.slot, h + H0)
        j += 1
    else:
        H0, A0, B0 = H, A, B
        if rt.dst_iv is None or take(rt.dst_iv, h + H, h + (H + rt.dst_ov)):
            if rt.dst_iv is not None:
                H += rt.dst_ov
            B = max(B, H)
            tt = t + A
            x = h + B
            if x > tt:
                tt = x
            hh = h + H
            if rt.hbm is not None:
                if rows:
                    fab._rows(rows)
                return -1, commit_later(fab, rt, op_id, tile, addr, h + H0, hh, tt, 0.0,
                                        ack), 0.0
            rows.append((op_id, tile, rt.term_stage, rt.dst, -1, h + H0, tt, rt.term_busy,
                         0.0, nb))
            fab._rows(rows)
            return -1, complete(fab, tt, ack), 0.0
    if rows:
        fab._rows(rows)
    tt = t + A0
    x = h + B0
    return j, h + H0, (tt if tt > x else x)


def hop_seq(fab: Any, rt: _Route, j: int, op_id: int, tile: int, h: float, t: float,
            now: float) -> tuple[float, float]:
    """Book hop ``j`` of ``rt`` sequentially (head at ``h``, tail at ``t``; ``fab``: the
    ``FastFabric``, its flow being booked ``fab._f``); record its row; return head and tail
    at the next node (``FastFabric._hop``; here, typed, for ``book_route``)."""
    niv, ov, ln, _li, mode, hd_d, body, last_d, p = rt.hops[j]
    fair = fab.fair
    f = fab._f
    enter = h
    q = 0.0
    if niv is not None:
        n = rt.nodes[j]
        s = serve_head(fab, n, niv, now, h, ov, j, f) if fair else serve(niv, now, h, ov)
        q = s - (h + ov)
        t_in = t
        h = s
        if t < h:
            t = h
        if mode == 2 and fair:     # (its body waits for heads that arrived before)
            t = body_hold(fab, rt, j, n, niv, ov, hd_d, enter, t_in, t)
    elif ov > 0:
        h += ov
        if t < h:
            t = h
    if mode == 2:
        if f is not None or fab.link_flows[rt.links[j]]:
            s, hd, td = stream(fab, rt, j, h, t, now)
        else:
            s, hd, td = fit_rate(ln, now, h, hd_d, body, t, last_d, rt.busy[j])
        q += s - h
    elif mode == 1:
        if fair:
            s, hd, td = serve_flit(fab, rt, j, now, h)
        else:
            s, hd, td = fit_rate(ln, now, h, hd_d, hd_d, 0.0, 0.0, rt.busy[j])
        q += s - h
    else:
        hd = h
        td = t if t > h else h
    t = td + p
    if f is None:
        fab.rec.row(op_id, tile, rt.stage[j], rt.node[j], rt.links[j], enter, t, rt.busy[j], q,
                    rt.nb)
    else:
        f.segs.append(("R", (op_id, tile, rt.stage[j], rt.node[j], rt.links[j], enter, t,
                             rt.busy[j], q, rt.nb)))
    return hd + p, t
