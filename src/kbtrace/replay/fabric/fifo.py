# cython: boundscheck=False
# (compiled: the indices below are in range by construction; the pure-Python run, whose
# lists and arrays check every index, is the test of that: tests/test_replay_core.py)
"""Fast mode's fair share on one link: streams served together, first come, first served.

``share_fifo`` serves several streams that meet on a link from one moment on, as flit mode's
link FIFO serves their flits, with the bandwidth the link's step function (``booking.Steps``:
the breakpoints ``t``, the shares ``v``) has to spare, and books what each is served
(``booking.add_shares``). ``fair.fair_hop`` calls it after giving back what the streams had
booked there (``booking.unbook``). How a stream arrives: ``coarse`` keeps the arrival a link
serves a short list; an HBM read reaches its first link as its bursts are ready
(``burst_arrival``: a group ready together at once, so a flit arriving while it queues goes
behind it), and what its booking there (a mean share from its first burst to its last) had
served before a meeting is no more than had arrived (``served_as_ready``). No SimPy; compiled
with fast mode's core (``fifo.pxd``); ``share_fifo`` works on reused C arrays (``_Work``).
"""

from __future__ import annotations

from array import array
from math import nextafter
from typing import TYPE_CHECKING, Any

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
    got = _arrived(arr, h)
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


def _arrived(pcs: list, x: float) -> float:
    """The work of pieces ``pcs`` (in order) arrived by ``x`` (``_when`` the other way)."""
    acc = 0.0
    for a, b, r in pcs:
        if b > x:
            return acc + r * (x - a) if a < x else acc
        acc += r * (b - a)
    return acc


class _Work:
    """``share_fifo``'s scratch, reused by every call (``_WORK``): growable arrays of doubles
    (C arrays where compiled, typed views), so a call boxes no float but those it returns.
    ``ua``, ``ub``, ``ur``: the streams' unserved pieces (stream ``i``'s from ``uo[i]``);
    ``taus``, ``us``: U's breakpoints and values, ``cis`` each stream's own (``nt`` per
    stream); ``ts``, ``ss``, ``cs``: S's moments, values and the spare before each; ``grid``,
    ``cums`` each stream's work served by then (``ng`` per stream); ``xs``, ``owed``."""
    __slots__ = ("ua", "ub", "ur", "uo", "taus", "us", "cis", "ts", "ss", "cs", "grid",
                 "cums", "xs", "owed")

    def __init__(self) -> None:
        self.ua, self.ub, self.ur, self.uo = _room(None), _room(None), _room(None), _room(None)
        self.taus, self.us, self.cis, self.ts = _room(None), _room(None), _room(None), _room(None)
        self.ss, self.cs, self.grid, self.cums = _room(None), _room(None), _room(None), _room(None)
        self.xs, self.owed = _room(None), _room(None)


_CAP0 = 64


def _room(a: Any, n: int = 0, need: int = 0) -> Any:
    """``a`` (an array of doubles; None: none yet) if it holds ``need``, else a copy of its
    first ``n`` in one that does (twice as long at least)."""
    cap = _CAP0 if a is None else len(a)
    if a is not None and need <= cap:
        return a
    while cap < need:
        cap *= 2
    new = array("d", bytes(8 * cap))
    for i in range(n):
        new[i] = a[i]
    return new


def _sort_unique(v: Any, n: int) -> int:
    """Sort ``v[:n]`` in place and drop repeats (``sorted(set(...))``); how many are left."""
    for i in range(1, n):
        x = v[i]
        k = i - 1
        while k >= 0 and v[k] > x:
            v[k + 1] = v[k]
            k -= 1
        v[k + 1] = x
    w = 0
    for i in range(n):
        if w == 0 or v[i] != v[w - 1]:
            v[w] = v[i]
            w += 1
    return w


def _bisect(v: Any, n: int, x: float, right: bool) -> int:
    """``bisect.bisect_right(v[:n], x)`` if ``right``, else ``bisect.bisect_left``."""
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) // 2
        if (x < v[mid]) if right else not (v[mid] < x):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _unserved(wk: _Work, streams: list) -> int:
    """Each stream's pieces after its first ``done`` of work (of ``work`` in all) into
    ``wk.ua`` / ``ub`` / ``ur``, stream ``i``'s from ``wk.uo[i]``; how many in all."""
    m = len(streams)
    npc = 0
    for st in streams:
        npc += len(st[0])
    wk.ua = _room(wk.ua, 0, npc)
    wk.ub = _room(wk.ub, 0, npc)
    wk.ur = _room(wk.ur, 0, npc)
    wk.uo = _room(wk.uo, 0, m + 1)
    n = 0
    for i in range(m):
        st = streams[i]
        w = st[1]
        d = st[2]
        wk.uo[i] = n
        got = 0.0
        for a, b, r in st[0]:
            x = r * (b - a)
            if got + x <= d:
                got += x
                continue
            if got < d and r > 0.0:
                a = a + (d - got) / r
            got += x
            if got > w and r > 0.0:         # (rounding: never more than w)
                b = b - (got - w) / r
            if b > a:
                wk.ua[n] = a
                wk.ub[n] = b
                wk.ur[n] = r
                n += 1
            if got > w:
                break
    wk.uo[m] = n
    return n


def _cum_into(wk: _Work, p0: int, p1: int, nt: int, q: int) -> None:
    """``_arrived`` of the unserved pieces ``p0`` to ``p1`` at each of ``wk.taus[:nt]`` (in
    one pass), into ``wk.cis[q:q + nt]``."""
    k = p0
    acc = 0.0
    for g in range(nt):
        x = wk.taus[g]
        while k < p1:
            if wk.ub[k] > x:
                break
            acc += wk.ur[k] * (wk.ub[k] - wk.ua[k])
            k += 1
        if k < p1 and wk.ua[k] < x:
            wk.cis[q + g] = acc + wk.ur[k] * (x - wk.ua[k])
            continue
        wk.cis[q + g] = acc


def share_fifo(ln: Steps, t0: float, streams: list) -> list:
    """Serve several streams on one link together from ``t0``, first come, first served, as
    flit mode's link FIFO serves flits: each stream is ``[arrival, work, done, head_work]``,
    its work arriving as the pieces ``arrival`` (``(start, end, share)``, in order), ``done``
    of it served before ``t0``. The link serves what has arrived in arrival order at the
    bandwidth it has to spare (``1 - booked``): a stream's backlog leaves before what others
    sent later, and streams arriving together share in proportion to their arrival rates.
    Books the pieces; returns per stream ``(pieces, end, head)``: its booked ``(start, end,
    share)`` pieces, when all its work has been served, and when ``head_work`` of it had
    (-1.0 if ``head_work`` is 0). Works on ``_WORK``'s arrays."""
    wk = _WORK
    m = len(streams)
    nu = _unserved(wk, streams)
    wk.taus = _room(wk.taus, 0, 1 + 2 * nu)
    wk.taus[0] = t0
    for i in range(nu):
        wk.taus[1 + 2 * i] = wk.ua[i]
        wk.taus[2 + 2 * i] = wk.ub[i]
    nt = _sort_unique(wk.taus, 1 + 2 * nu)
    # U(tau): the unserved work of all streams arrived by tau, at the breakpoints (``us``),
    # and each stream's own (``cis``)
    wk.us = _room(wk.us, 0, nt)
    wk.cis = _room(wk.cis, 0, m * nt)
    for k in range(nt):
        wk.us[k] = 0.0
    for i in range(m):
        _cum_into(wk, int(wk.uo[i]), int(wk.uo[i + 1]), nt, i * nt)
        for k in range(nt):
            wk.us[k] += wk.cis[i * nt + k]
    total = wk.us[nt - 1]
    tiny = 1e-12 * (total if total > 1.0 else 1.0)
    # S(t): work served from t0 on, at the spare bandwidth, no faster than it arrives; of a
    # run of steps serving nothing (the link full), only its first and last moments are kept
    # (S is flat between them: the other moments would change no result)
    wk.ts[0] = t0
    wk.ss[0] = 0.0
    wk.cs[0] = 0.0              # the link's spare over [ts[i - 1], ts[i]] (0: serving nothing)
    nts = 1
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
        c = 1.0 - (ln.v[k] if k >= 0 else 0.0)
        if c <= RATE_EPS:
            c = 0.0
        nxt = ln.t[k + 1] if k + 1 < n else _INF
        while j < nt:
            x = wk.taus[j]
            if x > t:
                break
            j += 1
        if j < nt and wk.taus[j] < nxt:
            nxt = wk.taus[j]
        if j == 0 or j >= nt:   # U(t) (as ``_big_u``) and its slope rr
            rr = 0.0
            u = 0.0 if j == 0 else total
        else:
            u0 = wk.us[j - 1]
            u1 = wk.us[j]
            ta = wk.taus[j - 1]
            tb = wk.taus[j]
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
        if nts + 3 > len(wk.ts):   # (room for these two and a last flat moment)
            _more_s(wk, nts)
        if flat >= 0.0:
            wk.ts[nts] = flat
            wk.ss[nts] = s
            wk.cs[nts] = 0.0
            nts += 1
            flat = -1.0
        s += rate * (nxt - t)
        if s > total:
            s = total
        t = nxt
        wk.ts[nts] = t
        wk.ss[nts] = s
        wk.cs[nts] = c
        nts += 1
    if flat >= 0.0:
        wk.ts[nts] = flat
        wk.ss[nts] = s
        wk.cs[nts] = 0.0
        nts += 1
    # pieces are linear between the moments the served work passes a breakpoint of U
    wk.grid = _room(wk.grid, 0, nts + nt)
    for i in range(nts):
        wk.grid[i] = wk.ts[i]
    ng = nts
    for k in range(nt):
        x = wk.us[k]
        if 0.0 < x < total:
            wk.grid[ng] = _t_of(wk, nts, tiny, x)
            ng += 1
    ng = _sort_unique(wk.grid, ng)
    _served_by(wk, ng, nts, nt, m)
    allp = _pieces(wk, ng, m, tiny)
    out = []
    for i in range(m):
        arr, w, d, hw = streams[i]
        pcs = allp[i]
        p1 = int(wk.uo[i + 1])
        if p1 > int(wk.uo[i]):
            end = _t_of(wk, nts, tiny, _big_u(wk, nt, total, wk.ub[p1 - 1]))
            head = (_t_of(wk, nts, tiny, _big_u(wk, nt, total, _when(arr, w, d + hw)))
                    if hw > 0.0 else -1.0)
        else:
            end, head = t0, -1.0
        out.append((pcs, end, head))
    for pcs, _e, _h in out:
        for a, b, r in pcs:
            if b > a:
                add_shares(ln, a, b, (r,))
    return out


def _more_s(wk: _Work, n: int) -> None:
    """Room for more moments of S (``wk.ts``, ``ss``, ``cs``; ``n`` so far)."""
    need = 2 * len(wk.ts)
    wk.ts = _room(wk.ts, n, need)
    wk.ss = _room(wk.ss, n, need)
    wk.cs = _room(wk.cs, n, need)


def _served_by(wk: _Work, ng: int, nts: int, nt: int, m: int) -> None:
    """Each stream's work served by each moment of ``wk.grid`` (into ``wk.cums``, ``ng`` per
    stream): the work served then, S (``ts`` / ``ss``), is the unserved work arrived by some
    tau, a fraction of the way between two breakpoints of U (``us``), and each stream has
    been served its own arrival (``cis``, at the same breakpoints) by the same fraction
    there. Not read off at a tau rounded to the ns clock: next to bursts ``BURST_NS`` wide, a
    tau an ulp off moved ~1e-6 ns of work at 1 us of simulated time and ~1 ns at 1 s, and the
    pieces booked shares far over 1 (7,447 at 13 ms in bench_e2e's 1.0 M-op gemm)."""
    wk.cums = _room(wk.cums, 0, m * ng)
    for g in range(ng):
        x = _s_at(wk, nts, wk.grid[g])
        k = _bisect(wk.us, nt, x, False)
        if k == 0 or k >= nt:
            kk = 0 if k == 0 else nt - 1
            for i in range(m):
                wk.cums[i * ng + g] = wk.cis[i * nt + kk]
            continue
        u0 = wk.us[k - 1]
        f = (x - u0) / (wk.us[k] - u0)
        for i in range(m):
            u0 = wk.cis[i * nt + k - 1]
            wk.cums[i * ng + g] = u0 + (wk.cis[i * nt + k] - u0) * f


def _pieces(wk: _Work, ng: int, m: int, tiny: float) -> list:
    """Each stream's booked pieces ``(start, end, share)``: its work served between two
    moments of ``wk.grid`` (``wk.cums``) over their span. Where the streams' pieces together
    would take more than the link spares there (``wk.cs``, over the moments of S ``wk.ts``: a
    sliver of grid an ulp or so wide, the work a difference of rounded sums), each is cut to
    its part of what the link spares and the rest is owed, served in its next piece (what is
    still owed when a stream has no more, no more than ``tiny``, is left, as a piece of no
    more than ``tiny`` is)."""
    allp: list = [[] for _ in range(m)]
    wk.owed = _room(wk.owed, 0, m)
    wk.xs = _room(wk.xs, 0, m)
    for i in range(m):
        wk.owed[i] = 0.0
    p = 0
    for g in range(1, ng):
        ta = wk.grid[g - 1]
        tb = wk.grid[g]
        dt = tb - ta
        while wk.ts[p] < tb:    # the moment of S that ends the step holding [ta, tb]
            p += 1
        tot = 0.0
        for i in range(m):
            x = wk.cums[i * ng + g] - wk.cums[i * ng + g - 1] + wk.owed[i]
            if x > tiny and dt > 0.0:
                wk.xs[i] = x
                tot += x
            else:
                wk.xs[i] = 0.0
            wk.owed[i] = 0.0
        if tot == 0.0:
            continue
        cap = wk.cs[p] * dt
        if tot > cap + 1e-13 * dt:
            f = cap / tot
            for i in range(m):
                x = wk.xs[i]
                wk.xs[i] = x * f
                wk.owed[i] = x - wk.xs[i]
        for i in range(m):
            dw = wk.xs[i]
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


def _big_u(wk: _Work, nt: int, total: float, tau: float) -> float:
    """``share_fifo``'s U(tau): the unserved work arrived by ``tau`` (``wk.us`` at
    ``wk.taus``)."""
    k = _bisect(wk.taus, nt, tau, True) - 1
    if k < 0:
        return 0.0
    if k + 1 >= nt:
        return total
    return wk.us[k] + (wk.us[k + 1] - wk.us[k]) * (tau - wk.taus[k]) / (wk.taus[k + 1]
                                                                       - wk.taus[k])


def _t_of(wk: _Work, nts: int, tiny: float, u: float) -> float:
    """When the work at position ``u`` was served (S(t) as ``wk.ts`` / ``wk.ss``)."""
    i = _bisect(wk.ss, nts, u - tiny, False)
    if i == 0:
        return wk.ts[0]
    if i >= nts:
        return wk.ts[nts - 1]
    s0 = wk.ss[i - 1]
    s1 = wk.ss[i]
    if s1 <= s0:
        return wk.ts[i]
    x = wk.ts[i - 1] + (wk.ts[i] - wk.ts[i - 1]) * (u - s0) / (s1 - s0)
    return x if x < wk.ts[i] else wk.ts[i]


def _s_at(wk: _Work, nts: int, t: float) -> float:
    i = _bisect(wk.ts, nts, t, True) - 1
    if i < 0:
        return 0.0
    if i + 1 >= nts:
        return wk.ss[nts - 1]
    return wk.ss[i] + (wk.ss[i + 1] - wk.ss[i]) * (t - wk.ts[i]) / (wk.ts[i + 1] - wk.ts[i])


_WORK = _Work()
