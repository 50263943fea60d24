"""Fast mode's node overheads served in arrival order (``fast`` mode's fair share).

Fast mode books a transfer when it starts (``fast.FastFabric``), so a node's overhead
reservations are in start order, while flit mode's node serves heads in the order they
arrive. Beside each reservation a flow's head (``fair.Flow``) took at a node as it arrived,
the node's ``booking.Spans`` notes whose it is (``Spans.own``, ``ledger.Slots.owner``):
``(flow, hop, arrival)``, or the flow alone where its head arrived at the start (most do; its
hop is where the node is on its route). A head served at a node
(``serve_head``, from ``FastFabric._hop``) goes before every such reservation of a head that
arrives after it: those flows are served after it, and each moves (``_delay``): its head
leaves the node later, ``fair._push`` carries the delay along its path, and at each further
node its overhead moves (``head_at``, first come, first served again), which may push the
flows of later heads there in turn, at most ``PUSH_DEPTH`` deep (never the flow being booked:
its rows are not all there yet; a moved IPCQ credit pushes only at mesh routers and takes the
gaps at other nodes, pushing no one).
A single flit to a node without an HBM commit (an IPCQ
credit) is a flow too: its tail is its head, unless it queued for the link after the node.
A one-flit HBM write is a flow too: its HBM commit (``commit_later``: a SimPy event when its
head reaches the controller, ``HbmWrite``) moves with its head (``HbmWrite.recommit``). A
single flit whose head moves gives back its booking on the link after the node and books it
again from its new time (``relink``; kept where it would then wait behind bookings made after
it). Single flits of flows cross a link in arrival order likewise (``serve_flit``: a flit
arriving first takes the link from those booked before it, which are booked again behind it
and their flows pushed, where that costs each no more than a flit time). A single flit that
would wait on a link where streams are still arriving is served with them first come, first
served (``_in_fifo``: an IPCQ credit crossing PCIe behind the payloads that arrived there
before it, not behind every payload booked before it; an HBM read arriving as its bursts are
ready, ``fifo.burst_arrival``). Reservations of heads that cannot move (HBM writes of two
flits or more: flows on links, their node reservations fixed, ``routes._Route.fixed``) keep
their times, and a head takes the gaps between them (``booking.serve``: preemptive resume).
Such a write's commit moves with its tail when streams slow it on a link
(``HbmWrite.recommit``), and its bursts reach the pseudo-channels as its last link serves it
(``arrivals``). At a mesh router, a stream's flits after its head
wait behind every head that arrived there before them (``bodies``: heads booked before it
hold its tail, ``bodies.body_hold``; heads booked later push it, ``bodies.hold_bodies`` from
``serve_head``, finding it among the bookings of the links into the router).

A head moved later at a mesh router lets the IPCQ credits that queued behind its old
reservation there, and arrived before its new arrival, go first (``pull.pull_behind``,
reached through ``FastFabric.pull_behind``: they move earlier).

Imports ``booking``, ``fair`` and ``bodies``; ``fast`` imports this (``fair._push`` reaches
``head_at`` through ``FastFabric.head_at``, so there is no cycle).
"""

from __future__ import annotations

from typing import Any

from simpy.events import NORMAL  # the priority of a Timeout

from kbtrace.replay.fabric.bodies import hold_bodies
from kbtrace.replay.fabric.booking import (
    Spans,
    Steps,
    add_shares,
    fit_rate,
    prune_states,
    serve,
    unbook,
)
from kbtrace.replay.fabric.events import _Ev, after
from kbtrace.replay.fabric.fair import (
    Flow,
    _moved,
    _push,
    _times,
    booked,
    incumbents,
    prune_flows,
    share_with,
)
from kbtrace.replay.intervals import TIME_EPS

__all__ = ["PUSH_DEPTH", "serve_head", "serve_flit", "head_at", "prune_owners", "prune_links",
           "prune_all", "relink", "HbmWrite", "arrivals", "commit_later"]

#: a head served first pushes flows booked before it, whose heads pushed further on may push
#: others in turn, so deep (all_gather: 2.1% late with one level, 0.03% from six on)
PUSH_DEPTH = 8


def serve_head(fab: Any, n: int, iv: Spans, now: float, h: float, ov: float, j: int,
               f: Flow | None, flits: bool = False) -> float:
    """Serve the overhead ``ov`` of a head arriving at node ``n`` at ``h`` (``iv``: the node's
    reservations) first come, first served, as flit mode's node serves heads: reservations
    after ``h`` that belong to flows whose heads arrive later (booked earlier, as fast mode
    books in start order; ``Spans.own``) go after it, their flows delayed
    (``_delay``, at most ``PUSH_DEPTH`` deep), served again in the order their heads arrive
    (not in the order of their old reservations: a head that moved later at this node after
    another had queued behind it would else still go first; ring_allreduce per-op p95 4.62%
    -> 0.00%); the others keep their times and the head takes the gaps between them
    (``booking.serve``). Returns when its overhead is done. If the head
    is flow ``f``'s (hop ``j``), its reservation may move in turn. ``flits``: push only the
    flows of single flits (a moved IPCQ credit, ``head_at``)."""
    tab = fab.flow_slots
    pushed = []
    if iv.owned() and iv.last() > h and fab.push_depth < PUSH_DEPTH:
        i = iv.bisect_right(h)
        hz = h
        if i & 1:                       # one under way: after it
            hz = iv.at(i)
            i += 1
        hz += ov
        while i < iv.n and iv.at(i) < hz - TIME_EPS:
            s_r = iv.at(i)
            e_r = iv.at(i + 1)
            hz += e_r - s_r
            o = tab.owner(iv, i, n)
            if o is not None:
                if type(o) is tuple:
                    g, jg, a = o
                else:                   # (a flow alone: its head arrived at s_r)
                    g, jg, a = o, -1, s_r
                if not g.fin and a > h + TIME_EPS and g is not fab._f:
                    if jg < 0:          # (a route passes a node once: where it is on it)
                        jg = g.rt.nodes.index(n)
                    if not flits or g.rt.hops[jg][4] == 1:
                        pushed.append((g, jg, a, e_r, e_r - s_r))
                        iv.cut(i, i + 2)
                        continue
            i += 2
    e = _reserve(fab, n, iv, f, j, h, ov) if f is not None else serve(iv, now, h, ov)
    ins = fab.body_in[n]
    if ins and fab.push_depth < PUSH_DEPTH:     # (a mesh router: ``bodies``)
        hold_bodies(fab, ins, now, h, e, f, f is not None and f.rt.nb <= fab.flit_bytes, ov)
    if pushed:
        if len(pushed) > 1:             # served again first come, first served
            pushed.sort(key=_pushed_arrival)
        fab.push_depth += 1
        for g, jg, a, e_r, w in pushed:
            e2 = _reserve(fab, n, iv, g, jg, a, w)
            if e2 > e_r + TIME_EPS:
                _delay(fab, g, jg, e2)
        fab.push_depth -= 1
    return e


def prune_all(fab: Any, now: float) -> None:
    """Drop what can no longer meet a transfer starting at ``now`` or later: flows' link
    bookings, movable reservations, and nodes' and links' past intervals."""
    prune_flows(fab.link_flows, now)
    prune_owners(fab.node_iv, now)
    prune_links(fab.link_own, now)
    prune_states(fab.node_iv, fab.link_steps, now, 64)


def _reserve(fab: Any, n: int, iv: Spans, g: Flow, j: int, a: float, w: float) -> float:
    """Serve ``w`` ns of node ``n`` (reservations ``iv``) for flow ``g``'s head arriving at
    ``a`` (hop ``j``); a reservation in one piece is noted as the flow's (``Spans.own``), so
    a head arriving before ``a`` may move it. Returns when it is done."""
    e = serve(iv, fab.env._now, a, w)
    k = iv.bisect_right(e - TIME_EPS)
    if k & 1 and k < iv.n:
        s0 = iv.at(k - 1)
        if s0 >= e - w - TIME_EPS and not g.rt.fixed:     # (``_Route.fixed``)
            tab = fab.flow_slots
            tab.own(iv, k - 1, g.slot, a)
            if g.nres is None:
                g.nres = {}
            g.nres[j] = s0
    return e


def _delay(fab: Any, g: Flow, j: int, e2: float) -> None:
    """Flow ``g``'s head leaves node ``j`` at ``e2`` now, later than booked: its tail leaves
    hop ``j``'s link no earlier than the whole transfer after it (``_push`` carries it on)."""
    _niv, _ov, _ln, _li, mode, hd, body, last_d, p = g.rt.hops[j]
    if mode == 1:               # a single flit: its link booking moves with its head
        tl = relink(fab, g, j, e2)
        if tl + p > _times(g)[1][j] + TIME_EPS:
            _push(fab, g, j, tl, e2, e2)
        return
    b = booked(g, j) if g.links else None
    if b is None or mode != 2:
        return
    tail = e2 + body + last_d
    if tail < b.tail:
        tail = b.tail
    b.tail = tail
    _push(fab, g, j, tail, e2, e2)


def relink(fab: Any, g: Flow, j: int, hs: float) -> float:
    """Flow ``g``'s single flit now starts on hop ``j``'s link at ``hs`` (its head was pushed
    at the node before): what it booked there from earlier is given back and booked again
    from ``hs`` with what the link spares (``fit_rate``). Returns when it has crossed."""
    hp = g.rt.hops[j]
    hd = hp[5]
    sl = g.sl
    pcs = sl.get(j) if sl is not None else None
    if sl is None or pcs is None or pcs[0][0] >= hs - TIME_EPS:
        return hs + hd
    ln = hp[2]
    s0 = pcs[0][0]
    unbook(ln, pcs, s0)
    own = fab.link_own[g.rt.links[j]]
    o = own.get(s0)
    if o is not None and o[0] is g:
        del own[s0]
    new: list = []
    _s, _hd, td = fit_rate(ln, fab.env._now, hs, hd, hd, 0.0, 0.0, g.rt.busy[j], new)
    e_old = pcs[-1][1]
    x = hs + hd if hs + hd > e_old else e_old
    if td > x + hd + TIME_EPS:          # behind bookings made after it: keep its booking, it
        unbook(ln, new, new[0][0])          # crosses as it comes (flit mode's FIFO would
        _rebook(ln, pcs)                    # serve it before their later flits)
        g.booked_flit(j, pcs, hs)
        return x
    g.booked_flit(j, new, hs)
    return td


def serve_flit(fab: Any, rt: Any, j: int, now: float, h: float) -> tuple[float, float, float]:
    """Book the single flit of route ``rt`` on hop ``j``'s link, its head there at ``h``, as
    flit mode's link serves whole flits, first come, first served: the single flits of
    flows booked there before it but arriving after it (``FastFabric.link_own``) that hold
    the link where it would cross are given back; it takes the link; each is booked again
    from its arrival, in arrival order, its flow delayed (``fair._push``) if it now crosses
    later (at most ``PUSH_DEPTH`` deep). Where it would wait and flows are still arriving
    at the link, it is served with them first come, first served (``_in_fifo``): behind their
    work that arrived before it, before what arrives after. A flow on its first link is left
    out (it keeps its booking) unless it reads HBM: a DMA's data is all there at once, a
    backlog its arrival at the link's rate does not describe, where a read's bursts arrive
    over its span. Others keep their bookings and it takes what they spare (``fit_rate``).
    Returns ``(start, head, tail)`` as ``fit_rate``; the flow being booked (``fab._f``)
    notes its booking."""
    hp = rt.hops[j]
    ln, hd = hp[2], hp[5]
    busy = rt.busy[j]
    f = fab._f
    own = fab.link_own[rt.links[j]]
    pcs: list = []
    s, hd2, td = fit_rate(ln, now, h, hd, hd, 0.0, 0.0, busy, pcs)
    if td > h + hd + TIME_EPS:         # (it waits: also behind work arriving after it?)
        kinds = fab.node_kind
        inc = [b for b in incumbents(fab.link_flows, rt.links[j], f, h, now)
               if b.j > 0 or kinds[b.f.rt.nodes[0]] == "hbm_ctrl"]
        if inc:
            unbook(ln, pcs, pcs[0][0])
            pcs, s, hd2, td = _in_fifo(fab, ln, h, busy, inc)
    if own and td > h + hd + TIME_EPS and fab.push_depth < PUSH_DEPTH:
        hi = h + TIME_EPS
        late = [(o[2], s_r, o[0], o[1]) for s_r, o in own.items()
                if s_r < td - TIME_EPS and o[2] > hi and o[0] is not f and not o[0].fin]
        if late:
            late.sort(key=_by_arrival)
            moved = _first(fab, ln, now, h, hd, busy, pcs, late, own)
            if moved is not None:
                pcs, s, hd2, td = moved
    if f is not None:
        f.booked_flit(j, pcs, h)
    return s, hd2, td


def _in_fifo(fab: Any, ln: Steps, h: float, busy: float, inc: list) -> tuple:
    """``serve_flit``'s queue: a single flit arriving at ``h`` on a link where the flows
    ``inc`` are still arriving is served with them first come, first served
    (``fifo.share_fifo``), as flit mode's link FIFO serves it behind the flits queued when it
    arrives and before those arriving after it: their work from ``h`` on is given back and
    served again with the flit, and each flow whose tail now leaves later is pushed
    (``fair._push``). Returns ``(pieces, start, head, tail)`` of the flit."""
    pcs, end, _hd = share_with(fab, ln, h, inc, [[[(h, h + busy, 1.0)], busy, 0.0, 0.0]])[0]
    return pcs, (pcs[0][0] if pcs else h), end, end


def _first(fab: Any, ln: Steps, now: float, h: float, hd: float, busy: float,
           pcs: list, late: list, own: dict) -> tuple | None:
    """``serve_flit``'s move: the flit booked as ``pcs`` takes the link first, the flits
    ``late`` (``(arrival, start, flow, hop)``, in arrival order) are booked again after it and
    their flows pushed. Not done (``None``, nothing changed) if one of them would then cross
    more than the flit's time later than before: it would wait behind bookings made after
    it (streams take what a link spares), where flit mode's FIFO would serve it first."""
    olds = [g.sl[jg] for _a, _s, g, jg in late]
    unbook(ln, pcs, pcs[0][0])
    for old in olds:
        unbook(ln, old, old[0][0])
    mine: list = []
    s, hd2, td = fit_rate(ln, now, h, hd, hd, 0.0, 0.0, busy, mine)
    news = []
    ok = td <= h + hd + TIME_EPS        # (else others still hold it: as booked)
    for (a, _s, g, jg), old in zip(late, olds, strict=True):
        new: list = []
        t2 = fit_rate(ln, now, a, g.rt.hops[jg][5], g.rt.hops[jg][5], 0.0, 0.0,
                      g.rt.busy[jg], new)[2]
        news.append((new, t2))
        if t2 > old[-1][1] + hd + TIME_EPS:
            ok = False
    if not ok:                          # as it was
        unbook(ln, mine, mine[0][0])
        for new, _t2 in news:
            unbook(ln, new, new[0][0])
        for old in olds:
            _rebook(ln, old)
        _rebook(ln, pcs)
        return None
    for _a, s_r, _g, _jg in late:
        del own[s_r]
    fab.push_depth += 1
    for (a, _s, g, jg), old, (new, t2) in zip(late, olds, news, strict=True):
        g.booked_flit(jg, new, a)
        if t2 > old[-1][1] + TIME_EPS:
            _push(fab, g, jg, t2, h, t2 - g.rt.hops[jg][5])
    fab.push_depth -= 1
    return mine, s, hd2, td


def _rebook(ln: Steps, pcs: list) -> None:
    """Book the pieces ``pcs`` (``(start, end, share)``) given back by ``unbook`` again as
    they were."""
    for a, b, r in pcs:
        add_shares(ln, a, b, (r,))


def _by_arrival(x: tuple) -> tuple:
    return x[0], x[1]


def _pushed_arrival(x: tuple) -> tuple:
    """``serve_head``'s pushed heads by arrival (then by their old reservation's end)."""
    return x[2], x[3]


def prune_links(link_own: list, now: float) -> None:
    """Forget the movable single-flit link bookings whose flits arrive by ``now``."""
    for own in link_own:
        if own:
            for s in [s for s, o in own.items() if o[2] <= now]:
                del own[s]


def prune_owners(node_iv: list, now: float) -> None:
    """Forget who holds the node reservations that start by ``now`` (their heads are there:
    none moves; ``Spans.disown``)."""
    for iv in node_iv:
        if iv.owned():
            iv.disown(now)


def head_at(fab: Any, g: Flow, j: int, old: float, ha: float) -> float:
    """Flow ``g``'s head reaches node ``j`` of its path at ``ha`` instead of ``old``: its
    overhead there moves if it was served as the head arrived (``Spans.own``; first
    come, first served: ``serve_head``), else it is taken as due; returns when the head
    leaves the node. A single flit between PEs (an IPCQ credit; not a one-flit read or write)
    moved to a UCIe, IO or PCIe node (overheads of 5-10 ns) takes the node's gaps
    (``booking.serve``) and pushes no flow in turn: pushes carried on from credit to credit
    there made fast mode chaotic (llama_layer on default.yaml 11,996 ns with the PCIe switch
    overhead at 5.0 ns, 19,147 ns at 5.000001, flit mode 11,881 at both; one level of them
    still did), and so did noting its new reservation there (12,119-14,531 ns under 1e-6
    nudges of the router and switch overheads). At a mesh router it is served first come,
    first served (``serve_head``): it goes before the reservations of single flits (other
    credits, one-flit reads and writes) whose heads arrive after it, pushing their flows, and
    takes the gaps around those of streams; its new reservation is noted as its, so a head
    booked later that arrives before it still goes first and pushes it (ring_allreduce: a
    payload that pushed a credit at one router was then served after it at the next, where it
    arrives first; a credit moved by 0.54 ns took the gaps around the reservation of another
    credit it still arrived before, 2 ns late where flit mode serves it first: ring per-op
    p95 10.79% -> 6.80%; llama_layer on default.yaml 11,978-12,020 ns under the same nudges).
    Streams are not pushed: a credit moved again later leaves them pushed for nothing (fast
    mode never moves a booking earlier), which made the ring with one IPCQ slot 0.26% late
    (per-op p95 3.66%), exact as it is."""
    niv, ov = g.rt.hops[j][0], g.rt.hops[j][1]
    if niv is None:
        return ha + ov
    n = g.rt.nodes[j]
    s0 = g.nres.get(j, old) if g.nres is not None else old
    i = niv.bisect_right(s0) - 1
    if i >= 0 and not i & 1 and niv.at(i) == s0:
        tab = fab.flow_slots
        o = tab.owner(niv, i, n)
        if o is not None and (o is g or type(o) is tuple and o[0] is g):
            niv.cut(i, i + 2)
            if ha > s0 + TIME_EPS and fab.push_depth < PUSH_DEPTH:
                fab.pull_behind(fab, n, niv, s0, ha, g)     # (``pull``: credits behind it)
            if g.rt.hops[j][4] == 1 and not g.wr and g.rt.nodes[0] not in fab.hbm:
                if fab.node_kind[n] != "router":            # (a credit: see above)
                    return serve(niv, fab.env._now, ha, ov)
                return serve_head(fab, n, niv, fab.env._now, ha, ov, j, g, True)
            return serve_head(fab, n, niv, fab.env._now, ha, ov, j, g)
    return ha + ov


class HbmWrite:
    """An HBM write's completion in fast mode: ``done`` (its last burst's finish) moves later
    when a read, or a burst that arrives before one of its bursts booked ahead, is booked
    before them (``HbmController.write_stream``, ``push``); its event then moves as a flow's
    does. Its terminal hop row is recorded when the event fires, with the final time.
    Its pseudo-channel commits run in the event ``cev`` when its head reaches the controller
    (at ``hh``; its tail at ``tt``); where the write is a ``Flow`` (``flow``: its head moves at
    nodes, ``serve_head``; a stream slowed on a link by streams that meet it, ``fair``) the
    commit moves with it (``recommit``) and the flow's rows are recorded with the terminal
    row."""
    __slots__ = ("fab", "ev", "ack", "pend", "done", "row", "flow", "hh", "tt", "cev")

    def __init__(self, fab: Any, ev: Any, ack: float, row: tuple, flow: Flow | None = None,
                 hh: float = 0.0, tt: float = 0.0) -> None:
        self.fab, self.ev, self.ack, self.row = fab, ev, ack, row
        self.pend: list[list[Any]] = []     # its bursts booked ahead (``HbmController.pc_iv``)
        self.done = -1.0
        self.flow = flow
        self.hh, self.tt = hh, tt
        self.cev: Any = None

    def recommit(self, ha: float, tt: float) -> None:
        """Its flow's head now reaches the controller's node at ``ha`` (if not negative) and
        its tail at ``tt``, later than booked (``fair._push``): the commit moves with them
        while it is still ahead. Committed already (a stream slowed after its head arrived),
        its bursts keep their pseudo-channel times and its completion moves to as long after
        the new tail as it was after the old one: never before its last flit arrives."""
        if self.done >= 0.0:            # committed already
            if tt > self.tt + TIME_EPS:
                lag = self.done - self.tt
                self.tt = tt
                self._later(tt + (lag if lag > 0.0 else 0.0))
            return
        op, tile, stage, node, h_in, busy, q, nb = self.row
        hh = self.hh
        if ha > h_in + TIME_EPS:        # its overhead there (and queue) after the new head
            ov = hh - h_in - q
            if ha + ov > hh:
                hh = ha + ov
            self.row = (op, tile, stage, node, ha, busy, hh - ha - ov, nb)
        if tt < hh:
            tt = hh
        if tt > self.tt:
            self.tt = tt
        if hh > self.hh + TIME_EPS:
            self.hh = hh
            self.cev = _moved(self.fab.env, self.cev, hh, 0.0)

    def _latest(self, done: float) -> float:
        """``done`` or the finish of a burst booked ahead, whichever is later."""
        for x in self.pend:
            if x[2] > done:
                done = x[2]
        return done

    def start(self, done: float) -> None:
        """Committed: its completion ``done`` (+ ``ack``); the row is recorded when it fires."""
        env = self.fab.env
        done = self._latest(done)
        self.done = done
        ev = self.ev
        ev._value = done
        ev.callbacks.insert(0, self._record)
        env.schedule(ev, NORMAL, done + self.ack - env._now)

    def push(self) -> None:
        """Some of its bursts booked ahead finish later now: so may it."""
        if self.done < 0.0:             # (being committed: ``start`` takes them)
            return
        self._later(self._latest(self.done))

    def _later(self, done: float) -> None:
        """Committed: its completion moves to ``done`` if that is later."""
        if done > self.done:
            self.ev = _moved(self.fab.env, self.ev, done, self.ack)
            self.done = done

    def _record(self, _ev: Any) -> None:
        # Its bursts have all arrived (none can move now): drop them, or each burst and this
        # write hold each other until a full collection (all_gather on default.yaml held
        # 2.57-2.62 KiB per added op with them, 1.80-1.96 without: docs/replay.md).
        self.pend = []
        f = self.flow
        if f is not None:       # its link rows first (their order is path order)
            self.flow = None    # (``f.ev`` is this write: no cycle left either)
            f.done(None)
        op, tile, stage, node, h_in, busy, q, nb = self.row
        self.fab.rec.rows([(op, tile, stage, node, -1, h_in, self.done, busy, q, nb)])


def arrivals(f: Flow, hh: float, tt: float, burst: int) -> list[float] | None:
    """Per burst of HBM write ``f``, when it reaches the controller: as its last link serves it,
    where streams that met it there split that into pieces (``fair``), mapped onto its head's
    and tail's arrivals ``hh`` / ``tt``; None where it was served at one rate (its bursts
    arrive evenly between the two, ``HbmController.write_stream``)."""
    j = len(f.rt.links) - 1
    if j < 0:
        return None
    b = booked(f, j)
    if b is None:
        return None
    pcs = b.pieces()
    n = -(-f.rt.nb // burst)
    if len(pcs) < 2 or n < 2:
        return None
    s0 = pcs[0][0]
    span = pcs[-1][1] - s0
    if span <= 0.0:
        return None
    work = 0.0
    for a, e, r in pcs:
        work += r * (e - a)
    scale = (tt - hh) / span
    out = []
    k = 0
    done = 0.0                  # work served before piece k
    for i in range(n):
        x = work * i / (n - 1)
        while k + 1 < len(pcs):
            a, e, r = pcs[k]
            if done + r * (e - a) >= x:
                break
            done += r * (e - a)
            k += 1
        a, e, r = pcs[k]
        t = a + (x - done) / r if r > 0.0 else e
        if t > e:
            t = e
        out.append(hh + (t - s0) * scale)
    return out


def commit_later(fab: Any, rt: Any, op_id: int, tile: int, addr: int, h_in: float, hh: float,
                 tt: float, q: float, ack: float) -> Any:
    """The HBM commit of a write whose head reaches the controller at ``hh`` and tail at
    ``tt``: done at ``hh`` (a SimPy event then), not when the transfer is booked, so the
    pseudo-channels serve requests in the order they arrive -- a read that reaches them
    first is not queued behind a write still on its way (flit mode commits flit by flit
    as they arrive). Returns the transfer's completion event, fired ``ack`` after the last
    commit, which moves later if requests arriving before its bursts are booked before
    them (``HbmWrite``, which records the terminal row when it fires)."""
    env = fab.env
    hbm = rt.hbm
    assert hbm is not None          # (a transfer to a node with HBM)
    ev = _Ev()
    ev.callbacks = []
    ev._ok = True
    ev._value = None
    f = fab._f
    w = HbmWrite(fab, ev, ack, (op_id, tile, rt.term_stage, rt.dst, h_in, rt.term_busy, q,
                                 rt.nb), f, hh, tt)
    if f is not None:       # its head may move at a node still (``heads``): so may this
        f.ev = w

    def commit(_e: Any) -> None:
        w.start(hbm.write_stream(addr, rt.nb, w.hh, w.tt, env._now, op_id, w,
                                 None if f is None else arrivals(f, w.hh, w.tt, hbm.burst)))

    w.cev = after(env, hh - env._now)
    w.cev.callbacks.append(commit)
    return ev
