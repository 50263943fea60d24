"""Fast mode's node overheads served in arrival order (``fast`` mode's fair share).

Fast mode books a transfer when it starts (``fast.FastFabric``), so a node's overhead
reservations are in start order, while flit mode's node serves heads in the order they
arrive. ``FastFabric.node_own`` notes, per node, the reservations a flow's head (``fair.Flow``)
took as it arrived: ``start -> (flow, hop, arrival)``, or the flow alone where its head arrived
at the start (most do; its hop is where the node is on its route). A head served at a node
(``serve_head``, from ``FastFabric._hop``) goes before every such reservation of a head that
arrives after it: those flows are served after it, and each moves (``_delay``): its head
leaves the node later, ``fair._push`` carries the delay along its path, and at each further
node its overhead moves (``head_at``, first come, first served again), which may push the
flows of later heads there in turn, at most ``PUSH_DEPTH`` deep (never the flow being booked:
its rows are not all there yet). A single flit to a node without an HBM commit (an IPCQ
credit) is a flow too: its tail is its head, unless it queued for the link after the node.
Reservations of transfers that cannot move (HBM writes) keep their times, and a head takes
the gaps between them (``booking.serve``: preemptive resume).

Imports ``booking`` and ``fair``; ``fast`` imports this (``fair._push`` reaches ``head_at``
through ``FastFabric.head_at``, so there is no cycle).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from kbtrace.replay.fabric.booking import serve
from kbtrace.replay.fabric.fair import Flow, _push, _times
from kbtrace.replay.intervals import TIME_EPS

__all__ = ["PUSH_DEPTH", "serve_head", "head_at", "prune_owners"]

#: a head served first pushes flows booked before it, whose heads pushed further on may push
#: others in turn, so deep (all_gather: 2.1% late with one level, 0.03% from six on)
PUSH_DEPTH = 8


def serve_head(fab: Any, n: int, iv: list, now: float, h: float, ov: float, j: int,
               f: Flow | None) -> float:
    """Serve the overhead ``ov`` of a head arriving at node ``n`` at ``h`` (``iv``: the node's
    reservations) first come, first served, as flit mode's node serves heads: reservations
    after ``h`` that belong to flows whose heads arrive later (booked earlier, as fast mode
    books in start order; ``FastFabric.node_own``) go after it, their flows delayed
    (``_delay``, at most ``PUSH_DEPTH`` deep); the others keep their times and the head takes
    the gaps between them (``booking.serve``). Returns when its overhead is done. If the head
    is flow ``f``'s (hop ``j``), its reservation may move in turn."""
    own = fab.node_own[n]
    pushed = []
    if own and iv and iv[-1] > h and fab.push_depth < PUSH_DEPTH:
        i = bisect_right(iv, h)
        hz = h
        if i & 1:                       # one under way: after it
            hz = iv[i]
            i += 1
        hz += ov
        while i < len(iv) and iv[i] < hz - TIME_EPS:
            s_r = iv[i]
            e_r = iv[i + 1]
            hz += e_r - s_r
            o = own.get(s_r)
            if o is not None:
                if type(o) is tuple:
                    g, jg, a = o
                else:                   # (a flow alone: its head arrived at s_r)
                    g, jg, a = o, -1, s_r
                if not g.fin and a > h + TIME_EPS and g is not fab._f:
                    del own[s_r]
                    if jg < 0:          # (a route passes a node once: where it is on it)
                        jg = g.rt.nodes.index(n)
                    pushed.append((g, jg, a, e_r, e_r - s_r))
                    del iv[i:i + 2]
                    continue
            i += 2
    e = _reserve(fab, n, iv, f, j, h, ov) if f is not None else serve(iv, now, h, ov)
    if pushed:
        fab.push_depth += 1
        for g, jg, a, e_r, w in pushed:
            e2 = _reserve(fab, n, iv, g, jg, a, w)
            if e2 > e_r + TIME_EPS:
                _delay(fab, g, jg, e2)
        fab.push_depth -= 1
    return e


def _reserve(fab: Any, n: int, iv: list, g: Flow, j: int, a: float, w: float) -> float:
    """Serve ``w`` ns of node ``n`` (reservations ``iv``) for flow ``g``'s head arriving at
    ``a`` (hop ``j``); a reservation in one piece is noted as the flow's (``node_own``), so
    a head arriving before ``a`` may move it. Returns when it is done."""
    e = serve(iv, fab.env.now, a, w)
    k = bisect_right(iv, e - TIME_EPS)
    if k & 1 and k < len(iv):
        s0 = iv[k - 1]
        if s0 >= e - w - TIME_EPS:
            fab.node_own[n][s0] = g if a == s0 else (g, j, a)
            if g.nres is None:
                g.nres = {}
            g.nres[j] = s0
    return e


def _delay(fab: Any, g: Flow, j: int, e2: float) -> None:
    """Flow ``g``'s head leaves node ``j`` at ``e2`` now, later than booked: its tail leaves
    hop ``j``'s link no earlier than the whole transfer after it (``_push`` carries it on)."""
    _niv, _ov, _liv, _lr, mode, hd, body, last_d, p = g.rt.hops[j]
    if mode == 1:               # a single flit, its tail its head (unless it queued for the link)
        if e2 + hd + p > _times(g)[1][j] + TIME_EPS:
            _push(fab, g, j, e2 + hd, e2, e2)
        return
    b = g.links[j] if g.links else None
    if b is None or mode != 2:
        return
    tail = e2 + body + last_d
    if tail < b.tail:
        tail = b.tail
    b.tail = tail
    _push(fab, g, j, tail, e2, e2)


def prune_owners(node_own: list, now: float) -> None:
    """Forget the movable node reservations that start by ``now`` (their heads are there)."""
    for own in node_own:
        if own:
            for s in [s for s in own if s <= now]:
                del own[s]


def head_at(fab: Any, g: Flow, j: int, old: float, ha: float) -> float:
    """Flow ``g``'s head reaches node ``j`` of its path at ``ha`` instead of ``old``: its
    overhead there moves if it was served as the head arrived (``FastFabric.node_own``; first
    come, first served: ``serve_head``), else it is taken as due; returns when the head
    leaves the node."""
    niv, ov = g.rt.hops[j][0], g.rt.hops[j][1]
    if niv is None:
        return ha + ov
    n = g.rt.nodes[j]
    own = fab.node_own[n]
    s0 = g.nres.get(j, old) if g.nres is not None else old
    o = own.get(s0)
    if o is not None and (o is g or type(o) is tuple and o[0] is g):
        del own[s0]
        i = bisect_right(niv, s0) - 1
        if i >= 0 and not i & 1 and niv[i] == s0:
            del niv[i:i + 2]
            return serve_head(fab, n, niv, fab.env.now, ha, ov, j, g)
    return ha + ov
