"""Fast mode's fair share: streams that meet on a link share it, the earlier ones slowed.

Fast mode books a transfer when it starts (``fast.FastFabric``). A transfer to a node without an HBM
commit (a read's data, an IPCQ payload or credit), and an HBM write that streams on a link or
crosses a node with an overhead, is also a ``Flow`` (``routes._Route.movable``): what it booked
on each link (a stream's; a single flit's is not) is kept as C doubles, registered with the link
(``FastFabric.link_flows``, a ``ledger.Recs`` each: the flow named by its slot; ``book``, or
``routes._Plan.take`` as it takes a free path), and a ``Booked``
record of it (start, lone end, share, pieces, tail, arrival; ``Flow.links``) is made only when it
is read (``booked``, ``incumbents``); its hop rows wait for its completion (``Flow.segs``),
which is one event that can move (``Flow.ev``).

When a stream reaches a link that has not the bandwidth it needs (``routes.stream``) and flows
booked earlier are still arriving there, they are served again together from that moment
(``fair_hop``): their pieces from then on are given back (``booking.unbook``) and the link serves
all of them first come, first served with the bandwidth it spares (``fifo.share_fifo``), as its flit
FIFO does in flit mode: what arrived earlier leaves first, streams arriving together share in
proportion to their arrival rates. An earlier flow whose tail now leaves later carries the delay
along its path (``_push``, max-plus as the closed form), its rows are rewritten and its completion
event moved (a SimPy event cannot be cancelled: the callbacks move to a new event, the old one fires
with none). Its bookings further on keep their times (its rows there widen over them, so every
link's busy time still fits its windows), but they are now described as arriving as the flow leaves
the link before, and a stream that meets it there later re-serves it from that. What was served
before a meeting keeps its times. A flow arrives at every link but its first as the link before
serves it (``Booked.arrival``: a backlog where that link is faster), an HBM read at its first
link as its bursts are ready (``fifo.burst_arrival``; ``pull.read_first``).

A flow's head that a node serves later than booked (``heads``: node overheads serve heads in arrival
order) carries the delay along its path too (``_push`` with ``hs``; its overheads further on move
through ``FastFabric.head_at``). A transfer alone on its path never meets anyone: it is booked
exactly as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kbtrace.replay.fabric.booking import unbook
from kbtrace.replay.fabric.enters import INF, enter_rows, entered
from kbtrace.replay.fabric.events import after
from kbtrace.replay.fabric.fifo import (
    ARRIVAL_PIECES,
    BURST_NS,
    burst_arrival,
    coarse,
    not_before,
    served_as_ready,
    share_fifo,
)
from kbtrace.replay.intervals import TIME_EPS

if TYPE_CHECKING:
    from kbtrace.replay.hbm import Bursts

__all__ = ["Flow", "Booked", "book", "booked", "fair_hop", "incumbents", "prune_flows", "share_with", "expand", "coarse",
           "ARRIVAL_PIECES"]

class Flow:
    """A movable transfer (see the module docstring)."""
    __slots__ = ("rt", "op_id", "tile", "ack", "ev", "segs", "rows", "links", "fin", "tt",
                 "fab", "en", "lv", "hn", "nres", "wr", "sl", "rd", "slot")

    def __init__(self, fab: Any, rt: Any, op_id: int, tile: int, ack: float,
                 wr: bool = False) -> None:
        self.fab, self.rt, self.op_id, self.tile, self.ack = fab, rt, op_id, tile, ack
        #: an HBM write: ``ev`` is its ``heads.HbmWrite``, whose commit moves with its head
        #: and tail (``_push``; a single flit's head moves at nodes, ``heads``)
        self.wr = wr
        self.ev: Any = None
        self.segs: list[tuple] = []       # ("P", plan, h, t, done, n) | ("R", row)
        self.rows: list[tuple] | None = None   # explicit rows, once evicted or complete
        self.en: list[float] | None = None     # its rows' enter and leave times, once moved
        self.lv: list[float] | None = None     # (``_times``; ``_push`` moves ``lv``)
        #: per row whose head moved later (``_push``), when the head now enters it
        self.hn: dict[int, tuple[float, float]] | None = None    # (arrival, booking start)
        #: per hop, where booked: its ``Booked`` once made (``booked``), True while only its
        #: link's ``ledger.Recs`` holds it
        self.links: list[Booked | bool | None] = [None] * len(rt.links)
        #: its slot in ``ledger.Slots`` (the flows under way: ``FastFabric.evict``)
        self.slot = self.fab.flow_slots.enter(self, len(rt.links))
        self.fin = False
        self.tt = 0.0
        #: per hop, where its node overhead starts if not as its row says (``_reserve``)
        self.nres: dict[int, float] | None = None
        #: per hop of a single flit, the pieces its link booking holds (``heads.relink``)
        self.sl: dict[int, list] | None = None
        self.rd: Bursts | None = None     # an HBM read's burst ready times (``arrival``)

    def booked_flit(self, j: int, pcs: list, a: float = -1.0) -> None:
        """Its single flit took hop ``j``'s link as ``pcs`` (``(start, end, share)``), arriving
        at ``a`` (negative: at the start): what ``heads.relink`` gives back if its head moves,
        and a flit arriving there first goes before (``heads.serve_flit``)."""
        if self.sl is None:
            self.sl = {j: pcs}
        else:
            self.sl[j] = pcs
        if pcs:
            s = pcs[0][0]
            self.fab.link_own[self.rt.links[j]][s] = (self, j, a if a >= 0.0 else s)

    def done(self, _ev: Any) -> None:
        """The completion event fired: record the rows."""
        self.fin = True
        self.links = []     # (its bookings refer to it: no cycle left for the GC to find)
        fab = self.fab
        fab.flow_slots.leave(self.slot)
        rec = fab.rec
        if self.rows is not None or self.lv is not None:
            rec.rows(expand(self))
        else:
            run: list[tuple] = []
            for sg in self.segs:
                if sg[0] == "R":
                    run.append(sg[1])
                    continue
                if run:
                    rec.rows(run)
                    run = []
                _k, pl, h, t, dn, n = sg
                rec.transfer(self.op_id, self.tile, pl.pid, h, t, dn, n)
            if run:
                rec.rows(run)
        # its bookings may stay on their links' lists a while: keep no rows or plans there
        self.segs = []
        self.rows = self.en = self.lv = self.hn = None


class Booked:
    """What flow ``f`` booked on the link of its hop ``j``: from ``s``, alone until ``e`` at the
    share ``r`` of ``busy`` ns of work; the ``pieces`` it is served as (``(start, end,
    share)``, as booked), when its ``tail`` leaves, and its ``arrival`` there (pieces too;
    ``a_end``: when all of it has arrived). A flow books one per link of its path, so the
    two piece lists are made only when asked for (``pieces()``, ``arrival()``): until a
    stream meets the flow they are ``[(s, e, r)]`` and ``[(s, s + busy / r, r)]``; once
    ``_push`` has moved it, its arrival is ``lz`` (an ``_Arrival``) until asked for."""
    __slots__ = ("f", "j", "s", "e", "r", "busy", "tail", "a_end", "pcs", "arr", "lz")
    f: Flow
    j: int
    s: float
    e: float
    r: float
    busy: float
    tail: float
    a_end: float
    pcs: list | None
    arr: list | None
    lz: _Arrival | None

    def pieces(self) -> list:
        if self.pcs is None:
            self.pcs = [(self.s, self.e, self.r)]
        return self.pcs

    def arrival(self) -> list:
        if self.arr is None:
            if self.lz is not None:
                self.arr = self.lz.pieces()
                self.lz = None
                return self.arr
            f = self.f
            j = self.j
            prev = booked(f, j - 1) if j > 0 and f.links else None
            if prev is not None:    # as the link before serves it (a backlog if faster)
                self.arr = _arrival(prev.pieces(), f.rt.hops[j - 1][8], self.busy / prev.busy,
                                    self.s)
            elif j == 0 and f.rd is not None:   # an HBM read's bursts, as they are ready
                self.arr = burst_arrival(f.rd.times(), self.busy, f.rt.nb, f.fab.flit_bytes)
            else:
                self.arr = [(self.s, self.s + self.busy / self.r, self.r)]
        return self.arr

    def arrive(self, arr: list) -> None:
        """It now arrives as ``arr``."""
        self.arr = arr
        self.lz = None
        self.a_end = arr[-1][1]
        self.f.fab.flow_slots.moved(self.f.slot, self.j)     # (its link reads it here now)

    def arrive_as(self, lz: _Arrival, a_end: float) -> None:
        """It now arrives as ``lz`` describes, all of it by ``a_end``."""
        self.arr = None
        self.lz = lz
        self.a_end = a_end
        self.f.fab.flow_slots.moved(self.f.slot, self.j)


class _Arrival:
    """How a flow arrives at a link once ``_push`` moved it: as it left the link before
    (pieces ``src``: a list, or that link's ``_Arrival``), ``p0`` ns later, its shares times
    ``k`` (``coarse``), none of it before ``s`` (``fifo.not_before``). Worked out only when a stream
    meets the flow there (``Booked.arrival``): most never are, while every move of a flow
    redescribes its arrival at each link further on."""
    __slots__ = ("src", "p0", "k", "s", "arr")
    src: Any
    p0: float
    k: float
    s: float
    arr: list | None

    def __init__(self, src: Any, p0: float, k: float, s: float) -> None:
        self.src, self.p0, self.k, self.s = src, p0, k, s
        self.arr = None

    def pieces(self) -> list:
        if self.arr is None:
            src = self.src
            if not isinstance(src, list):
                src = src.pieces()
            self.arr = _arrival(src, self.p0, self.k, self.s)
            self.src = None
        return self.arr


def _arrival(src: list, p0: float, k: float, s: float) -> list:
    """Pieces ``src`` ``p0`` ns later, their shares times ``k``, as at most ``ARRIVAL_PIECES``
    pieces, none before ``s``."""
    return not_before(coarse([(a + p0, b + p0, r * k) for a, b, r in src], ARRIVAL_PIECES), s)


def book(link_flows: list, f: Flow, j: int, s: float, e: float, busy: float,
         pcs: list | None, tail: float) -> None:
    """Flow ``f`` took the share ``busy / (e - s)`` of hop ``j``'s link from ``s`` (alone
    until ``e``), served as ``pcs`` (None: ``[(s, e, share)]``), its tail leaving at
    ``tail``: note it with the flow and the link."""
    _book(link_flows[f.rt.links[j]], f, j, s, e, busy, pcs, tail)


def _book(lst: Any, f: Flow, j: int, s: float, e: float, busy: float, pcs: list | None,
          tail: float) -> None:
    """``book`` on the link whose bookings are ``lst`` (``Recs.book`` notes it there and in
    the flow's slot; ``routes._Plan.take`` calls that itself)."""
    a_end = lst.book(f.slot, j, s, e, busy, tail)
    if pcs is None:         # (the common case: a record only if it is asked for, ``booked``)
        f.links[j] = True
        return
    r = busy / (e - s)
    if r > 1.0:
        r = 1.0
    b = _record(f, j, s, e, r, busy, tail, a_end)
    b.pcs = pcs


def booked(f: Flow, j: int) -> Booked | None:
    """What flow ``f`` booked at hop ``j`` (None: nothing), its record made if not yet."""
    b: Any = f.links[j]
    if b is True:
        return _made(f.fab.flow_slots, f, j)
    return b


def _made(tab: Any, f: Flow, j: int) -> Booked:
    """The record of flow ``f``'s booking at hop ``j``, from what its slot in ``tab`` noted
    (``ledger.Slots``)."""
    s, e, busy, tail = tab.values(f.slot, j)
    r = busy / (e - s)
    if r > 1.0:
        r = 1.0
    return _record(f, j, s, e, r, busy, tail, s + busy / r)


def _record(f: Flow, j: int, s: float, e: float, r: float, busy: float, tail: float,
            a_end: float) -> Booked:
    b = Booked.__new__(Booked)
    b.f = f
    b.j = j
    b.s = s
    b.e = e
    b.r = r
    b.busy = busy
    b.pcs = None
    b.tail = tail
    b.arr = None
    b.lz = None
    b.a_end = a_end
    f.links[j] = b
    return b


def expand(f: Flow) -> list[tuple]:
    """The flow's rows, explicit (compact records expanded as the recorder expands them),
    leaving when ``_push`` moved them (``Flow.lv``), entered when its head now enters them
    (``Flow.hn``)."""
    lv = f.lv
    rows = f.rows
    if rows is not None:
        if lv is not None:
            for i in range(len(rows)):
                rw = rows[i]
                if rw[6] != lv[i]:
                    rows[i] = _leave(rw, lv[i])
        if f.hn is not None:
            enter_rows(f, rows)
        return rows
    rows = []
    op, tile, nb = f.op_id, f.tile, f.rt.nb
    for sg in f.segs:
        if sg[0] == "R":
            rw = sg[1]
            if lv is not None and rw[6] != lv[len(rows)]:
                rw = _leave(rw, lv[len(rows)])
            rows.append(rw)
            continue
        _k, pl, h, t, dn, n = sg
        for stage, node, link, busy, en, a, b, term in pl.rows[:n]:
            if lv is not None:
                leave = lv[len(rows)]
            elif term:
                leave = dn
            else:
                x = t + a
                y = h + b
                leave = x if x > y else y
            rows.append((op, tile, stage, node, link, h + en, leave, busy, 0.0, nb))
    if f.hn is not None:
        enter_rows(f, rows)
    f.rows = rows
    f.segs = []
    return rows


def _times(f: Flow) -> tuple[list[float], list[float]]:
    """The enter and leave times of the flow's rows, noted the first time (``Flow.en``,
    ``Flow.lv``: the row tuples are built once, when it completes, however often ``_push``
    moves them)."""
    if f.en is not None and f.lv is not None:
        return f.en, f.lv
    en: list[float] = []
    lv: list[float] = []
    if f.rows is not None:
        for rw in f.rows:
            en.append(rw[5])
            lv.append(rw[6])
    else:
        for sg in f.segs:
            if sg[0] == "R":
                rw = sg[1]
                en.append(rw[5])
                lv.append(rw[6])
                continue
            _k, pl, h, t, dn, n = sg
            for _stage, _node, _link, _busy, e0, a, b, term in pl.rows[:n]:
                en.append(h + e0)
                if term:
                    lv.append(dn)
                else:
                    x = t + a
                    y = h + b
                    lv.append(x if x > y else y)
    f.en = en
    f.lv = lv
    if f.slot >= 0:         # (its tails may now be later than its slot notes: ``bodies``)
        f.fab.flow_slots.retimed(f.slot)
    return en, lv


def incumbents(link_flows: list, li: int, f: Flow | None, h: float, now: float) -> list:
    """The bookings (``Booked``) on link ``li`` of flows still arriving there after ``h``
    (what arrived before is served first anyway), ``f``'s excepted, in the order they were
    booked; the link's ``Recs`` drops those of flows complete or all arrived by ``now`` (they
    can meet no one there any more)."""
    lst = link_flows[li]
    got = lst.scan(f.slot if f is not None else -1, h, now)
    inc = []
    for i in got:
        inc.append(booked(lst.tab.flows[lst.slot_at(i)], lst.hop_at(i)))
    return inc


def prune_flows(link_flows: list, now: float) -> None:
    """Every link's ``Recs`` drops the bookings of flows complete or all arrived by ``now``;
    the slots of the complete ones are free then."""
    for lst in link_flows:
        if lst.n:
            lst.prune(now)
    if link_flows:
        link_flows[0].tab.recycle()


def share_with(fab: Any, ln: Any, h: float, inc: list, extra: list) -> list:
    """The streams ``extra`` and the flows ``inc`` served on ``ln`` from ``h`` first come, first
    served (``fifo.share_fifo``; the flows' work given back, each now leaving later pushed);
    the results of ``extra``."""
    streams, kept = [], []
    for b in inc:
        pcs = b.pieces()
        d = unbook(ln, pcs, h)
        kp = [(a, z if z < h else h, r) for a, z, r in pcs if a < h]
        if b.j == 0 and b.f.rd is not None:     # (no more than its bursts ready by h)
            kp, d = served_as_ready(ln, kp, d, b.arrival(), h)
        kept.append(kp)
        streams.append([b.arrival(), b.busy, d, 0.0])
    res = share_fifo(ln, h, streams + extra)
    for i in range(len(inc)):
        b = inc[i]
        pcs, end, _hd = res[i]
        b.pcs = kept[i] + pcs
        tail = end if end > b.e else b.e
        if tail > b.tail + TIME_EPS:
            b.tail = tail
            _push(fab, b.f, b.j, tail, h)
    return res[len(inc):]


def fair_hop(fab: Any, rt: Any, j: int, h: float, t: float, inc: list,
             f: Flow | None) -> tuple[float, float, float]:
    """Serve the stream of ``rt`` at hop ``j`` (its head at the link at ``h``, its tail
    ready at ``t``) together with the flows ``inc`` booked there before it; returns its
    ``(start, head, tail)`` there as ``booking.fit_rate`` does."""
    _niv, _ov, ln, _li, _mode, hd_d, body, last_d, _p = rt.hops[j]
    busy = rt.busy[j]
    e = h + body
    if e < t:
        e = t
    e += last_d
    rho = busy / (e - h)
    if rho > 1.0:
        rho = 1.0
    prev = booked(f, j - 1) if f is not None and j > 0 else None
    hw = hd_d * rho
    if prev is not None:                # it arrives as the link before serves it
        arr = _arrival(prev.pieces(), rt.hops[j - 1][8], busy / prev.busy, h)
    elif j == 0 and f is not None and f.rd is not None:     # an HBM read: as it is ready
        arr, hw = burst_arrival(f.rd.times(), busy, rt.nb, fab.flit_bytes, BURST_NS), hd_d
    else:
        arr = [(h, h + busy / rho, rho)]
    pcs, end, head = share_with(fab, ln, h, inc, [[arr, busy, 0.0, hw]])[0]
    start = pcs[0][0] if pcs else h
    if head < 0.0:
        head = end
    tl = t + last_d
    tail = end if end > tl else tl
    if f is not None:
        book(fab.link_flows, f, j, h, e, busy, pcs, tail)
    return start, head, tail


def _push(fab: Any, g: Flow, j0: int, tail: float, t_from: float, hs: float = -1.0) -> None:
    """Flow ``g``'s tail leaves hop ``j0``'s link at ``tail`` now, later than booked: carry
    the delay along its path (each further link: its tail no earlier than its new arrival's
    plus the last flit), rewrite its rows and move its completion. Its bookings further on
    keep their times (the rows widen over them), but what it books there is now described
    as arriving as it leaves the link before (its ``Booked.arrival``), so a stream that meets
    it there later serves it from that (``fair_hop``). ``t_from``: when the meeting began.
    ``hs`` (if not negative): its head now starts on hop ``j0``'s link then, later than booked
    (``heads.serve_head``); the head's delay is carried on too: it reaches each further node
    later, its overhead there moves (``heads.head_at``), and each link's tail is no earlier than the
    whole transfer after its head."""
    rt = g.rt
    en, lv = _times(g)
    hops = rt.hops
    tcur = tail + hops[j0][8]
    lv[j0] = tcur
    n = len(rt.links)
    busy = rt.busy
    for j in range(j0 + 1, n):
        hp = hops[j]
        mode = hp[4]
        body = hp[6]
        last_d = hp[7]
        p = hp[8]
        rec = booked(g, j)
        if hs >= 0.0:                   # the head reaches node j at ha
            pm = hops[j - 1]
            ha = hs + (pm[5] if pm[4] else 0.0) + pm[8]
            hs = -1.0
            if ha > en[j] + TIME_EPS:
                hs = fab.head_at(fab, g, j, en[j], ha)  # (``heads``)
                if rec is not None and mode == 2:       # (its booking keeps its start)
                    entered(g, j, ha, rec.pcs[0][0] if rec.pcs is not None else rec.s)
                else:
                    entered(g, j, ha, INF)
                if rec is not None:
                    if hs > rec.s + TIME_EPS:
                        rec.pieces()
                        rec.s = hs
                        if rec.arr is not None or rec.lz is not None:
                            rec.arrive(not_before(rec.arrival(), hs))
                    else:
                        hs = -1.0
        if rec is None or mode != 2:            # (a link without bandwidth, a single flit)
            x = tcur if tcur > en[j] else en[j]
            if mode == 1 and hs >= 0.0:     # its link booking moves with its head
                x = fab.relink(fab, g, j, hs)
                if x > tcur:
                    tcur = x
            tcur = x + p if mode == 0 else tcur + p
            x = lv[j]
            if tcur < x:
                tcur = x
            lv[j] = tcur
            continue
        tin = tcur if tcur > rec.s else rec.s
        tl = tin + last_d
        if hs >= 0.0 and hs + body + last_d > tl:
            tl = hs + body + last_d
        prev = booked(g, j - 1)
        if prev is not None:            # it arrives as it left the link before
            p0 = hops[j - 1][8]
            k = busy[j] / busy[j - 1]
            src: list | _Arrival
            if j - 1 == j0:
                src = prev.pieces()
                end = src[-1][1]
            else:
                src = prev.arrival() if prev.lz is None else prev.lz
                end = prev.a_end
            end += p0
            if end > rec.s:     # (then its last piece ends there: the rest can wait)
                rec.arrive_as(_Arrival(src, p0, k, rec.s), end)
            else:
                rec.arrive(_arrival(src if isinstance(src, list) else src.pieces(), p0, k,
                                    rec.s))
        if tl <= rec.tail + TIME_EPS:     # its booking there still holds it
            if hs < 0.0:
                return
            tcur = rec.tail + p
            continue
        tj = rec.tail if rec.tail > tl else tl
        rec.tail = tj
        tcur = tj + p
        lv[j] = tcur
    if g.wr:            # its head and tail reach the controller: the commit moves with them
        ha = -1.0
        if hs >= 0.0:
            pm = hops[n - 1]
            ha = hs + (pm[5] if pm[4] else 0.0) + pm[8]
        g.ev.recommit(ha, tcur)
        return
    if hs >= 0.0:       # its head reaches the destination later too
        pm = hops[n - 1]
        ha = hs + (pm[5] if pm[4] else 0.0) + pm[8]
        if ha > en[n] + TIME_EPS:
            entered(g, n, ha, INF)
    x = en[n]
    if x < tcur:
        x = tcur
    if x > g.tt:
        lv[n] = x
        _move(fab, g, x)


def _leave(rw: tuple, x: float) -> tuple:
    """Hop row ``rw`` (the recorder's ten fields) leaving at ``x``."""
    return (rw[0], rw[1], rw[2], rw[3], rw[4], rw[5], x, rw[7], rw[8], rw[9])


def _move(fab: Any, g: Flow, tt: float) -> None:
    """Move ``g``'s completion to ``tt``."""
    g.ev = _moved(fab.env, g.ev, tt, g.ack)
    g.tt = tt


def _moved(env: Any, old: Any, tt: float, ack: float) -> Any:
    """A completion event ``old`` moved to ``tt`` (fired ``ack`` later, value ``tt``): a new
    event carrying its callbacks (a scheduled event cannot be rescheduled)."""
    ev = after(env, tt + ack - env._now, tt)
    ev.callbacks = old.callbacks
    old.callbacks = []
    return ev
