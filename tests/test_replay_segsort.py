"""The recorder's compiled batch sorts and busy-window sweep (``replay/segsort.py``) give what
the numpy passes give: ``order`` the permutation of ``np.lexsort`` (ties by position), and
``windows`` the windows of ``invariants.BusyCheck``'s sweep. The ``.py`` reference is checked
on small inputs (interpreted), the compiled twin, where it is built, on large ones; a replay
with it writes the same bytes as one without (``test_replay_core``)."""

from __future__ import annotations

import numpy as np
import pytest

from kbtrace.replay import segsort
from kbtrace.replay.colsort import lexsort2
from kbtrace.replay.fabric.core import seg_kernels
from kbtrace.replay.invariants import EPS_NS, REL_EPS, BusyCheck

IMPLS = [pytest.param(segsort, 300, id="reference")]
if seg_kernels() is not None:
    IMPLS.append(pytest.param(seg_kernels(), 20_000, id="compiled"))


def _keys(rng, n, span, kind):
    major = rng.integers(0, span, n).astype(np.int64) + 10**9
    minor = (rng.integers(0, 30, n) * 0.5) if kind == "ties" else rng.random(n) * 1e6
    minor = np.asarray(minor, dtype=np.float64)
    minor[::9] = -0.0 if kind == "ties" else minor[::9]
    return minor, major


@pytest.mark.parametrize(("impl", "n"), IMPLS)
@pytest.mark.parametrize("span", [1, 4, 300, 5_000])
@pytest.mark.parametrize("kind", ["ties", "spread"])
def test_order_is_lexsort(impl, n, span, kind):
    rng = np.random.default_rng(span + n)
    minor, major = _keys(rng, n, span, kind)
    lo = int(major.min())
    got = impl.order(minor, major, lo, int(major.max()) - lo + 1)
    assert np.array_equal(got, np.lexsort((minor, major)))


def test_order_small_cases():
    minor = np.array([2.0, 1.0, 1.0, 0.5, 2.0])
    major = np.array([7, 7, 3, 7, 3], dtype=np.int64)
    assert segsort.order(minor, major, 3, 5).tolist() == [2, 4, 3, 1, 0]
    assert segsort.order(np.empty(0), np.empty(0, dtype=np.int64), 0, 1).tolist() == []
    # a key's rows past SMALL are merge-sorted: descending times, ties kept in place
    m = np.repeat(np.arange(40, 0, -1, dtype=np.float64), 2)
    assert segsort.order(m, np.zeros(80, dtype=np.int64), 0, 1).tolist() == \
        np.lexsort((m, np.zeros(80))).tolist()
    # runs already in order are not merged (ties across a run's end stay in place), one
    # that is not is
    for m in (np.repeat(np.arange(40, dtype=np.float64), 2), np.r_[np.arange(48.0), 3.0, 47.0]):
        assert segsort.order(m, np.zeros(len(m), dtype=np.int64), 0, 1).tolist() == \
            np.lexsort((m, np.zeros(len(m)))).tolist()


@pytest.mark.parametrize("impl", [p.values[0] for p in IMPLS])
@pytest.mark.parametrize(("moves", "inversions"), [(0, 0), (400, 86), (20_000, 764)])
def test_order_of_a_long_key_nearly_in_order(impl, moves, inversions):
    """A key of 100 rows in time order (ties in threes) after ``moves`` random swaps of
    neighbours: sorted by insertion while that takes at most 400 moves (4 per row), else
    merged from where insertion stopped; either way ``np.lexsort``'s permutation."""
    rng = np.random.default_rng(moves)
    m = np.floor(np.arange(100) / 3.0)
    for _ in range(moves):
        i = int(rng.integers(0, 99))
        m[i], m[i + 1] = m[i + 1], m[i]
    assert sum(int((m[j + 1:] < m[j]).sum()) for j in range(100)) == inversions   # the moves
    major = np.full(100, 5, dtype=np.int64)
    assert np.array_equal(impl.order(m, major, 5, 1), np.lexsort((m, major)))


def _numpy_windows(res, s, e, b, c):
    """``BusyCheck.add``'s numpy sweep (no kernels) of intervals, via a stub check."""
    chk = BusyCheck.__new__(BusyCheck)
    chk.sim = None
    chk._kernels = None
    chk._w = -np.inf
    got = []
    chk._close = got.append
    chk._open = (np.empty(0, dtype=np.int64), np.empty(0), np.empty(0), np.empty(0),
                 np.empty(0, dtype=np.int64))
    chk.add(res, s, e, b, -np.inf)
    return got[0]


@pytest.mark.parametrize(("impl", "n"), IMPLS)
@pytest.mark.parametrize("seed", range(6))
def test_windows_are_the_numpy_sweeps(impl, n, seed):
    rng = np.random.default_rng(seed)
    res = rng.integers(0, [1, 3, 40, 400, 7, 2][seed], n).astype(np.int64)
    s = np.round(rng.random(n) * 1_000, seed % 3)
    d = rng.random(n) * 4.0
    d[::7] = 0.0
    e = s + d
    e[::11] = s[::11] - 5e-7            # a hair short of its start: within the tolerance
    b = d * rng.random(n)
    b[::11] = 0.0
    c = np.ones(n, dtype=np.int64)
    want = _numpy_windows(res, s, e, b, c)
    got = impl.windows(res, s, e, b, c, lexsort2(s, res), EPS_NS, REL_EPS)
    for w, g, name in zip(want, got, ("resource", "start", "end", "busy", "count"), strict=True):
        if name == "busy":              # summed in another order: the last bits may differ
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-9)
        else:
            assert np.array_equal(g, w), name
    if len(np.unique(res)) * 4 < n:
        assert len(got[0]) < n          # (some intervals did merge)


def test_windows_of_three_intervals():
    res = np.array([1, 1, 1, 2], dtype=np.int64)
    s = np.array([0.0, 5.0, 20.0, 0.0])
    e = np.array([10.0, 12.0, 30.0, 1.0])
    b = np.array([10.0, 7.0, 10.0, 1.0])
    c = np.ones(4, dtype=np.int64)
    w = segsort.windows(res, s, e, b, c, np.arange(4, dtype=np.int64), EPS_NS, REL_EPS)
    assert [x.tolist() for x in w] == [[1, 1, 2], [0.0, 20.0, 0.0], [12.0, 30.0, 1.0],
                                       [17.0, 10.0, 1.0], [2, 1, 1]]


def _recorder(tmp_path, name, kernels):
    from kbtrace.replay.recorder import Recorder
    return Recorder(tmp_path / name, 100, 8, 1 << 20, None, kernels=kernels)


def _recorder_n(tmp_path, name, kernels, n_ops):
    from kbtrace.replay.recorder import Recorder
    return Recorder(tmp_path / name, n_ops, 8, 1 << 20, None, kernels=kernels)


@pytest.mark.parametrize(("impl", "n"), IMPLS)
def test_expand_gives_the_pending_rows_numpy_gives(tmp_path, impl, n):
    """Compact transfers and explicit rows interleaved (several transfers at one position,
    explicit rows before, between and after them): the compiled expansion gives
    ``Recorder._pending``'s numpy columns, value for value."""
    rng = np.random.default_rng(n)
    recs = [_recorder(tmp_path, "a", None), _recorder(tmp_path, "b", impl)]
    plans: list[int] = []
    for _ in range(5):
        k = int(rng.integers(1, 6))
        rows = [(int(rng.integers(0, 8)), int(rng.integers(0, 50)), int(rng.integers(-1, 8)),
                 float(rng.random()), float(rng.random() * 9), float(rng.choice([-np.inf, 1.5])),
                 float(rng.random() * 9), False) for _ in range(k - 1)]
        rows.append((3, 7, -1, 2.5, float(rng.random()), 0.0, 0.0, True))
        for rec in recs:
            rec.add_plan(rows, 64 * k)
        plans.append(k)
    for _ in range(n // 10):
        if rng.random() < 0.5:
            row = (int(rng.integers(0, 100)), -1, 2, 5, -1, float(rng.random()),
                   float(rng.random()), 0.0, 0.25, 0)
            for rec in recs:
                rec.rows([row])
        else:
            pid = int(rng.integers(0, len(plans)))
            h0, t0 = float(rng.random() * 100), float(rng.random() * 100)
            args = (int(rng.integers(0, 100)), int(rng.integers(-1, 4)), pid, h0, t0,
                    h0 + 50.0, int(rng.integers(1, plans[pid] + 1)))
            for rec in recs:
                rec.transfer(*args)
    want, got = (rec._pending() for rec in recs)
    assert want.shape == got.shape == (10, want.shape[1])
    assert want.tobytes() == got.tobytes()


@pytest.mark.parametrize(("impl", "n"), IMPLS)
def test_finish_gives_the_columns_numpy_gives(tmp_path, impl, n):
    """A flushed batch (ops completing out of order, rows of one op out of time order, ties
    in enter and leave, an op whose end lies past its last row, rows of ops still in flight
    carried): the compiled finalisation writes the same hop rows, and leaves the same per-op
    ``t_end`` and ``queue``, as the numpy passes, byte for byte."""
    import pyarrow.parquet as pq
    rng = np.random.default_rng(n + 1)
    n_ops = max(40, n // 20)
    recs = [_recorder_n(tmp_path, "a", None, n_ops), _recorder_n(tmp_path, "b", impl, n_ops)]
    ops = rng.permutation(n_ops)
    for rnd in range(2):
        part = ops[rnd * n_ops // 2:(rnd + 1) * n_ops // 2]
        for o in part.tolist():
            t_issue = float(rng.integers(0, 50))
            for _ in range(int(rng.integers(1, 12))):
                en = t_issue + float(rng.integers(0, 20)) * 0.5
                lv = en + float(rng.choice([0.0, 0.5, float(rng.random() * 9)]))
                row = (o, int(rng.integers(-1, 4)), int(rng.integers(0, 14)),
                       int(rng.integers(0, 300)), int(rng.integers(-1, 8)), en, lv,
                       float(rng.random()), float(rng.choice([0.0, rng.random()])),
                       int(rng.integers(0, 4096)))
                for rec in recs:
                    rec.rows([row])
        late = part[: len(part) // 3].tolist()      # completed later: carried over
        for o in part.tolist():
            if o in late:
                continue
            t_end = float(rng.integers(0, 80))
            for rec in recs:
                rec.op_done(o, 1.0, 2.0, t_end, "pe")
        for rec in recs:
            rec.flush(100.0)
        for o in late:
            for rec in recs:
                rec.op_done(o, 1.0, 2.0, 3.0, "pe")
    for rec in recs:
        rec.close()
    want, got = (pq.read_table(tmp_path / d / "hops.parquet") for d in ("a", "b"))
    assert want.num_rows > n_ops
    assert want.equals(got)
    for c in ("t_end", "queue", "t_issue"):
        assert getattr(recs[0], c).tobytes() == getattr(recs[1], c).tobytes(), c


@pytest.mark.parametrize(("impl", "n"), IMPLS)
def test_intervals_give_the_numpy_rows(tmp_path, impl, n):
    """The busy intervals of a finalised batch (links and node-side rows, idle rows skipped,
    node-side resources first seen in this batch and in an earlier one): the compiled pass
    gives ``Recorder._intervals_of``'s numpy arrays and registers the same resources."""
    rng = np.random.default_rng(n + 2)
    recs = [_recorder(tmp_path, "a", None), _recorder(tmp_path, "b", impl)]
    for rnd in range(2):
        P = np.empty((10, n))
        P[0] = rng.integers(0, 100, n)
        P[1] = rng.integers(-1, 4, n)
        P[2] = rng.integers(0, 14, n)
        P[3] = rng.integers(0, 40 * (rnd + 1), n)
        P[4] = np.where(rng.random(n) < 0.5, -1, rng.integers(0, 8, n))
        P[5] = rng.random(n) * 1e3
        P[6] = P[5] + rng.random(n)
        P[7] = np.where(rng.random(n) < 0.2, 0.0, rng.random(n))
        P[8] = rng.random(n) * 0.1
        P[9] = 64
        want, got = (rec._intervals_of(P) for rec in recs)
        for w, g in zip(want, got, strict=True):
            assert w.dtype == g.dtype and w.tobytes() == g.tobytes()
        assert len(got[0]) == int((P[7] > 0).sum()) and (got[0] >= 8).any()
    assert recs[0].res_names == recs[1].res_names and len(recs[0].res_names) > 14


def _sim(n_res):
    from types import SimpleNamespace as NS
    return NS(rec=NS(n_links=n_res, res_names=[]),
              topo=NS(links=[NS(src=0, dst=1)] * n_res, nodes=[NS(id="a"), NS(id="b")]))


def _batches(rng, n, k, n_res):
    """``k`` batches of busy intervals, each starting at or after the watermark before it;
    in every other batch a few reach past the next watermark (their windows are carried)."""
    out = []
    for i in range(k):
        res = rng.integers(0, n_res, n).astype(np.int64)
        s = 600.0 * i + rng.random(n) * 500.0
        d = rng.random(n) * 30.0
        if i % 2:
            s[::50] = 600.0 * i + 450.0
            d[::50] = 200.0
        b = d * rng.random(n) * 0.5 * min(1.0, 10.0 * n_res / n)
        out.append((res, s, s + d, b, 600.0 * (i + 1)))
    return out


@pytest.mark.parametrize(("impl", "n"), IMPLS)
@pytest.mark.parametrize("n_res", [1, 5, 300])
def test_busy_add_keeps_the_numpy_windows(impl, n, n_res):
    """Batches of intervals with a rising watermark: the compiled ``busy_add`` carries the same
    open windows, drops and checks as many, and finds the same highest utilisation as the
    numpy passes (busy sums, added in another order, to the last bits)."""
    rng = np.random.default_rng(n + n_res)
    chks = [BusyCheck(_sim(n_res), None), BusyCheck(_sim(n_res), impl)]
    for res, s, e, b, w in _batches(rng, n, 4, n_res):
        for chk in chks:
            chk.add(res.copy(), s.copy(), e.copy(), b.copy(), w)
        a, c = chks
        for x, y, name in zip(a._open, c._open, ("res", "s", "e", "b", "c"), strict=True):
            if name == "b":
                np.testing.assert_allclose(y, x, rtol=1e-12, atol=1e-9)
            else:
                assert np.array_equal(x, y), name
        assert (a.n_windows, a.max_open) == (c.n_windows, c.max_open)
    assert chks[1].max_open > 0 and chks[1].n_windows > 0 and 0.0 < chks[1].max_util <= 1.0
    np.testing.assert_allclose(chks[1].max_util, chks[0].max_util, rtol=1e-12)
    assert chks[0].close() == pytest.approx(chks[1].close(), rel=1e-12)


@pytest.mark.parametrize("impl", [p.values[0] for p in IMPLS])
@pytest.mark.parametrize(("bad", "message"), [
    ("negative", "negative time: busy -1.000 ns in interval [10.000, 12.000] ns"),
    ("over", "busy 3.000 ns inside a 2.000 ns interval [10.000, 12.000] ns (over 100%)"),
    ("early", "busy interval [10.000, 12.000] ns starts before 50.000 ns"),
    ("window", "busy 3.000 ns in window [10.000, 12.000] ns of 2.000 ns with capacity 1"),
])
def test_busy_add_fails_as_numpy_does(impl, bad, message):
    """An interval that breaks a check (in the second batch, after a clean first one): the
    compiled path leaves it to the numpy passes, which raise the same error."""
    from kbtrace.errors import InvariantError
    res = np.array([0, 1, 1], dtype=np.int64)
    s, e = np.array([10.0, 10.0, 11.0]), np.array([12.0, 12.0, 12.0])
    b = {"negative": [-1.0, 1.0, 0.5], "over": [3.0, 1.0, 0.5], "early": [1.0, 1.0, 0.5],
         "window": [1.0, 2.0, 1.0]}[bad]
    chk = BusyCheck(_sim(4), impl)
    chk.add(np.array([3], dtype=np.int64), np.array([0.0]), np.array([1.0]), np.array([1.0]),
            50.0 if bad == "early" else 5.0)
    with pytest.raises(InvariantError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        chk.add(res, s, e, np.array(b), 100.0)


@pytest.mark.parametrize(("impl", "n"), IMPLS)
def test_split_and_order2_give_the_numpy_partition(impl, n):
    """Pending rows of completed ops (ranks from ``rank_lo`` on) and of ops in flight (-1):
    ``split`` keeps each part in row order with the ranks numpy gathers, and ``order2``
    gives the two ``np.lexsort`` orders (by rank, then enter / leave)."""
    rng = np.random.default_rng(n + 3)
    n_ops = max(20, n // 8)
    rank_of = np.where(rng.random(n_ops) < 0.7, rng.permutation(n_ops) + 5, -1).astype(np.int64)
    P = np.zeros((10, n))
    P[0] = rng.integers(0, n_ops, n)
    P[5] = rng.integers(0, 40, n) * 0.5
    P[6] = P[5] + rng.integers(0, 9, n) * 0.25
    P[9] = np.arange(n)
    Q, C, rank, lo, hi, nan, m = impl.split(P, rank_of, 5)
    fin = rank_of[P[0].astype(np.int64)] >= 0
    assert Q is P and rank.tolist() == np.where(fin, rank_of[P[0].astype(np.int64)], -1).tolist()
    assert C.tobytes() == np.ascontiguousarray(P[:, ~fin]).tobytes() and 0 < C.shape[1] < n
    assert m == int(fin.sum()) and not nan
    rk = rank[fin]
    assert (lo, hi) == (int(rk.min()), int(rk.max()))
    a, b = impl.order2(P[5], P[6], rank, lo, hi - lo + 1, m)     # the ranked rows of P
    keep = np.flatnonzero(fin)
    assert np.array_equal(a, keep[np.lexsort((P[5, keep], rk))])
    assert np.array_equal(b, keep[np.lexsort((P[6, keep], rk))])
    K = np.ascontiguousarray(P[:, fin])
    whole = impl.split(K, rank_of, 5)
    assert whole[1] is None and whole[0] is K and whole[6] == K.shape[1]
    K[6, 3] = np.nan
    assert impl.split(K, rank_of, 5)[5]
    P[0, 7] = int(np.flatnonzero(rank_of == 5)[0])      # an op written by an earlier flush
    rk_all = rank_of[P[0].astype(np.int64)]
    first = int(np.flatnonzero((rk_all >= 0) & (rk_all < 6))[0])
    assert first <= 7 and impl.split(P, rank_of, 6) == -1 - first
