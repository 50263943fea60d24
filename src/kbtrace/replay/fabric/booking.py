# cython: boundscheck=False, wraparound=False
# (compiled: indices in range by construction; the pure-Python run checks each: test_replay_core)
"""Fast mode's reservation arithmetic: the booking state of nodes and links, and pure functions
on it, no SimPy.

A node's per-transaction overhead is an exclusive resource: its future busy intervals
are a flat sorted list ``[s0, e0, s1, e1, ...]`` (``Spans``; ``serve``, ``take``,
``unreserve``). A link's booked bandwidth is a step function: breakpoints ``t`` and the share
booked from each on ``v`` (``Steps``; ``take_rate``, ``fit_rate``, ``add_shares``,
``prune_rate``); streams that meet on a link give back what they booked (``unbook``) and are
served together, first come, first served (``fifo.share_fifo``; ``fair``). ``FastFabric``
owns one ``Spans`` per node and one ``Steps`` per link; these functions read and update them.

Both keep their values in growable arrays of C doubles (``array('d')``, typed views where
compiled: ``booking.pxd``), not lists of Python floats (a read from HBM reserves ~36 resources;
issue 22). The values, the order of the operations and so every result are the same either way.
"""

from __future__ import annotations

from array import array
from typing import Any

from kbtrace.replay.intervals import TIME_EPS

__all__ = ["RATE_EPS", "Spans", "Steps", "spans_of", "steps_of", "serve", "take", "unreserve",
           "take_rate", "add_shares", "fit_rate", "queue_rate", "prune_rate", "prune_states",
           "unbook"]

_INF = float("inf")
_NEG_INF = float("-inf")


def _zeros(n: int) -> array:     # (a repeat of one zero: ~3x cheaper than from bytes)
    return _ZERO * n


_ZERO = array("d", [0.0])
_EMPTY = _zeros(0)      # the buffer of a state with nothing booked yet (shared, never written)
_CAP0 = 16              # a state's first buffer


class _Sorted:
    """What ``Spans`` and ``Steps`` share: sorted breakpoints ``t[:n]`` in a growable array
    of C doubles (``_at``; ``t`` is a typed view of it where compiled, the array itself where
    not; a full array is replaced by one twice as large, since one with a view on it cannot
    be resized), the values beside them in one more (``_av``, its view ``v``: ``Steps``'
    shares, ``Spans``' owners once held, else None; one view: a state is a 480-byte object,
    in pymalloc's arenas), their binary searches and deleting a run (``cut``). The methods
    index ``self.t``, not a local copy of the view (compiled, a copy is an atomic count
    update: ~90% of an append). ``tl``: the last value ``t[n - 1]`` beside the count, so a
    booking's first test (free from ``s`` on?) misses no array tail."""
    __slots__ = ("_at", "t", "_av", "v", "n", "cap", "tl")

    def __init__(self, shares: bool) -> None:
        # no buffer until the first value (``_grow``): most of a topology's nodes and links
        # never book anything, and a buffer with its typed view costs ~4 us to make
        self._at = _EMPTY
        self.t: Any = None
        # the values beside t (one view, so that a state stays a small object): Steps'
        # shares, Spans' owners once one is held (``Spans.own``)
        self._av: Any = _EMPTY if shares else None
        self.v: Any = None
        self.n = 0
        self.cap = 0
        self.tl = 0.0

    def __len__(self) -> int:
        return self.n

    def _grow(self, need: int) -> None:
        cap = 2 * self.cap if self.cap else _CAP0
        while cap < need:
            cap *= 2
        self._at = _copied(self._at, self.n, cap)
        self.t = self._at
        if self._av is not None:
            self._av = _copied(self._av, self.n, cap)
            self.v = self._av
        self.cap = cap

    def cut(self, i: int, j: int) -> None:
        """Delete ``t[i:j]`` (and ``v[i:j]``; as ``del`` on a list: clipped to ``n``)."""
        if j > self.n:
            j = self.n
        if i >= j:
            return
        d = j - i
        q = j
        if self._av is None:
            while q < self.n:
                self.t[q - d] = self.t[q]
                q += 1
        else:
            while q < self.n:
                self.t[q - d] = self.t[q]
                self.v[q - d] = self.v[q]
                q += 1
        self.n -= d
        self.tl = self.t[self.n - 1] if self.n else 0.0

    def bisect_right(self, x: float) -> int:
        """``bisect.bisect_right(t[:n], x)``."""
        lo = 0
        hi = self.n
        while lo < hi:
            mid = (lo + hi) // 2
            if x < self.t[mid]:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def bisect_left(self, x: float) -> int:
        """``bisect.bisect_left(t[:n], x)``."""
        lo = 0
        hi = self.n
        while lo < hi:
            mid = (lo + hi) // 2
            if self.t[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        return lo


def _copied(a: Any, n: int, cap: int) -> array:
    """A new array of ``cap`` zeros starting with ``a[:n]``."""
    new = _ZERO * cap
    if n:
        new[:n] = a[:n]
    return new


class Spans(_Sorted):
    """A node's future busy intervals: ``t[:n]`` is ``[s0, e0, s1, e1, ...]``, sorted,
    disjoint (they may touch), and who holds each, if a flow whose head may move there does
    (``own``; ``fair.Flow``, ``heads.serve_head``): beside reservation ``t[i:i + 2]``, at
    ``v[i:i + 2]``, the flow's ``Slots.key`` (-1: none) and its head's arrival (``Slots.owner``
    reads them). Nothing else changes a reservation once made (none merged, moved, trimmed)."""
    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(False)

    def tolist(self) -> list[float]:
        return self._at[:self.n].tolist()

    def at(self, i: int) -> float:
        """``t[i]``, ``0 <= i < n``."""
        return self.t[i]

    def last(self) -> float:
        """The end of the last reservation; -inf if there is none."""
        return self.tl if self.n else _NEG_INF

    def push(self, s: float, e: float) -> None:
        """Append the reservation ``[s, e]`` (after the last one)."""
        n = self.n
        if n + 2 > self.cap:
            self._grow(n + 2)
        self.t[n] = s
        self.t[n + 1] = e
        if self._av is not None:
            self.v[n] = -1.0
        self.n = n + 2
        self.tl = e

    def insert2(self, i: int, s: float, e: float) -> None:
        """Insert ``s, e`` before ``t[i]``."""
        n = self.n
        if n + 2 > self.cap:
            self._grow(n + 2)
        q = n - 1
        while q >= i:
            self.t[q + 2] = self.t[q]
            q -= 1
        self.t[i] = s
        self.t[i + 1] = e
        if self._av is not None:
            q = n - 1
            while q >= i:
                self.v[q + 2] = self.v[q]
                q -= 1
            self.v[i] = -1.0
        self.n = n + 2
        self.tl = self.t[n + 1]

    def find(self, s: float) -> int:
        """The index in ``t`` of the reservation starting at ``s`` (reservations have
        positive length; ``n`` if none starts at or after it)."""
        i = self.bisect_left(s)
        if i & 1:             # an interval ending exactly at s precedes it
            i += 1
        return i

    def own(self, i: int, key: float, a: float) -> None:
        """The reservation ``t[i:i + 2]`` is held by the flow ``key`` (``ledger.Slots.key``),
        its head arriving at ``a`` (the start: as it starts)."""
        if self._av is None:
            self._av = _zeros(self.cap)
            self.v = self._av
            for q in range(0, self.n, 2):
                self.v[q] = -1.0
        self.v[i] = key
        self.v[i + 1] = a

    def owned(self) -> bool:
        """Has a reservation ever been held by a flow (``own``)?"""
        return self._av is not None

    def disown(self, now: float) -> None:
        """Forget who holds the reservations that start by ``now`` (their heads are there:
        none moves; ``heads.prune_owners``)."""
        k = self.bisect_right(now)
        for q in range(0, k, 2):
            self.v[q] = -1.0

    def prune(self, now: float) -> None:
        """Drop the intervals that ended at or before ``now`` (they can block nothing;
        ``intervals.prune``)."""
        k = self.bisect_right(now)
        self.cut(0, k - (k & 1))


class Steps(_Sorted):
    """A link's booked bandwidth, a step function: the share ``v[i]`` of the bandwidth is
    booked from breakpoint ``t[i]`` to ``t[i + 1]`` (``i < n``; the last share is 0)."""
    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(True)

    def times(self) -> list[float]:
        return self._at[:self.n].tolist()

    def shares(self) -> list[float]:
        return self._av[:self.n].tolist()

    def push(self, s: float, r: float, e: float) -> None:
        """Book the share ``r`` from ``s`` to ``e``, after the last breakpoint (``<= s``)."""
        n = self.n
        if n + 2 > self.cap:
            self._grow(n + 2)
        self.t[n] = s
        self.v[n] = r
        self.t[n + 1] = e
        self.v[n + 1] = 0.0
        self.n = n + 2
        self.tl = e

    def insert(self, i: int, x: float, r: float) -> None:
        """Insert the breakpoint ``x`` with the share ``r`` from it on before ``t[i]``."""
        n = self.n
        if n + 1 > self.cap:
            self._grow(n + 1)
        q = n - 1
        while q >= i:
            self.t[q + 1] = self.t[q]
            self.v[q + 1] = self.v[q]
            q -= 1
        self.t[i] = x
        self.v[i] = r
        self.n = n + 1
        self.tl = self.t[n]


def spans_of(values: list[float]) -> Spans:
    """A node's ``Spans`` holding ``values`` (``[s0, e0, s1, e1, ...]``)."""
    iv = Spans()
    for i in range(0, len(values), 2):
        iv.push(values[i], values[i + 1])
    return iv


def steps_of(times: list[float], shares: list[float]) -> Steps:
    """A link's ``Steps`` with the breakpoints ``times`` and the share from each on."""
    ln = Steps()
    for x, r in zip(times, shares, strict=True):
        ln.insert(ln.n, x, r)
    return ln


def serve(iv: Spans, now: float, h: float, work: float) -> float:
    """Serve ``work`` ns on an exclusive resource (a node's overhead) from ``h`` on, in the
    gaps between its reservations (preemptive resume: bookings keep their times; a gap
    shorter than ``work`` is used, not skipped); reserve the pieces; return when done."""
    n = iv.n
    if not n or iv.tl <= h:
        iv.push(h, h + work)
        return h + work
    if iv.t[1] <= now:
        iv.prune(now)
    i = iv.bisect_right(h)
    t = h
    if i & 1:             # inside a reservation: from its end
        t = iv.t[i]
        i += 1
    eps = TIME_EPS          # (compiled: a C double in the loop)
    while True:
        if i == iv.n:
            iv.push(t, t + work)
            return t + work
        nxt = iv.t[i]
        if nxt - t >= work - eps:
            e = t + work
            iv.insert2(i, t, e if e < nxt else nxt)
            return e
        if nxt - t > eps:           # (a sliver left by rounding serves nothing)
            iv.insert2(i, t, nxt)
            work -= nxt - t
            i += 2
        t = iv.t[i + 1]
        i += 2


def take(iv: Spans, s: float, e: float) -> bool:
    """Reserve ``[s, e]`` in ``iv`` if it is free (after the last reservation, or a gap that
    holds it whole); False (nothing reserved) if not: ``FastFabric.send``'s test, inline
    there."""
    n = iv.n
    if not n or iv.tl <= s:
        iv.push(s, e)
        return True
    i = iv.bisect_right(s)
    if i & 1:
        return False
    x = iv.t[i]
    if e > x + TIME_EPS:
        return False
    iv.insert2(i, s, e if e < x else x)
    return True


def unreserve(iv: Spans, s: float) -> None:
    """Remove the reservation starting at ``s`` (reservations have positive length)."""
    i = iv.find(s)
    iv.cut(i, i + 2)


RATE_EPS = 1e-9   # bandwidth shares summing to 1 + RATE_EPS still fit (rounding of busy / span)


def take_rate(ln: Steps, s: float, e: float, busy: float) -> bool:
    """Reserve a link's bandwidth share ``busy / (e - s)`` over ``[s, e)`` if every moment of
    it has that much to spare; False (nothing reserved) if not.

    A link's reservations are a step function (``Steps``): ``v[i]`` is the share of the
    bandwidth booked from breakpoint ``t[i]`` to ``t[i + 1]`` (non-decreasing; the last share
    is 0). A transfer whose flits arrive slower than the link serves them (fed by a slower
    link upstream) books only that share, so transfers that together fit the bandwidth
    overlap, as their flits interleave in flit mode; a transfer the link itself limits books
    all of it.
    """
    r = busy / (e - s)
    if r > 1.0:
        r = 1.0
    n = ln.n
    if not n or ln.tl <= s:             # free from s on
        ln.push(s, r, e)
        return True
    lim = 1.0 + RATE_EPS - r
    # a breakpoint within TIME_EPS of s or e counts as at it (intervals.TIME_EPS)
    k = ln.bisect_right(s + TIME_EPS) - 1
    if k >= 0 and ln.t[k] >= s - TIME_EPS:
        s = ln.t[k]
    j = ln.bisect_left(e - TIME_EPS)
    if j < n and ln.t[j] <= e + TIME_EPS:
        e = ln.t[j]
    if k < 0:                           # before the first breakpoint (share 0 there)
        k = 0
    elif j == k + 1:                    # inside one segment (the common case)
        x = ln.v[k]
        if x > lim:
            return False
        if ln.t[k] == s:
            ln.v[k] = x + r
            if j == n or ln.t[j] != e:
                ln.insert(j, e, x)
        elif j < n and ln.t[j] == e:
            ln.insert(j, s, x + r)
        else:
            ln.insert(j, e, x)
            ln.insert(j, s, x + r)
        return True
    for q in range(k, j):
        x = ln.v[q]         # (compiled: a C double)
        if x > lim:
            return False
    add_shares(ln, s, e, (r,))
    return True


def add_shares(ln: Steps, s: float, e: float, shares: Any) -> None:
    """Add ``shares`` over ``[s, e)``: one per segment of the step function there, in order
    (a breakpoint is inserted at ``s`` and ``e`` unless one is there; a single value is
    added to every segment)."""
    j = ln.bisect_left(e)
    if j == ln.n or ln.t[j] != e:
        ln.insert(j, e, ln.v[j - 1] if j else 0.0)
    i = ln.bisect_right(s) - 1
    if i < 0 or ln.t[i] != s:
        i += 1
        ln.insert(i, s, ln.v[i - 1] if i else 0.0)
        j += 1
    if len(shares) == 1:
        r = shares[0]
        for k in range(i, j):
            ln.v[k] += r
    else:
        for k, r in zip(range(i, j), shares, strict=True):
            ln.v[k] += r


def fit_rate(ln: Steps, now: float, h: float, hd: float, body: float,
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
    if take_rate(ln, h, e, busy):
        if out is not None:
            r = busy / (e - h)
            out.append((h, e, r if r < 1.0 else 1.0))
        return h, h + hd, e
    return queue_rate(ln, now, h, hd, e, tail_at + last, busy, out)


def queue_rate(ln: Steps, now: float, h: float, hd: float, e: float, tail: float,
               busy: float, out: list | None = None) -> tuple[float, float, float]:
    """``fit_rate`` past a failed ``take_rate`` over ``[h, e)`` (``tail``: ``tail_at + last``):
    the stream as a queue at the link, served with what the link spares."""
    if ln.n > 1 and ln.t[1] <= now:
        prune_rate(ln, now)
    rho = busy / (e - h)
    if rho > 1.0:
        rho = 1.0
    e_in = h + busy / rho               # all of its work has arrived
    tiny = 1e-12 * (busy if busy > 1.0 else 1.0)
    n = ln.n
    k = ln.bisect_right(h) - 1
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
            booked = ln.v[k]    # (compiled: a C double)
            c = 1.0 - booked
        if c <= rate_eps:
            c = 0.0
        t1 = ln.t[k + 1] if k + 1 < n else inf
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
            add_shares(ln, a0, b0, (r0,))
            if out is not None:
                out.append((a0, b0, r0))
        a0, b0, r0 = a, b, r
    if b0 > a0 and r0 > 0.0:
        add_shares(ln, a0, b0, (r0,))
        if out is not None:
            out.append((a0, b0, r0))
    if head < 0.0:
        head = end
    return (start if start >= 0.0 else h), head, (end if end > tail else tail)


def prune_rate(ln: Steps, now: float) -> None:
    """Drop a link's breakpoints before the one in force at ``now``."""
    k = ln.bisect_right(now) - 1
    if k > 0:
        ln.cut(0, k)


def prune_states(node_iv: list, link_steps: list, now: float, over: int) -> None:
    """Prune each node's ``Spans`` and link's ``Steps`` holding over ``over`` values."""
    for iv in node_iv:
        if iv.n > over:
            iv.prune(now)
    for ln in link_steps:
        if ln.n > over:
            prune_rate(ln, now)


def _snap(ln: Steps, x: float) -> float:
    """``x``, or the breakpoint within ``TIME_EPS`` of it (as ``take_rate`` snaps)."""
    i = ln.bisect_left(x - TIME_EPS)
    if i < ln.n and ln.t[i] <= x + TIME_EPS:
        return ln.t[i]
    return x


def unbook(ln: Steps, pieces: list, t_from: float) -> float:
    """Give back what ``pieces`` (``(start, end, share)``, as booked) hold from ``t_from`` on;
    returns the work (share x ns) served before it. Ends snap to the booking's breakpoints."""
    done = 0.0
    for a, b, r in pieces:
        if a < t_from:
            done += r * ((b if b < t_from else t_from) - a)
        if b > t_from + TIME_EPS:
            a2 = _snap(ln, a if a > t_from else t_from)
            b2 = _snap(ln, b)
            if b2 > a2:
                add_shares(ln, a2, b2, (-r,))
                _tidy(ln, a2, b2)
    return done


def _tidy(ln: Steps, a: float, b: float) -> None:
    """After shares were given back over ``[a, b]``: a share within ``RATE_EPS`` of 0 is 0, and
    a breakpoint within ``TIME_EPS`` of the one before it (a sliver left by rounding) or with
    the same share as the one before it goes."""
    i = ln.bisect_left(a - TIME_EPS) - 1
    if i < 0:
        i = 0
    j = ln.bisect_right(b + TIME_EPS) + 1
    if j > ln.n:
        j = ln.n
    k = i
    reps, teps = RATE_EPS, TIME_EPS     # (compiled: C doubles in the loop, items unboxed)
    while k < j:
        x = ln.v[k]
        if -reps < x < reps:
            ln.v[k] = 0.0
            x = 0.0
        if k > 0:
            gap = ln.t[k] - ln.t[k - 1]
            if gap <= teps or x == ln.v[k - 1]:
                if gap <= teps:
                    ln.v[k - 1] = ln.v[k]   # the sliver before goes; this share holds from there
                ln.cut(k, k + 1)
                j -= 1
                continue
        k += 1
