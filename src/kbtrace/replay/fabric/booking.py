"""Fast mode's reservation arithmetic: pure functions on plain lists, no SimPy.

A node's per-transaction overhead is an exclusive resource: its future busy intervals
are a flat sorted list ``[s0, e0, s1, e1, ...]`` (``serve``, ``take``, ``unreserve``).
A link's booked bandwidth is a step function: breakpoints ``lt`` and the share booked
from each on ``lr`` (``take_rate``, ``fit_rate``, ``add_shares``, ``prune_rate``); streams
that meet on a link give back what they booked (``unbook``) and are served together, first
come, first served (``fifo.share_fifo``; ``fair``). ``FastFabric`` owns the lists; these
functions only read and update them.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

from kbtrace.replay.intervals import TIME_EPS
from kbtrace.replay.intervals import prune as _prune

__all__ = ["RATE_EPS", "serve", "take", "unreserve", "take_rate", "add_shares",
           "fit_rate", "prune_rate", "unbook"]

_INF = float("inf")


def serve(iv: list[float], now: float, h: float, work: float) -> float:
    """Serve ``work`` ns on an exclusive resource (a node's overhead) from ``h`` on, in the
    gaps between its reservations, each as far as it goes (preemptive resume: what is
    booked keeps its times; a gap shorter than ``work`` is used, not skipped); reserve the
    pieces; return when the work is done."""
    if not iv or iv[-1] <= h:
        iv.append(h)
        iv.append(h + work)
        return h + work
    if iv[1] <= now:
        _prune(iv, now)
    i = bisect_right(iv, h)
    t = h
    if i & 1:             # inside a reservation: from its end
        t = iv[i]
        i += 1
    eps = TIME_EPS          # (compiled: a C double in the loop)
    while True:
        if i == len(iv):
            iv.append(t)
            iv.append(t + work)
            return t + work
        nxt = iv[i]
        if nxt - t >= work - eps:
            e = t + work
            iv[i:i] = (t, e if e < nxt else nxt)
            return e
        if nxt - t > eps:           # (a sliver left by rounding serves nothing)
            iv[i:i] = (t, nxt)
            work -= nxt - t
            i += 2
        t = iv[i + 1]
        i += 2


def take(iv: list[float], s: float, e: float) -> bool:
    """Reserve ``[s, e]`` in ``iv`` if it is free (after the last reservation, or a gap that
    holds it whole); False (nothing reserved) if not: ``FastFabric.send``'s test, inline
    there."""
    if not iv or iv[-1] <= s:
        iv.append(s)
        iv.append(e)
        return True
    i = bisect_right(iv, s)
    if i & 1 or e > iv[i] + TIME_EPS:
        return False
    iv[i:i] = (s, e if e < iv[i] else iv[i])
    return True


def unreserve(iv: list[float], s: float) -> None:
    """Remove the reservation starting at ``s`` (reservations have positive length)."""
    i = bisect_left(iv, s)
    if i & 1:             # an interval ending exactly at s precedes it
        i += 1
    del iv[i:i + 2]


RATE_EPS = 1e-9   # bandwidth shares summing to 1 + RATE_EPS still fit (rounding of busy / span)


def take_rate(lt: list[float], lr: list[float], s: float, e: float, busy: float) -> bool:
    """Reserve a link's bandwidth share ``busy / (e - s)`` over ``[s, e)`` if every moment of
    it has that much to spare; False (nothing reserved) if not.

    A link's reservations are a step function: ``lr[i]`` is the share of the bandwidth
    booked from breakpoint ``lt[i]`` to ``lt[i + 1]`` (non-decreasing; the last share is
    0). A transfer whose flits arrive slower than the link serves them (fed by a slower link
    upstream) books only that share, so transfers that together fit the bandwidth overlap,
    as their flits interleave in flit mode; a transfer the link itself limits books all of
    it.
    """
    r = busy / (e - s)
    if r > 1.0:
        r = 1.0
    n = len(lt)
    if not n or lt[-1] <= s:            # free from s on
        lt.append(s)
        lr.append(r)
        lt.append(e)
        lr.append(0.0)
        return True
    lim = 1.0 + RATE_EPS - r
    # a breakpoint within TIME_EPS of s or e counts as at it (intervals.TIME_EPS)
    k = bisect_right(lt, s + TIME_EPS) - 1
    if k >= 0 and lt[k] >= s - TIME_EPS:
        s = lt[k]
    j = bisect_left(lt, e - TIME_EPS)
    if j < n and lt[j] <= e + TIME_EPS:
        e = lt[j]
    if k < 0:                           # before the first breakpoint (share 0 there)
        k = 0
    elif j == k + 1:                    # inside one segment (the common case)
        x = lr[k]
        if x > lim:
            return False
        if lt[k] == s:
            lr[k] = x + r
            if j == n or lt[j] != e:
                lt.insert(j, e)
                lr.insert(j, x)
        elif j < n and lt[j] == e:
            lt.insert(j, s)
            lr.insert(j, x + r)
        else:
            lt[j:j] = (s, e)
            lr[j:j] = (x + r, x)
        return True
    for q in range(k, j):
        x = lr[q]           # (compiled: unboxed, compared as a C double)
        if x > lim:
            return False
    add_shares(lt, lr, s, e, (r,))
    return True


def add_shares(lt: list[float], lr: list[float], s: float, e: float,
                shares: Any) -> None:
    """Add ``shares`` over ``[s, e)``: one per segment of the step function there, in order
    (a breakpoint is inserted at ``s`` and ``e`` unless one is there; a single value is
    added to every segment)."""
    j = bisect_left(lt, e)
    if j == len(lt) or lt[j] != e:
        lt.insert(j, e)
        lr.insert(j, lr[j - 1] if j else 0.0)
    i = bisect_right(lt, s) - 1
    if i < 0 or lt[i] != s:
        i += 1
        lt.insert(i, s)
        lr.insert(i, lr[i - 1] if i else 0.0)
        j += 1
    if len(shares) == 1:
        r = shares[0]
        for k in range(i, j):
            lr[k] += r
    else:
        for k, r in zip(range(i, j), shares, strict=True):
            lr[k] += r


def fit_rate(lt: list[float], lr: list[float], now: float, h: float, hd: float, body: float,
             tail_at: float, last: float, busy: float,
             out: list | None = None) -> tuple[float, float, float]:
    """Book a link for a stream whose head reaches it at ``h`` and whose last flit is ready at
    ``tail_at``: returns when its service starts and when its head and its tail have
    crossed (``(start, head, tail)``).

    Free (``take_rate`` at ``h``): head ``h + hd``, tail ``max(tail_at, h + body) + last``,
    at the share ``rho = busy / (tail - h)`` its input allows. Otherwise the stream is a
    queue at the link: its work arrives at the rate ``rho`` from ``h`` on, and the link
    serves it with what it has to spare (``1 - booked``, the others keeping their times),
    at most as fast as it arrives while nothing waits, and as fast as the spare bandwidth
    allows while some of it waits (a stream held back catches up afterwards, as its queued
    flits do in flit mode). It books what it is served, piece by piece; its head has crossed
    when ``hd * rho`` of work is done, its tail when all of it (``busy``) is and no earlier
    than ``tail_at + last``; it starts at its first moment with bandwidth (its queueing).
    ``out``: the pieces booked, ``(start, end, share)``, are appended to it (``fair``).
    """
    e = h + body
    if e < tail_at:
        e = tail_at
    e += last
    if take_rate(lt, lr, h, e, busy):
        if out is not None:
            r = busy / (e - h)
            out.append((h, e, r if r < 1.0 else 1.0))
        return h, h + hd, e
    if len(lt) > 1 and lt[1] <= now:
        prune_rate(lt, lr, now)
    rho = busy / (e - h)
    if rho > 1.0:
        rho = 1.0
    e_in = h + busy / rho               # all of its work has arrived
    tiny = 1e-12 * (busy if busy > 1.0 else 1.0)
    n = len(lt)
    k = bisect_right(lt, h) - 1
    t0 = h
    done = 0.0
    head_work = hd * rho
    head = start = -1.0
    end = h
    pieces: list[tuple[float, float, float]] = []
    finished = False
    rate_eps, time_eps, inf = RATE_EPS, TIME_EPS, _INF  # (compiled: C doubles in the loop)
    while not finished:
        c = 1.0
        if k >= 0:
            booked = lr[k]      # (compiled: unboxed once, no float made per segment)
            c = 1.0 - booked
        if c <= rate_eps:
            c = 0.0
        t1 = lt[k + 1] if k + 1 < n else inf
        while c > 0.0 and t0 < t1:
            arrived = busy if t0 >= e_in else rho * (t0 - h)
            backlog = arrived - done
            if backlog > tiny:          # some of it waits: as fast as the link spares
                rate = c
                t_next = t1
                if t0 < e_in:
                    if e_in < t_next:
                        t_next = e_in
                    if c > rho:
                        clear = t0 + backlog / (c - rho)
                        if clear < t_next:
                            t_next = clear
                elif t0 + backlog / c < t_next:
                    t_next = t0 + backlog / c
                if t_next <= t0:        # what waits is below the clock's resolution at t0:
                    done = arrived      # served (else the loop makes no progress, forever)
                    continue
            else:                       # nothing waits: as fast as it arrives, if it can
                rate = rho if rho < c else c
                t_next = e_in if e_in < t1 else t1
                if t_next <= t0:        # (all of it arrived and served)
                    t_next = t0 + (busy - done) / rate if busy > done else t0
            got = done + rate * (t_next - t0)
            if start < 0.0 and t_next - t0 > time_eps:
                start = t0
            if head < 0.0 and got >= head_work:
                head = t0 + (head_work - done) / rate
            if got >= busy - tiny:
                end = t0 + (busy - done) / rate
                pieces.append((t0, end, rate))
                finished = True
                break
            pieces.append((t0, t_next, rate))
            done = got
            t0 = t_next
        if finished:
            break
        if t1 > t0:
            t0 = t1
        k += 1
    a0 = b0 = r0 = -1.0
    for a, b, r in pieces:              # book them, touching pieces of one rate merged
        if a == b0 and r == r0:
            b0 = b
            continue
        if b0 > a0 and r0 > 0.0:
            add_shares(lt, lr, a0, b0, (r0,))
            if out is not None:
                out.append((a0, b0, r0))
        a0, b0, r0 = a, b, r
    if b0 > a0 and r0 > 0.0:
        add_shares(lt, lr, a0, b0, (r0,))
        if out is not None:
            out.append((a0, b0, r0))
    if head < 0.0:
        head = end
    tail = tail_at + last
    return (start if start >= 0.0 else h), head, (end if end > tail else tail)


def prune_rate(lt: list[float], lr: list[float], now: float) -> None:
    """Drop a link's breakpoints before the one in force at ``now``."""
    k = bisect_right(lt, now) - 1
    if k > 0:
        del lt[:k]
        del lr[:k]


def _snap(lt: list[float], x: float) -> float:
    """``x``, or the breakpoint within ``TIME_EPS`` of it (as ``take_rate`` snaps)."""
    i = bisect_left(lt, x - TIME_EPS)
    if i < len(lt) and lt[i] <= x + TIME_EPS:
        return lt[i]
    return x


def unbook(lt: list[float], lr: list[float], pieces: list, t_from: float) -> float:
    """Give back what ``pieces`` (``(start, end, share)``, as booked) hold from ``t_from`` on;
    returns the work (share x ns) they served before it. Ends are snapped to the breakpoints
    the booking made, so nothing is left over but rounding."""
    done = 0.0
    for a, b, r in pieces:
        if a < t_from:
            done += r * ((b if b < t_from else t_from) - a)
        if b > t_from + TIME_EPS:
            a2 = _snap(lt, a if a > t_from else t_from)
            b2 = _snap(lt, b)
            if b2 > a2:
                add_shares(lt, lr, a2, b2, (-r,))
                _tidy(lt, lr, a2, b2)
    return done


def _tidy(lt: list[float], lr: list[float], a: float, b: float) -> None:
    """After shares were given back over ``[a, b]``: a share within ``RATE_EPS`` of 0 is 0, and
    a breakpoint within ``TIME_EPS`` of the one before it (a sliver left by rounding) or with
    the same share as the one before it goes."""
    i = bisect_left(lt, a - TIME_EPS) - 1
    if i < 0:
        i = 0
    j = bisect_right(lt, b + TIME_EPS) + 1
    if j > len(lt):
        j = len(lt)
    k = i
    reps, teps = RATE_EPS, TIME_EPS     # (compiled: C doubles in the loop, items unboxed)
    while k < j:
        x = lr[k]
        if -reps < x < reps:
            lr[k] = 0.0
            x = 0.0
        if k > 0:
            gap = lt[k] - lt[k - 1]
            if gap <= teps or x == lr[k - 1]:
                if gap <= teps:
                    lr[k - 1] = lr[k]    # the sliver before goes; this share holds from there
                del lt[k]
                del lr[k]
                j -= 1
                continue
        k += 1
