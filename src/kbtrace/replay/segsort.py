# cython: boundscheck=False, wraparound=False
# (compiled: indices in range by construction or guarded; interpreted, every index is checked)
"""The recorder's batch kernels as plain loops, for the compiled core: sorts, the busy-window
sweep, and the expansion of compact transfers.

Each hop batch is put in (op rank, time) order twice (``Recorder.flush``: hop order and
``crit_ns`` order) and its busy intervals, with the windows carried from earlier batches, in
(resource, start) order, then swept into connected windows (``invariants.BusyCheck``).
Numpy does that in passes over whole columns (``colsort.lexsort2``: a stable argsort of the
times and a radix pass on the integer key; the sweep ranks the ends with one more argsort
to find each resource's running maximum), which is what runs interpreted. Compiled
(``_segsort_c``, typed by ``segsort.pxd``), these loops do the same in one or two passes:
``order`` places the rows by their integer key (a counting sort: stable) and sorts each
key's rows by time in place (by insertion, as they come nearly in order; a stable merge sort
where that moves too much), ``windows`` walks the sorted intervals once, ``expand`` writes
the pending rows (``Recorder._pending``: compact transfers expanded by their plans, explicit
rows between them) in one pass instead of numpy's repeat / gather / scatter passes, and
``finish`` writes a batch's output columns in hop order, typed, with each row's ``crit_ns``
and each op's ``t_end``, in two passes instead of some thirty numpy gathers, casts and
sweeps (``Recorder.flush``).
``fabric.core.seg_kernels()`` gives the compiled module, or None where the core is pure
Python.

Both give the same results as the numpy passes: ``order`` the permutation ``np.lexsort``
gives (ties by position; times must not be NaN: the callers check), ``windows`` the same
windows (starts, ends, counts; a window's busy time is summed in row order here and
pairwise by ``np.add.reduceat`` there, so it may differ in its last bits: it is compared
with a tolerance and written nowhere), ``expand`` and ``finish`` the same values bit for bit
(an op's ``queue_ns``, a sum, stays numpy's ``np.add.reduceat`` in both).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["order", "order2", "split", "windows", "expand", "finish", "intervals", "busy_add", "SMALL"]

#: a key's rows up to this many sorted by insertion whatever it takes (more: merged where
#: insertion makes over four moves per row)
SMALL = 24
_NEG_INF = float("-inf")


def order(minor: np.ndarray, major: np.ndarray, lo: int, span: int) -> np.ndarray:
    """``np.lexsort((minor, major))`` (``minor`` float64 without NaN, ``major`` int64 in
    ``[lo, lo + span)``): the permutation sorting by ``major``, ties by ``minor``, then by
    position."""
    n = len(minor)
    out = np.empty(n, dtype=np.int64)
    cnt = np.zeros(span + 1, dtype=np.int64)
    _count(major, lo, cnt, out)
    _within(minor, cnt, out, np.empty(n, dtype=np.int64))
    return out


def order2(minor: np.ndarray, minor2: np.ndarray, major: np.ndarray, lo: int,
           span: int, n: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """``(order(minor, major, lo, span), order(minor2, major, lo, span))``, with one counting
    pass for both (``Recorder.flush``'s hop and crit orders). ``n``: how many ``major`` are
    ``lo`` or more (default: all); the others (``split``'s -1: rows of ops in flight) are
    left out."""
    n = len(minor) if n < 0 else n
    out = np.empty(n, dtype=np.int64)
    cnt = np.zeros(span + 1, dtype=np.int64)
    _count(major, lo, cnt, out)
    out2 = out.copy()
    tmp = np.empty(n, dtype=np.int64)
    _within(minor, cnt, out, tmp)
    _within(minor2, cnt, out2, tmp)
    return out, out2


def _count(major: np.ndarray, lo: int, cnt: np.ndarray, out: np.ndarray) -> None:
    """``out``: the positions by ``major`` (a counting sort: stable), those with ``major``
    below ``lo`` left out; ``cnt[k]``: where key ``lo + k``'s positions end."""
    n = major.shape[0]
    span = cnt.shape[0] - 1
    for i in range(n):
        k = major[i] - lo
        if k >= 0:
            cnt[k + 1] += 1
    for k in range(1, span + 1):
        cnt[k] += cnt[k - 1]
    for i in range(n):
        k = major[i] - lo
        if k >= 0:
            out[cnt[k]] = i
            cnt[k] += 1


def _within(minor: np.ndarray, cnt: np.ndarray, out: np.ndarray, tmp: np.ndarray) -> None:
    """Each key's positions in ``out`` (ending at ``cnt``) stably by ``minor``: by insertion
    (the rows come nearly in time order), by merging where that takes too many moves."""
    span = cnt.shape[0] - 1
    small = SMALL
    a = 0
    for k in range(span):                   # each key's rows [a, b) by minor (stable)
        b = cnt[k]
        if not _insertion(minor, out, a, b, -1 if b - a <= small else 4 * (b - a)):
            _merge_sort(minor, out, tmp, a, b)      # (stable from the part insertion left)
        a = b


def _insertion(minor: np.ndarray, out: np.ndarray, a: int, b: int, budget: int) -> bool:
    """``out[a:b]`` stably by ``minor``, in place (insertion sort); False (a prefix sorted,
    the rest as it was) once more than ``budget`` moves were made (-1: no limit)."""
    for i in range(a + 1, b):
        x = out[i]
        v = minor[x]
        j = i - 1
        while j >= a and minor[out[j]] > v:
            out[j + 1] = out[j]
            j -= 1
        out[j + 1] = x
        if budget >= 0:
            budget -= i - 1 - j
            if budget < 0:
                return False
    return True


def _merge_sort(minor: np.ndarray, out: np.ndarray, tmp: np.ndarray, a: int, b: int) -> None:
    """``out[a:b]`` stably by ``minor``: runs of ``SMALL`` by insertion, then merged pairwise
    (through ``tmp``)."""
    small = SMALL
    r = a
    while r < b:
        e = r + small if r + small < b else b
        _insertion(minor, out, r, e, -1)
        r = e
    w = small
    while w < b - a:
        r = a
        while r < b:
            m = r + w if r + w < b else b
            e = r + 2 * w if r + 2 * w < b else b
            if m >= e or minor[out[m - 1]] <= minor[out[m]]:
                r = e                       # already in order (most are): nothing to merge
                continue
            i = r
            j = m
            k = r
            while i < m and j < e:
                if minor[out[j]] < minor[out[i]]:   # (ties: the left run's first)
                    tmp[k] = out[j]
                    j += 1
                else:
                    tmp[k] = out[i]
                    i += 1
                k += 1
            while i < m:
                tmp[k] = out[i]
                i += 1
                k += 1
            while j < e:
                tmp[k] = out[j]
                j += 1
                k += 1
            for i in range(r, e):
                out[i] = tmp[i]
            r = e
        w *= 2


def windows(res: np.ndarray, s: np.ndarray, e: np.ndarray, b: np.ndarray, c: np.ndarray,
            perm: np.ndarray, eps: float, rel: float) -> tuple[np.ndarray, ...]:
    """The connected windows of intervals ``(res, s, e, b, c)`` (resource, start, end, busy,
    count) taken in the order ``perm`` (by resource, then start): a window opens at a
    resource's first interval and where a start lies beyond the resource's running maximum
    end ``m`` by more than ``eps + rel * |m|``. Returns ``(resource, start, end, busy,
    count)`` per window, in that order."""
    n = len(perm)
    w_r = np.empty(n, dtype=np.int64)
    w_s = np.empty(n)
    w_e = np.empty(n)
    w_b = np.empty(n)
    w_c = np.empty(n, dtype=np.int64)
    m = _windows(res, s, e, b, c, perm, eps, rel, w_r, w_s, w_e, w_b, w_c)
    return w_r[:m], w_s[:m], w_e[:m], w_b[:m], w_c[:m]


def _windows(res: np.ndarray, s: np.ndarray, e: np.ndarray, b: np.ndarray, c: np.ndarray,
             perm: np.ndarray, eps: float, rel: float, w_r: np.ndarray, w_s: np.ndarray,
             w_e: np.ndarray, w_b: np.ndarray, w_c: np.ndarray) -> int:
    n = perm.shape[0]
    m = -1
    run = 0.0
    r0 = 0
    for i in range(n):
        k = perm[i]
        r = res[k]
        x = e[k]
        if m < 0 or r != r0:                # a resource's first interval
            r0 = r
            run = x
        elif s[k] > run + (eps + rel * abs(run)):  # beyond the running end: a new window
            if x > run:
                run = x
        else:                               # in the window
            if x > w_e[m]:
                w_e[m] = x
            w_b[m] += b[k]
            w_c[m] += c[k]
            if x > run:
                run = x
            continue
        m += 1
        w_r[m] = r
        w_s[m] = s[k]
        w_e[m] = x
        w_b[m] = b[k]
        w_c[m] = c[k]
    return m + 1


def expand(C: np.ndarray, X: np.ndarray, off: np.ndarray, pnb: np.ndarray, pst: np.ndarray,
           pnd: np.ndarray, plk: np.ndarray, pbusy: np.ndarray, pen: np.ndarray,
           pla: np.ndarray, plb: np.ndarray, pterm: np.ndarray, m: int,
           carry: np.ndarray | None = None) -> np.ndarray:
    """``Recorder._pending``'s columns (``(10, m)``: op, tile, stage, node, link, enter,
    leave, busy, queue, nbytes) of compact transfers ``C`` (``(position, op, tile, plan, h0,
    t0, done, n)`` rows) and explicit rows ``X`` in creation order: explicit row ``i`` after
    the rows of every transfer recorded at position ``<= i``. A transfer's ``j``-th row is
    its plan's (row ``off[plan] + j``): enter ``h0 + EN``, leave ``max(t0 + LA, h0 + LB)``
    (as ``np.maximum``: a NaN first operand wins) or ``done`` for the terminal row, queue 0.
    ``carry``: rows (``(10, k)``) put before them (no second copy to join them)."""
    k = 0 if carry is None else carry.shape[1]
    out = np.empty((10, k + m))
    if k:
        out[:, :k] = carry
    _expand(C, X, off, pnb, pst, pnd, plk, pbusy, pen, pla, plb, pterm.view(np.uint8), out, k)
    return out


def _expand(C: np.ndarray, X: np.ndarray, off: np.ndarray, pnb: np.ndarray, pst: np.ndarray,
            pnd: np.ndarray, plk: np.ndarray, pbusy: np.ndarray, pen: np.ndarray,
            pla: np.ndarray, plb: np.ndarray, pterm: np.ndarray, out: np.ndarray,
            r0: int) -> None:
    nc = C.shape[0]
    nx = X.shape[0]
    r = r0                                  # the next output row
    ix = 0                                  # the next explicit row
    for t in range(nc + 1):
        pos = int(C[t, 0]) if t < nc else nx
        while ix < pos:                     # explicit rows created before this transfer
            for f in range(10):
                out[f, r] = X[ix, f]
            ix += 1
            r += 1
        if t == nc:
            break
        pid = int(C[t, 3])
        h0 = C[t, 4]
        t0 = C[t, 5]
        base = off[pid]
        for j in range(int(C[t, 7])):
            i = base + j
            out[0, r] = C[t, 1]
            out[1, r] = C[t, 2]
            out[2, r] = pst[i]
            out[3, r] = pnd[i]
            out[4, r] = plk[i]
            out[5, r] = h0 + pen[i]
            if pterm[i]:
                out[6, r] = C[t, 6]
            else:
                a = t0 + pla[i]
                b = h0 + plb[i]
                out[6, r] = a if (a >= b or a != a) else b
            out[7, r] = pbusy[i]
            out[8, r] = 0.0
            out[9, r] = pnb[pid]
            r += 1


def finish(P: np.ndarray, order: np.ndarray, lo: np.ndarray, t_issue: np.ndarray,
           t_end: np.ndarray) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """``Recorder.flush``'s columns of a batch of finalised rows ``P`` (``(10, n)``, as
    ``expand`` writes them) in hop order ``order`` (by op rank, then enter), with ``crit_ns``
    from the crit order ``lo`` (by op rank, then leave): ``([op, hop, tile, stage, node,
    link, enter, leave, busy, queue, crit, nbytes], starts, seg_ops)`` (``hop`` / ``tile`` /
    ``node`` / ``link`` int32, ``stage`` int16, ``op`` / ``nbytes`` int64; each op's first
    position and its id). Each op's ``t_end`` becomes the latest of it and its rows' leave
    times (``t_end`` is updated in place). The same values as the numpy passes there:
    ``np.maximum``'s (NaN first), the same subtractions and casts."""
    n = order.shape[0]
    op = np.empty(n, dtype=np.int64)
    hop = np.empty(n, dtype=np.int32)
    tile = np.empty(n, dtype=np.int32)
    stage = np.empty(n, dtype=np.int16)
    node = np.empty(n, dtype=np.int32)
    link = np.empty(n, dtype=np.int32)
    en = np.empty(n)
    lv = np.empty(n)
    busy = np.empty(n)
    q = np.empty(n)
    crit = np.empty(n)
    nb = np.empty(n, dtype=np.int64)
    starts = np.empty(n, dtype=np.int64)
    seg_ops = np.empty(n, dtype=np.int64)
    tmp = np.empty(P.shape[1])              # (crit by row of P, ranked or not)
    m = _finish(P, order, lo, t_issue, t_end, tmp, op, hop, tile, stage, node, link, en, lv,
                busy, q, crit, nb, starts, seg_ops)
    return ([op, hop, tile, stage, node, link, en, lv, busy, q, crit, nb], starts[:m],
            seg_ops[:m])


def _mx(a: float, b: float) -> float:
    """``np.maximum(a, b)``: NaN if either is."""
    return a if (a >= b or a != a) else b


def _finish(P: np.ndarray, order: np.ndarray, lo: np.ndarray, t_issue: np.ndarray,
            t_end: np.ndarray, crit_r: np.ndarray, op: np.ndarray, hop: np.ndarray,
            tile: np.ndarray, stage: np.ndarray, node: np.ndarray, link: np.ndarray,
            en: np.ndarray, lv: np.ndarray, busy: np.ndarray, q: np.ndarray,
            crit: np.ndarray, nb: np.ndarray, starts: np.ndarray, seg_ops: np.ndarray) -> int:
    n = order.shape[0]
    m = 0
    i = 0
    while i < n:                            # crit, one op (a run of one op id) at a time
        x = P[0, lo[i]]
        j = i + 1
        while j < n and P[0, lo[j]] == x:
            j += 1
        o = int(x)
        iss = t_issue[o]
        y = P[6, lo[i]]
        for k in range(i + 1, j):           # (np.maximum.reduceat)
            y = _mx(y, P[6, lo[k]])
        te = _mx(t_end[o], y)
        prev = _NEG_INF
        for k in range(i, j):
            y = P[6, lo[k]]
            f = _mx(prev, iss)
            crit_r[lo[k]] = y - f if y > f else 0.0
            prev = y
        f = _mx(iss, prev)
        if te > f:
            crit_r[lo[j - 1]] += te - f
        t_end[o] = te
        starts[m] = i
        seg_ops[m] = o
        m += 1
        i = j
    s = 0
    for k in range(n):                      # the columns in hop order
        r = order[k]
        x = P[0, r]
        if k == 0 or x != P[0, order[k - 1]]:
            s = k
        op[k] = int(x)                      # (truncated, as astype does)
        hop[k] = k - s
        tile[k] = int(P[1, r])
        stage[k] = int(P[2, r])
        node[k] = int(P[3, r])
        link[k] = int(P[4, r])
        en[k] = P[5, r]
        lv[k] = P[6, r]
        busy[k] = P[7, r]
        q[k] = P[8, r]
        crit[k] = crit_r[r]
        nb[k] = int(P[9, r])
    return m


def intervals(P: np.ndarray, rid_of: np.ndarray, rank: np.ndarray | None = None
              ) -> tuple[np.ndarray, ...]:
    """``Recorder._intervals_of`` in one pass: per row of ``P`` (``(10, n)``, as ``expand``
    writes them) with ``busy > 0`` (and, given ``split``'s ``rank``, a rank: rows of ops in
    flight left out), in row order, ``(resource, enter + queue, leave, busy)``; a link row's
    resource is its link, a node-side row's ``rid_of[node * 64 + stage]``, or ``-1 - key``
    where that is not known yet (negative or past ``rid_of``: the caller assigns it)."""
    n = P.shape[1]
    res = np.empty(n, dtype=np.int64)
    s = np.empty(n)
    e = np.empty(n)
    b = np.empty(n)
    m = _intervals(P, rid_of, np.empty(0, dtype=np.int64) if rank is None else rank,
                   res, s, e, b)
    return res[:m], s[:m], e[:m], b[:m]


def _intervals(P: np.ndarray, rid_of: np.ndarray, rank: np.ndarray, res: np.ndarray,
               s: np.ndarray, e: np.ndarray, b: np.ndarray) -> int:
    n = P.shape[1]
    top = rid_of.shape[0]
    ranked = rank.shape[0] > 0
    m = 0
    for i in range(n):
        bz = P[7, i]
        if not bz > 0.0 or (ranked and rank[i] < 0):
            continue
        r = int(P[4, i])                    # (truncated, as astype does)
        if r < 0:
            key = int(P[3, i]) * 64 + int(P[2, i])
            r = rid_of[key] if 0 <= key < top else -1
            if r < 0:
                r = -1 - key
        res[m] = r
        s[m] = P[5, i] + P[8, i]
        e[m] = P[6, i]
        b[m] = bz
        m += 1
    return m


#: ``busy_add``'s answers other than the windows: the numpy passes must decide (a check
#: failed, so they raise with the message; a time is not finite; the resources span too
#: wide a range to count) or a resource's capacity is not known yet
BUSY_NUMPY = -1
BUSY_CAPACITY = -2


def busy_add(o_res: np.ndarray, o_s: np.ndarray, o_e: np.ndarray, o_b: np.ndarray,
             o_c: np.ndarray, res: np.ndarray, s: np.ndarray, e: np.ndarray, b: np.ndarray,
             w_prev: float, w_new: float, cap: np.ndarray, eps: float, rel: float
             ) -> int | tuple[tuple[np.ndarray, ...], int, float]:
    """``invariants.BusyCheck.add``'s compiled path in one call: the new intervals ``(res, s,
    e, b)`` checked (no negative busy time or length, none busier than its interval, none
    starting before the previous watermark ``w_prev``), swept with the open windows
    ``o_*`` (``order`` then ``windows``), and the windows ending before ``w_new`` checked
    against their capacity ``cap[resource]`` and dropped. Returns ``(open windows, windows
    dropped, their highest utilisation (0.0: none))``, or ``BUSY_NUMPY`` /
    ``BUSY_CAPACITY`` (nothing done: see there). The same comparisons, sums and order as
    the numpy passes, so the same windows."""
    no = o_res.shape[0]
    n = no + res.shape[0]
    mm = np.empty(2, dtype=np.int64)
    if n:
        k = _busy_scan(o_res, o_s, o_e, res, s, e, b, w_prev, eps, rel, cap, mm)
        if k < 0:
            return BUSY_CAPACITY if k == -2 else BUSY_NUMPY
    if not n:
        return (o_res, o_s, o_e, o_b, o_c), 0, 0.0
    lo = int(mm[0])
    span = int(mm[1]) - lo + 1
    if span > 4 * n + (1 << 16):
        return BUSY_NUMPY
    a_res = np.concatenate((o_res, res))
    a_s, a_e, a_b = np.concatenate((o_s, s)), np.concatenate((o_e, e)), np.concatenate((o_b, b))
    a_c = np.ones(n, dtype=np.int64)
    a_c[:no] = o_c
    w_r, w_s, w_e, w_b, w_c = windows(a_res, a_s, a_e, a_b, a_c, order(a_s, a_res, lo, span),
                                      eps, rel)
    out = np.empty(2)
    k = _busy_close(w_r, w_s, w_e, w_b, w_c, w_new, cap, eps, rel, out)
    if k < 0:
        return BUSY_CAPACITY if k == -2 else BUSY_NUMPY
    return (w_r[:k], w_s[:k], w_e[:k], w_b[:k], w_c[:k]), int(out[0]), out[1]


def _busy_scan(o_res: np.ndarray, o_s: np.ndarray, o_e: np.ndarray, res: np.ndarray,
               s: np.ndarray, e: np.ndarray, b: np.ndarray, w_prev: float, eps: float,
               rel: float, cap: np.ndarray, mm: np.ndarray) -> int:
    """``BusyCheck.add``'s checks of the new intervals (-1: one fails, or a time of them or
    of the open windows is not finite; -2: a new interval's resource has no capacity in
    ``cap`` yet) and the resources' range (``mm``: min, max)."""
    ncap = cap.shape[0]
    miss = False
    lo = 0
    hi = 0
    first = True
    inf = float("inf")
    w_lo = w_prev - (eps + rel * abs(w_prev))
    for i in range(o_res.shape[0]):
        if not (-inf < o_s[i] < inf and -inf < o_e[i] < inf):
            return -1
        r = o_res[i]
        if first or r < lo:
            lo = r
        if first or r > hi:
            hi = r
        first = False
    for i in range(res.shape[0]):
        x = e[i]
        y = s[i]
        z = b[i]
        if not (-inf < y < inf and -inf < x < inf):
            return -1
        te = eps + rel * abs(x)
        if z < -te or x < y - te or z > (x - y) + te or y < w_lo:
            return -1
        r = res[i]
        if r < 0 or r >= ncap or cap[r] == 0.0:
            miss = True
        if first or r < lo:
            lo = r
        if first or r > hi:
            hi = r
        first = False
    if miss:
        return -2
    mm[0] = lo
    mm[1] = hi
    return 0


def _busy_close(w_r: np.ndarray, w_s: np.ndarray, w_e: np.ndarray, w_b: np.ndarray,
                w_c: np.ndarray, w_new: float, cap: np.ndarray, eps: float, rel: float,
                out: np.ndarray) -> int:
    """``BusyCheck._close`` over windows ``w_*``: those ending before ``w_new`` checked
    (``busy <= cap * length + tol(end) * count``) and their count and highest utilisation put
    in ``out``; the others moved to the front, in order; their number (-2: a capacity not
    known, -1: a check fails; nothing moved then)."""
    m = w_r.shape[0]
    ncap = cap.shape[0]
    shut = 0
    u = 0.0
    for i in range(m):                      # first the checks, so a failure changes nothing
        x = w_e[i]
        if not x + (eps + rel * abs(x)) < w_new:
            continue
        r = w_r[i]
        if r < 0 or r >= ncap or cap[r] == 0.0:
            return -2
        c = cap[r]
        d = x - w_s[i]
        if w_b[i] > c * d + (eps + rel * abs(x)) * w_c[i]:
            return -1
        if d > 0:
            v = w_b[i] / (c * d)
            if v > u:
                u = v
        shut += 1
    k = 0
    for i in range(m):
        x = w_e[i]
        if x + (eps + rel * abs(x)) < w_new:
            continue
        w_r[k] = w_r[i]
        w_s[k] = w_s[i]
        w_e[k] = w_e[i]
        w_b[k] = w_b[i]
        w_c[k] = w_c[i]
        k += 1
    out[0] = shut
    out[1] = u
    return k


def split(P: np.ndarray, rank_of: np.ndarray, rank_lo: int) -> int | tuple[Any, ...]:
    """``Recorder.flush``'s split of the pending rows ``P`` (``(10, n)``) by their op's rank
    (``rank_of[op]``, -1: not completed): ``-1 - i`` where row ``i`` is the first of an op
    written before (rank in ``[0, rank_lo)``), else ``(P, a copy of the unranked rows in row
    order or None, each row's rank or -1, the lowest and highest rank, whether a ranked row's
    enter or leave is NaN, how many are ranked)`` (``order2`` / ``intervals`` skip the rest)."""
    n = P.shape[1]
    rank = np.empty(n, dtype=np.int64)
    info = np.zeros(4, dtype=np.int64)      # rows of completed ops, lowest, highest, NaN
    bad = _ranks(P, rank_of, rank_lo, rank, info)
    if bad >= 0:
        return -1 - bad
    m = int(info[0])
    C = None
    if m < n:
        C = np.empty((10, n - m))
        _part(P, rank, C)
    return P, C, rank, int(info[1]), int(info[2]), bool(info[3]), m


def _ranks(P: np.ndarray, rank_of: np.ndarray, rank_lo: int, rank: np.ndarray,
           info: np.ndarray) -> int:
    n = P.shape[1]
    m = 0
    lo = 0
    hi = 0
    nan = 0
    for i in range(n):
        r = rank_of[int(P[0, i])]           # (truncated, as astype does)
        rank[i] = r
        if r < 0:
            continue
        if r < rank_lo:
            return i
        if m == 0 or r < lo:
            lo = r
        if m == 0 or r > hi:
            hi = r
        if P[5, i] != P[5, i] or P[6, i] != P[6, i]:
            nan = 1
        m += 1
    info[0] = m
    info[1] = lo
    info[2] = hi
    info[3] = nan
    return -1


def _part(P: np.ndarray, rank: np.ndarray, C: np.ndarray) -> None:
    """``C``: the rows of ``P`` without a rank, in row order."""
    n = P.shape[1]
    c = 0
    for i in range(n):
        if rank[i] < 0:
            for f in range(10):
                C[f, c] = P[f, i]
            c += 1
