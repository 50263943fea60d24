"""Fast mode's fair share on one link: streams served together, first come, first served.

``share_fifo`` serves several streams that meet on a link from one moment on, as flit mode's
link FIFO serves their flits, with the bandwidth the link's step function (``booking.Steps``:
the breakpoints ``t``, the shares ``r``) has to spare, and books what each is served
(``booking.add_shares``). ``fair.fair_hop`` calls it after giving back what the streams had
booked there (``booking.unbook``). How a stream arrives: ``coarse`` keeps the arrival a link
serves a short list; an HBM read reaches its first link as its bursts are ready
(``burst_arrival``: a group ready together at once, so a flit arriving while it queues goes
behind it), and what its booking there (a mean share from its first burst to its last) had
served before a meeting is no more than had arrived (``served_as_ready``). Pure functions, no
SimPy; compiled with the rest of fast mode's core (``fifo.pxd``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from math import nextafter
from typing import TYPE_CHECKING

from kbtrace.replay.fabric.booking import RATE_EPS, add_shares, unbook
from kbtrace.replay.intervals import TIME_EPS

if TYPE_CHECKING:
    from kbtrace.replay.fabric.booking import Steps

__all__ = ["share_fifo", "burst_arrival", "served_as_ready", "coarse", "not_before",
           "ARRIVAL_PIECES"]

_INF = float("inf")
#: how long a group of flits ready together takes to arrive (``burst_arrival``): at once,
#: as far as first come, first served can tell
BURST_NS = 1e-6


def burst_arrival(ready: list, busy: float, nb: int, fb: int, lag: float = 0.0) -> list:
    """An HBM read's arrival at its first link (``busy`` ns of its ``nb`` bytes there) as
    flit mode's link FIFO receives it: burst ``i`` (``fb`` bytes, the last one the rest) put
    whole when ready (``ready[i]``), the bursts ready together at once (``BURST_NS``), so a
    flit that arrives while they queue goes behind them. ``lag``: each put that much later
    (``BURST_NS``: a read booked later, whose bursts ready at the same moment as one booked
    before go after them, as flit mode puts them). Pieces ``(start, end, share)``."""
    n = len(ready)
    order = sorted(range(n), key=ready.__getitem__)
    out: list = []
    x = -1.0
    w = 0.0
    for i in order:
        sz = fb if i < n - 1 else nb - (n - 1) * fb
        y = ready[i]
        if w > 0.0 and y > x + BURST_NS:
            out.append(_burst(x + lag, w))
            w = 0.0
        if w == 0.0:
            x = y
        w += busy * sz / nb
    if w > 0.0:
        out.append(_burst(x + lag, w))
    return out


def _burst(a: float, w: float) -> tuple:
    """Work ``w`` arriving from ``a`` within ``BURST_NS``: its share taken from the span the
    two times really are apart (``a + BURST_NS`` rounds to the ns clock's resolution at
    ``a``, 3.7e-9 ns at 20 ms: a share of ``w / BURST_NS`` there made 8 KiB reads arrive
    0.16% short, and a stream so served crossed the next link faster than its bandwidth),
    at least one step of that clock."""
    b = a + BURST_NS
    if b <= a:
        b = nextafter(a, _INF)
    return (a, b, w / (b - a))


#: a flow's arrival at a link is described by at most this many pieces (``coarse``)
ARRIVAL_PIECES = 16


def coarse(pcs: list, k: int) -> list:
    """``pcs`` (``(start, end, share)`` in order) as at most ``k`` pieces: consecutive pieces
    merged into one of the same work over their span (first start, last end and total work
    kept), about equal work each, so the arrival a link serves stays a short list however
    often the flow was re-served upstream."""
    if len(pcs) <= k:
        return pcs
    total = 0.0
    for a, b, r in pcs:
        total += r * (b - a)
    out: list[tuple[float, float, float]] = []
    acc = 0.0
    start = pcs[0][0]
    step = total / k
    goal = step
    for a, b, r in pcs:
        acc += r * (b - a)
        if acc >= goal - 1e-12 * total and len(out) < k - 1:
            done = 0.0
            for a2, b2, r2 in out:
                done += r2 * (b2 - a2)
            if b > start:
                out.append((start, b, (acc - done) / (b - start)))
            start = b
            goal += step
    done = 0.0
    for a, b, r in out:
        done += r * (b - a)
    end = pcs[-1][1]
    if end > start:
        out.append((start, end, (total - done) / (end - start)))
    return out


def not_before(arr: list, t: float) -> list:
    """Arrival pieces ``arr`` with the work that would arrive before ``t`` (the head at the
    link, after its node's overhead) arriving from ``t`` on instead, at once with the piece
    then in force (a backlog there), so none of it crosses the link before its head."""
    if not arr or arr[0][0] >= t:
        return arr
    early = 0.0
    out = []
    for a, b, r in arr:
        if b <= t:
            early += r * (b - a)
        elif a < t:
            early += r * (t - a)
            if b - t > TIME_EPS:
                out.append((t, b, r + early / (b - t)))
                early = 0.0
            else:                   # (a sliver after t: with the next piece)
                early += r * (b - t)
        else:
            if early > 0.0:         # t falls in a gap: the early work right at t
                d = a - t
                if d > early:
                    d = early
                if d > TIME_EPS:       # (else: with the piece there, not as a sliver)
                    out.append((t, t + d, early / d))
                    early = 0.0
                else:
                    b2 = b
                    out.append((a, b2, r + early / (b2 - a)))
                    early = 0.0
                    continue
            out.append((a, b, r))
    if early > 0.0:
        out.append((t, t + early, 1.0))
    return out


def served_as_ready(ln: Steps, kept: list, d: float, arr: list, h: float) -> tuple:
    """An HBM read's booking on its first link before ``h`` (pieces ``kept``, ``d`` of work)
    served no more than its bursts ready by then (``arr``, ``burst_arrival``): booked at a
    mean share from its first burst to its last, it runs ahead of bursts that are ready late.
    Its shares there are scaled down (given back and booked again) to what had arrived.
    Returns ``(kept, d)`` as they now are."""
    got = _cum_at(arr, [h])[0]
    if d <= got + 1e-9 or not kept:
        return kept, d
    unbook(ln, kept, kept[0][0])
    k = got / d
    out = []
    for a, b, r in kept:
        if b > a:
            out.append((a, b, r * k))
            add_shares(ln, a, b, (r * k,))
    return out, got


def _when(arr: list, w: float, x: float) -> float:
    """When ``x`` of the work of arrival pieces ``arr`` has arrived."""
    got = 0.0
    for a, b, r in arr:
        y = got + r * (b - a)
        if y >= x and r > 0.0:
            return a + (x - got) / r
        got = y
    return arr[-1][1] if arr else 0.0


def _unserved(arr: list, w: float, d: float) -> list:
    """The pieces of arrival ``arr`` (``w`` in all) after its first ``d`` of work."""
    out = []
    got = 0.0
    for a, b, r in arr:
        x = r * (b - a)
        if got + x <= d:
            got += x
            continue
        if got < d and r > 0.0:
            a = a + (d - got) / r
        got += x
        if got > w:                     # (rounding: never more than w)
            b = b - (got - w) / r if r > 0.0 else b
            if b > a:
                out.append((a, b, r))
            break
        if b > a:
            out.append((a, b, r))
    return out


def _cum_at(pcs: list, taus: list) -> list:
    """The work of pieces ``pcs`` (in order) arrived by each of the sorted times ``taus``."""
    out = []
    k = 0
    n = len(pcs)
    acc = 0.0
    for x in taus:
        while k < n:
            a, b, r = pcs[k]
            if b > x:
                break
            acc += r * (b - a)
            k += 1
        if k < n:
            a, b, r = pcs[k]
            if a < x:
                out.append(acc + r * (x - a))
                continue
        out.append(acc)
    return out


def share_fifo(ln: Steps, t0: float, streams: list) -> list:
    """Serve several streams on one link together from ``t0``, first come, first served, as
    flit mode's link FIFO serves flits: each stream is ``[arrival, work, done, head_work]``,
    its work arriving as the pieces ``arrival`` (``(start, end, share)``, in order), ``done``
    of it served before ``t0``. The link serves what has arrived in arrival order at the
    bandwidth it has to spare (``1 - booked``): a stream's backlog leaves before what others
    sent later, and streams arriving together share in proportion to their arrival rates.
    Books the pieces; returns per stream ``(pieces, end, head)``: its booked ``(start, end,
    share)`` pieces, when all its work has been served, and when ``head_work`` of it had
    (-1.0 if ``head_work`` is 0)."""
    m = len(streams)
    ups = []
    for st in streams:
        ups.append(_unserved(st[0], st[1], st[2]))
    pts = {t0}
    for up in ups:
        for a, b, _r in up:
            pts.add(a)
            pts.add(b)
    taus = sorted(pts)
    nt = len(taus)
    # U(tau): the unserved work of all streams arrived by tau, at the breakpoints
    us = [0.0] * nt
    cis = []                    # each stream's own at the breakpoints
    for up in ups:
        cum = _cum_at(up, taus)
        for k in range(nt):
            us[k] += cum[k]
        cis.append(cum)
    total = us[-1]
    tiny = 1e-12 * (total if total > 1.0 else 1.0)
    # S(t): work served from t0 on, at the spare bandwidth, no faster than it arrives; of a
    # run of steps serving nothing (the link full), only its first and last moments are kept
    # (S is flat between them: the other moments would change no result)
    ts = [t0]
    ss = [0.0]
    cs = [0.0]                  # the link's spare over [ts[i - 1], ts[i]] (0: serving nothing)
    flat = -1.0                 # the last moment of a run serving nothing, not kept yet
    n = ln.n
    k = ln.bisect_right(t0) - 1
    t = t0
    s = 0.0
    guard = 0
    j = 0                       # bisect_right(taus, t), moved on as t grows
    while s < total - tiny:
        guard += 1
        if guard > 1000000:
            raise RuntimeError("share_fifo: no progress")
        while k + 1 < n and ln.t[k + 1] <= t:
            k += 1
        c = 1.0 - (ln.r[k] if k >= 0 else 0.0)
        if c <= RATE_EPS:
            c = 0.0
        nxt = ln.t[k + 1] if k + 1 < n else _INF
        while j < nt:
            x = taus[j]
            if x > t:
                break
            j += 1
        if j < nt and taus[j] < nxt:
            nxt = taus[j]
        if j == 0 or j >= nt:   # U(t) (as ``_big_u``) and its slope rr
            rr = 0.0
            u = 0.0 if j == 0 else total
        else:
            u0 = us[j - 1]
            u1 = us[j]
            ta = taus[j - 1]
            tb = taus[j]
            rr = (u1 - u0) / (tb - ta)
            u = u0 + (u1 - u0) * (t - ta) / (tb - ta)
        q = u - s
        if c == 0.0:
            rate = 0.0
        elif q > tiny:
            rate = c
            if rr < c and t + q / (c - rr) < nxt:
                nxt = t + q / (c - rr)        # the backlog clears
            if t + (total - s) / c < nxt:
                nxt = t + (total - s) / c
        else:
            rate = rr if rr < c else c
        if nxt == _INF:
            raise RuntimeError("share_fifo: a stream can never be served")
        if nxt <= t:                # below the clock's resolution at t: the next tick
            nxt = nextafter(t, _INF)
        if rate == 0.0:
            t = nxt
            flat = t
            continue
        if flat >= 0.0:
            ts.append(flat)
            ss.append(s)
            cs.append(0.0)
            flat = -1.0
        s += rate * (nxt - t)
        if s > total:
            s = total
        t = nxt
        ts.append(t)
        ss.append(s)
        cs.append(c)
    if flat >= 0.0:
        ts.append(flat)
        ss.append(s)
        cs.append(0.0)
    # pieces are linear between the moments the served work passes a breakpoint of U
    gs = set(ts)
    for x in us:
        if 0.0 < x < total:
            gs.add(_t_of(ts, ss, tiny, x))
    grid = sorted(gs)
    cums = _served_by(grid, ts, ss, us, cis)
    allp = _pieces(grid, cums, ts, cs, tiny)
    out = []
    for i in range(m):
        arr, w, d, hw = streams[i]
        up = ups[i]
        pcs = allp[i]
        if up:
            end = _t_of(ts, ss, tiny, _big_u(taus, us, total, up[-1][1]))
            head = (_t_of(ts, ss, tiny, _big_u(taus, us, total, _when(arr, w, d + hw)))
                    if hw > 0.0 else -1.0)
        else:
            end, head = t0, -1.0
        out.append((pcs, end, head))
    for pcs, _e, _h in out:
        for a, b, r in pcs:
            if b > a:
                add_shares(ln, a, b, (r,))
    return out


def _served_by(grid: list, ts: list, ss: list, us: list, cis: list) -> list:
    """Each stream's work served by each moment of ``grid`` (per stream, a list beside it):
    the work served then, S (``ts`` / ``ss``), is the unserved work arrived by some tau, a
    fraction of the way between two breakpoints of U (``us``), and each stream has been
    served its own arrival (``cis``, at the same breakpoints) by the same fraction there.
    Not read off at a tau rounded to the ns clock: next to bursts ``BURST_NS`` wide, a tau an
    ulp off moved ~1e-6 ns of work at 1 us of simulated time and ~1 ns at 1 s, and the
    pieces booked shares far over 1 (7,447 at 13 ms in bench_e2e's 1.0 M-op gemm)."""
    m = len(cis)
    nt = len(us)
    ng = len(grid)
    cums = [[0.0] * ng for _ in range(m)]
    for g in range(ng):
        x = _s_at(ts, ss, grid[g])
        k = bisect_left(us, x)
        if k == 0 or k >= nt:
            for i in range(m):
                cums[i][g] = cis[i][0 if k == 0 else nt - 1]
            continue
        u0 = us[k - 1]
        f = (x - u0) / (us[k] - u0)
        for i in range(m):
            cum = cis[i]
            u0 = cum[k - 1]
            cums[i][g] = u0 + (cum[k] - u0) * f
    return cums


def _pieces(grid: list, cums: list, ts: list, cs: list, tiny: float) -> list:
    """Each stream's booked pieces ``(start, end, share)``: its work served between two
    moments of ``grid`` (``cums``) over their span. Where the streams' pieces together would
    take more than the link spares there (``cs``, over the moments of S ``ts``: a sliver of
    grid an ulp or so wide, the work a difference of rounded sums), each is cut to its part
    of what the link spares and the rest is owed, served in its next piece (what is still
    owed when a stream has no more, no more than ``tiny``, is left, as a piece of no more
    than ``tiny`` is)."""
    m = len(cums)
    ng = len(grid)
    allp: list = [[] for _ in range(m)]
    owed = [0.0] * m
    xs = [0.0] * m
    p = 0
    for g in range(1, ng):
        ta = grid[g - 1]
        tb = grid[g]
        dt = tb - ta
        while ts[p] < tb:       # the moment of S that ends the step holding [ta, tb]
            p += 1
        tot = 0.0
        for i in range(m):
            cum = cums[i]
            x = cum[g] - cum[g - 1] + owed[i]
            if x > tiny and dt > 0.0:
                xs[i] = x
                tot += x
            else:
                xs[i] = 0.0
            owed[i] = 0.0
        if tot == 0.0:
            continue
        cap = cs[p] * dt
        if tot > cap + 1e-13 * dt:
            f = cap / tot
            for i in range(m):
                x = xs[i]
                xs[i] = x * f
                owed[i] = x - xs[i]
        for i in range(m):
            dw = xs[i]
            if dw > 0.0:
                r = dw / dt
                pcs = allp[i]
                # one piece on either side of a sliver of grid (two breakpoints an ulp or so
                # apart): whether a piece is split there must not depend on rounding, as
                # ``not_before`` spreads work over a flow's first arrival piece
                if pcs and ta - pcs[-1][1] <= TIME_EPS and abs(pcs[-1][2] - r) <= 1e-12:
                    pcs[-1] = (pcs[-1][0], tb, pcs[-1][2])
                else:
                    pcs.append((ta, tb, r))
    return allp


def _big_u(taus: list[float], us: list[float], total: float, tau: float) -> float:
    """``share_fifo``'s U(tau): the unserved work arrived by ``tau`` (``us`` at ``taus``)."""
    k = bisect_right(taus, tau) - 1
    if k < 0:
        return 0.0
    if k + 1 >= len(taus):
        return total
    return us[k] + (us[k + 1] - us[k]) * (tau - taus[k]) / (taus[k + 1] - taus[k])


def _t_of(ts: list[float], ss: list[float], tiny: float, u: float) -> float:
    """When the work at position ``u`` was served (S(t) as ``ts`` / ``ss``)."""
    i = bisect_left(ss, u - tiny)
    if i == 0:
        return ts[0]
    if i >= len(ss):
        return ts[-1]
    s0 = ss[i - 1]
    s1 = ss[i]
    if s1 <= s0:
        return ts[i]
    x = ts[i - 1] + (ts[i] - ts[i - 1]) * (u - s0) / (s1 - s0)
    return x if x < ts[i] else ts[i]


def _s_at(ts: list[float], ss: list[float], t: float) -> float:
    i = bisect_right(ts, t) - 1
    if i < 0:
        return 0.0
    if i + 1 >= len(ts):
        return ss[-1]
    return ss[i] + (ss[i + 1] - ss[i]) * (t - ts[i]) / (ts[i + 1] - ts[i])
