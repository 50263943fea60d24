"""Fast mode's IPCQ credits moved earlier where a head they queued behind moved later.

Fast mode books a transfer when it starts, so a node's overheads are reserved in start
order, and a head that arrives while another head's overhead is reserved takes the gap
after it. When that other head is later pushed (``heads``: a head that arrived before it
went first, and its flow moved), its overhead at each further node moves later too
(``heads.head_at``), and flit mode, whose node is one FIFO, serves first a head that
arrived there before the moved one's new arrival. Bookings in fast mode otherwise only ever
move later; here an IPCQ credit (a single flit between PEs, ``fair.Flow``) that queued at
the node behind the moved head's old reservation, and whose head arrived before the moved
head's new arrival, is served again from its arrival, in the gap the moved head left
(``pull_behind``), and carried on along its path as far as it gains (``_pull``): its
booking on each further link given back and booked again from its new time
(``_relink_early``; kept where that is not earlier), its overhead at each further node
served again as it now arrives (``heads.head_at``), its hop rows and its completion event
moved earlier (never before the present). The moved head is then served after it.

Found on ring_allreduce (small.yaml, router 26): payload 212, pushed 0.9 ns at an earlier
router, reached router 26 after credit 263, which had been booked behind 212's old
reservation there; flit mode serves 263 first, fast mode served it 1.9 ns late, and the
ring after it.

An HBM read's stream booked on its first link after single flits of flows that arrive there
after its first bursts is served with them first come, first served (``read_first``, from
``routes.stream``): they were booked first, at their arrival, and crossed in what the
read then left, where flit mode's link FIFO sends each behind the bursts ready before it;
they move later (pushed). The other order, a flit booked after the read, is
``heads._in_fifo``'s.

Imports ``booking``, ``fair``, ``fifo`` and ``heads``; ``heads.head_at`` reaches ``pull_behind``
through ``FastFabric.pull_behind`` (no cycle).
"""

from __future__ import annotations

from typing import Any

from kbtrace.replay.fabric.booking import Spans, fit_rate, unbook
from kbtrace.replay.fabric.enters import row_at
from kbtrace.replay.fabric.fair import Flow, _move, _push, _times, book, expand, share_with
from kbtrace.replay.fabric.fifo import BURST_NS, burst_arrival
from kbtrace.replay.fabric.heads import PUSH_DEPTH, _by_arrival, _rebook, _reserve, head_at
from kbtrace.replay.intervals import TIME_EPS

__all__ = ["pull_behind", "read_first"]


def pull_behind(fab: Any, n: int, iv: Spans, s0: float, ha: float, g: Flow) -> None:
    """Flow ``g``'s overhead reservation at node ``n`` (reservations ``iv``) from ``s0`` was
    given back, its head now arriving at ``ha``: the IPCQ credits whose heads arrived there
    before ``ha`` and whose reservations start after their arrival, from ``s0`` to ``ha`` plus
    the node's overhead (queued behind it), are served again from their arrival, in arrival
    order, and carried on earlier (``_pull``)."""
    tab = fab.flow_slots
    if not iv.owned() or fab.node_kind[n] != "router":
        return
    i = iv.bisect_right(s0 - TIME_EPS)
    if i & 1:
        i += 1
    lim = ha + fab.node_ov[n] + TIME_EPS
    cands = []
    while i < iv.n:
        s_r = iv.at(i)
        if s_r > lim:
            break
        o = tab.owner(iv, i, n)
        if o is not None and type(o) is tuple:
            c, jc, a = o
            if (not c.fin and c is not g and c is not fab._f and a < s_r - TIME_EPS
                    and a < ha - TIME_EPS and c.rt.hops[jc][4] == 1 and not c.wr
                    and c.rt.nodes[0] not in fab.hbm):
                cands.append((a, s_r, iv.at(i + 1), c, jc))
        i += 2
    if not cands:
        return
    cands.sort(key=_by_arrival)
    fab.push_depth += 1
    for a, s_r, e_r, c, jc in cands:
        k = iv.bisect_right(s_r) - 1
        if k < 0 or k & 1 or iv.at(k) != s_r:
            continue
        iv.cut(k, k + 2)
        e2 = _reserve(fab, n, iv, c, jc, a, e_r - s_r)
        if e2 < e_r - TIME_EPS:
            _pull(fab, c, jc, e2)
    fab.push_depth -= 1


def _relink_early(fab: Any, c: Flow, k: int, hs: float) -> float:
    """Credit ``c`` now starts on hop ``k``'s link at ``hs``, earlier than booked: its booking
    there is given back and booked again from ``hs`` with what the link spares, unless that
    is not earlier (then as it was). Returns when it has crossed."""
    hp = c.rt.hops[k]
    hd = hp[5]
    sl = c.sl
    pcs = sl.get(k) if sl is not None else None
    if not pcs:
        return hs + hd
    s0 = pcs[0][0]
    end = pcs[-1][1]
    if s0 <= hs + TIME_EPS:
        return end if end > hs + hd else hs + hd
    ln = hp[2]
    unbook(ln, pcs, s0)
    own = fab.link_own[c.rt.links[k]]
    o = own.get(s0)
    a = -1.0
    if o is not None and o[0] is c:
        a = o[2]
        del own[s0]
    new: list = []
    td = fit_rate(ln, fab.env._now, hs, hd, hd, 0.0, 0.0, c.rt.busy[k], new)[2]
    if td > end - TIME_EPS:             # (no gain: as it was)
        unbook(ln, new, new[0][0])
        _rebook(ln, pcs)
        c.booked_flit(k, pcs, a)
        return end
    c.booked_flit(k, new, hs)
    return td


def _pull(fab: Any, c: Flow, j: int, e2: float) -> None:
    """Credit ``c``'s head now leaves node ``j`` of its path at ``e2``, earlier than booked:
    carry it on as far as it gains (each hop: the link after the node, then the next node's
    overhead as the head now arrives), its rows (entered as it now arrives, leaving as it
    now leaves, their queueing no longer than fits) and its completion with it."""
    rt = c.rt
    hops = rt.hops
    n = len(rt.links)
    rows = expand(c)            # (its rows explicit: their entries move too)
    if len(rows) != n + 1:
        return
    en, lv = _times(c)
    hs = e2
    x = 0.0
    for k in range(j, n + 1):
        if k > j:
            if k == n:          # the destination (no overhead there: it arrives)
                if rt.dst_iv is not None or x < fab.env._now:
                    return
                row_at(rows, k, x, x)
                en[k] = lv[k] = x
                if c.hn is not None:    # (its row enters as it now arrives)
                    c.hn.pop(k, None)
                if x < c.tt - TIME_EPS:
                    _move(fab, c, x)
                return
            hs = head_at(fab, c, k, en[k], x)
            en[k] = x
            if c.hn is not None:
                c.hn.pop(k, None)
        hp = hops[k]
        if hp[4] == 1:
            td = _relink_early(fab, c, k, hs)
        elif hp[4] == 0:
            td = hs
        else:
            return
        x = td + hp[8]
        if x > lv[k] - TIME_EPS:
            return
        row_at(rows, k, en[k], x)
        lv[k] = x


def read_first(fab: Any, rt: Any, j: int, h: float, t: float, inc: list,
               f: Flow) -> tuple | None:
    """Book an HBM read's stream ``f`` on its first link (hop ``j``; its first burst ready at
    ``h``, its last at ``t``) where single flits of flows booked before it arrive after its
    first burst and before it would be done alone: flit mode's link FIFO sends each behind
    the bursts that were ready before it (llama_layer on default.yaml: a one-flit read
    arriving 1.4 ns after a 2 KiB read's first seven bursts crossed 5.6 ns later there, and
    the cube's gemms after it, 32 ns apart). Their bookings are given back and they are
    served with the read (and the flows ``inc`` still arriving there) first come, first
    served (``fair.share_with``), the read arriving as its bursts are ready
    (``fifo.burst_arrival``); each flit that now crosses later is pushed (``fair._push``).
    Returns ``(start, head, tail)`` as ``fair.fair_hop``; None (nothing changed) where no
    such flit is booked."""
    rd = f.rd
    if rd is None:
        return None
    _niv, _ov, ln, _li, _mode, hd_d, body, last_d, _p = rt.hops[j]
    busy = rt.busy[j]
    own = fab.link_own[rt.links[j]]
    e = h + body
    if e < t:
        e = t
    e += last_d
    hi = h + TIME_EPS
    late = [(o[2], s_r, o[0], o[1]) for s_r, o in own.items()
            if hi < o[2] < e and o[0] is not f and not o[0].fin]
    if not late or fab.push_depth >= PUSH_DEPTH:
        return None
    late.sort(key=_by_arrival)
    olds = [g.sl[jg] for _a, _s, g, jg in late]
    for (_a, s_r, _g, _jg), old in zip(late, olds, strict=True):
        unbook(ln, old, old[0][0])
        del own[s_r]
    extra = [[[(a, a + g.rt.busy[jg], 1.0)], g.rt.busy[jg], 0.0, 0.0] for a, _s, g, jg in late]
    extra.append([burst_arrival(rd.times(), busy, rt.nb, fab.flit_bytes, BURST_NS), busy, 0.0,
                  hd_d])
    res = share_with(fab, ln, h, inc, extra)
    fab.push_depth += 1
    for (a, _s, g, jg), old, (pcs, end, _hd) in zip(late, olds, res, strict=False):
        g.booked_flit(jg, pcs, a)
        if end > old[-1][1] + TIME_EPS:
            _push(fab, g, jg, end, h, end - g.rt.hops[jg][5])
    fab.push_depth -= 1
    pcs, end, head = res[-1]
    tl = t + last_d
    tail = end if end > tl else tl
    book(fab.link_flows, f, j, h, e, busy, pcs, tail)
    return (pcs[0][0] if pcs else h), (head if head >= 0.0 else end), tail
