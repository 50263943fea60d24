"""The numpy twins of ``_busy_islands`` and ``_pe_segments`` (``analysis/islands.py``) and of
``_crit_pred`` (``analysis/critpred.py``): the same rows in the same order as the SQL views,
on real runs of several shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from kbtrace.analysis import _materialize as run_mod
from kbtrace.analysis import critpath, critpred, islands, utilwindows
from kbtrace.analysis.main import run_workload
from kbtrace.analysis.run import open_run


def test_islands_join_overlapping_and_touching_intervals_per_key():
    key = np.array([1, 1, 1, 2, 1, 1])
    s = np.array([0.0, 1.0, 5.0, 0.0, 2.0, 3.0])
    e = np.array([1.0, 3.0, 6.0, 1.0, 2.5, 4.0])
    k, a, b = islands.islands(key, s, e)
    # key 1: [0,1] touches [1,3], which holds [2,2.5] and touches [3,4]; [5,6] apart
    assert k.tolist() == [1, 1, 2]
    assert a.tolist() == [0.0, 5.0, 0.0] and b.tolist() == [4.0, 6.0, 1.0]
    # an interval inside an earlier long one does not end the island early
    k, a, b = islands.islands(np.zeros(3, np.int64), np.array([0.0, 1.0, 9.0]),
                              np.array([10.0, 2.0, 12.0]))
    assert (a.tolist(), b.tolist()) == ([0.0], [12.0])
    empty = np.array([], np.int64)
    assert [len(x) for x in islands.islands(empty, empty * 1.0, empty * 1.0)] == [0, 0, 0]


def test_premerge_joins_consecutive_overlapping_rows_of_a_key_into_the_same_islands():
    key = np.array([1, 1, 1, 1, 2, 2, 1, 1, 1])
    s = np.array([0.0, 2.0, 3.0, 9.0, 3.0, 4.0, 1.0, 5.0, 4.0])
    e = np.array([2.0, 2.5, 4.0, 9.5, 5.0, 4.5, 2.0, 4.0, 6.0])
    k, a, b = islands.premerge(key, s, e)
    # [0,2] touches [2,2.5]; [3,4] is apart from it; key 2's rows join; [5,4] (e < s) and
    # [4,6] after it are left as they are; [1,2] follows another key
    assert k.tolist() == [1, 1, 1, 2, 1, 1, 1]
    assert a.tolist() == [0.0, 3.0, 9.0, 3.0, 1.0, 5.0, 4.0]
    assert b.tolist() == [2.5, 4.0, 9.5, 5.0, 2.0, 4.0, 6.0]
    # and the islands of the merged rows are the islands of the rows
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(1, 60))
        key = rng.integers(0, 3, n)
        s = rng.integers(0, 40, n).astype(np.float64)
        e = s + rng.integers(-2, 8, n)          # some e < s, some touching
        e[rng.random(n) < 0.05] = np.nan
        got = islands.islands(*islands.premerge(key, s, e))
        want = islands.islands(key, s, e)
        assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(got, want, strict=True))


@pytest.fixture(scope="module", params=[("gemm", "small", "fast"), ("gemm", "small", "flit"),
                                        ("ring_allreduce", "small", "fast"),
                                        ("attention", "small", "fast")])
def run_dir(request, tmp_path_factory):
    wl, topo, fid = request.param
    d = tmp_path_factory.mktemp(wl)
    s = run_workload(wl, topology=topo, fidelity=fid, out=d / "data", verify_data=False,
                     make_report=False, attribute=False)
    return s.run_dir


@pytest.mark.parametrize("stream_rows,sort_rows,parts", [
    (islands.STREAM_ROWS, islands.SORT_ROWS, islands.PARTS), (97, 50, 7), (97, 1, 256)])
@pytest.mark.parametrize("view", sorted(islands.TWINS))
def test_twin_rows_equal_the_sql_view_in_order(run_dir, view, stream_rows, sort_rows, parts,
                                               monkeypatch):
    """Also with the hops streamed in small batches, spilled to files and sorted a few
    parts (resources, PEs) at a time, or one at a time."""
    monkeypatch.setattr(islands, "STREAM_ROWS", stream_rows)
    monkeypatch.setattr(islands, "SORT_ROWS", sort_rows)
    monkeypatch.setattr(islands, "PARTS", parts)
    other = next(v for v in islands.TWINS if v != view)
    with open_run(run_dir) as r:
        ref = r.con.sql(f"SELECT * FROM {view} ORDER BY ALL").to_arrow_table()
        ref_other = r.con.sql(f"SELECT * FROM {other} ORDER BY ALL").to_arrow_table()
        got = islands.plain(pa.concat_tables(islands.TWINS[view](r.con)))
        spill = Path(r.con.sql("SELECT current_setting('temp_directory')").fetchall()[0][0])
        assert not list(spill.iterdir())        # the sort file is gone (and was unnamed)
        shared: dict = {}                       # one scan for both views
        got2 = islands.plain(pa.concat_tables(islands.TWINS[view](r.con, shared=shared)))
        assert list(shared) == [other]
        got_other = islands.plain(pa.concat_tables(islands.TWINS[other](r.con, shared=shared)))
        assert shared == {}
    assert ref.num_rows > 0 and ref_other.num_rows > 0
    assert got.schema == ref.schema
    assert got.equals(ref) and got2.equals(ref)
    assert got_other.equals(ref_other)


@pytest.mark.parametrize("stream_rows,sort_rows,parts", [
    (critpred.STREAM_ROWS, islands.SORT_ROWS, islands.PARTS), (97, 50, 7), (97, 1, 256)])
def test_crit_pred_twin_rows_equal_the_sql_view_in_order(run_dir, stream_rows, sort_rows,
                                                        parts, monkeypatch):
    """Also with the queued-on resources' hops streamed in small batches, spilled and taken
    a few resources at a time, or one at a time."""
    monkeypatch.setattr(critpred, "STREAM_ROWS", stream_rows)
    monkeypatch.setattr(islands, "SORT_ROWS", sort_rows)
    monkeypatch.setattr(islands, "PARTS", parts)
    with open_run(run_dir) as r:
        ref = r.con.sql("SELECT * FROM _crit_pred ORDER BY ALL").to_arrow_table()
        got = critpred.crit_pred(r.con)
        edges = dict(r.con.sql("SELECT edge, count(*) FROM _crit_pred GROUP BY edge").fetchall())
    assert ref.num_rows > 0 and got.schema == ref.schema
    assert got.equals(ref)
    if "gemm" in run_dir.name:      # gemm's loads wait for the same HBM controllers
        assert edges.get("resource", 0) > 0


def test_critical_path_twin_rows_equal_the_sql_view_in_order(run_dir):
    """The walk and the rows of the view, in the order its plan gives them at one thread
    over the materialised _crit_pred (op_timing's), the completion row last."""
    with open_run(run_dir) as r:
        walk = r.con.sql("SELECT * FROM critical_path ORDER BY step").to_arrow_table()
        r.materialize(("_crit_pred",))
        ref = r.con.sql("SELECT * FROM critical_path").to_arrow_table()
        got = critpath.critical_path(r.con)
    assert ref.num_rows > 1 and got.schema == ref.schema
    assert got.equals(ref)
    assert got.sort_by("step").equals(walk)


def test_crit_pred_takes_its_hops_from_the_islands_scan(run_dir, monkeypatch):
    """Run.materialize hands the islands' scan a collector: _crit_pred scans nothing itself
    and gives the SQL's rows; a scan that did not see every hop once gives none."""
    with open_run(run_dir) as r:
        ref = r.con.sql("SELECT * FROM _crit_pred ORDER BY ALL").to_arrow_table()

        def no_scan(con):
            raise AssertionError("crit_pred scanned the hops itself")
        monkeypatch.setattr(critpred, "_scan", no_scan)
        r.materialize(("_pe_segments", "_busy_islands", "_crit_pred"))
        assert r._scans == {}
        got = r.con.sql("SELECT * FROM _crit_pred").to_arrow_table()
        n = r.con.sql("SELECT count(*) FROM hops").fetchall()[0][0]
        c = critpred.Collect(r.con)
        assert c.done(n + 1) is None and c.leaves.file is None
        assert critpred.Collect(r.con).done(n) is not None
    assert got.equals(ref)


@pytest.mark.parametrize("n_windows,stream_rows", [(20, utilwindows.STREAM_ROWS), (7, 97)])
def test_utilisation_windows_twin_rows_equal_the_sql_view(run_dir, n_windows, stream_rows,
                                                         monkeypatch):
    """The same rows; the busy sums added in time order, so equal to the last bits."""
    monkeypatch.setattr(utilwindows, "STREAM_ROWS", stream_rows)
    order = "ORDER BY resource_kind, resource_idx, win"
    with open_run(run_dir) as r:
        r.set_windows(n_windows)
        ref = r.con.sql(f"SELECT * FROM utilisation_windows {order}").to_arrow_table()
        got = utilwindows.rows(r.con)
        n_res = r.con.sql("SELECT count(DISTINCT (resource_kind, resource_idx)) "
                          "FROM _busy_islands").fetchall()[0][0]
    assert got.num_rows == ref.num_rows == n_res * n_windows > 0
    assert got.schema == ref.schema
    assert got.drop_columns(["busy_ns", "util"]).equals(ref.drop_columns(["busy_ns", "util"]))
    for col in ("busy_ns", "util"):
        a, b = got.column(col).to_numpy(), ref.column(col).to_numpy()
        assert np.allclose(a, b, rtol=1e-12, atol=0.0)
        assert ((a == 0) == (b == 0)).all()
    assert (got.column("busy_ns").to_numpy() > 0).any()


@pytest.mark.parametrize("n_windows", [20, 7])
def test_utilisation_windows_takes_its_sums_from_the_islands(run_dir, n_windows, monkeypatch):
    """Run.materialize has busy_island_parts add up the windows' busy times as it makes the
    islands: utilisation_windows then reads no island back, and its rows are the ones read
    from the islands' file, bit for bit; nothing of the hand-over is left on the run."""
    with open_run(run_dir) as r:
        r.set_windows(n_windows)
        r.materialize(("_busy_islands",))
        want = utilwindows.rows(r.con)      # (from the materialised islands' file)
    read = utilwindows.busy_by_window

    def no_read(con):
        raise AssertionError("utilisation_windows read the islands back")
    monkeypatch.setattr(utilwindows, "busy_by_window", no_read)
    with open_run(run_dir) as r:
        r.set_windows(n_windows)
        r.materialize()
        assert r._scans == {}
        got = r.con.sql("SELECT * FROM utilisation_windows").to_arrow_table()
        monkeypatch.setattr(utilwindows, "busy_by_window", read)
        r.set_windows(n_windows + 1)    # another count: its SQL (no sums were kept)
        assert r.con.sql("SELECT count(DISTINCT win) FROM utilisation_windows"
                         ).fetchall() == [(n_windows + 1,)]
    assert got.num_rows > 0 and got.equals(want)
    assert (got.column("busy_ns").to_numpy() > 0).any()


def test_window_sums_by_batch_and_key_order():
    """WindowSums adds each window's islands in the order given, whether the keys come
    sorted (their ranks from the change points) or not, in one batch or several."""
    t0 = np.array([0.0, 10.0, 20.0])
    t1 = np.array([10.0, 20.0, 30.0])
    key = np.array([5, 5, 1 << 32, 5, 1 << 32], np.int64)
    s = np.array([1.0, 8.0, 0.0, 25.0, 12.0])
    e = np.array([2.0, 12.5, 30.0, 26.0, 19.0])
    one = utilwindows.WindowSums(t0, t1)
    one.add(key, s, e)
    many = utilwindows.WindowSums(t0, t1)
    for a, b in ((0, 2), (2, 3), (3, 5)):       # sorted batches and an unsorted one
        many.add(key[a:b], s[a:b], e[a:b])
    for sums in (one, many):
        t = sums.table()
        assert t.column("resource_kind").to_pylist() == ["link"] * 3 + ["node"] * 3
        assert t.column("resource_idx").to_pylist() == [5] * 3 + [0] * 3
        assert t.column("win").to_pylist() == [0, 1, 2] * 2
        assert t.column("busy_ns").to_pylist() == [1.0 + 2.0, 2.5, 1.0, 10.0, 10.0 + 7.0, 10.0]


def test_window_sums_add_each_window_in_island_order():
    """WindowSums against one float addition at a time, island after island (the SQL's
    clipped lengths), on random islands of a few resources, some spanning windows, in one
    batch or cut anywhere: the same sums bit for bit."""
    rng = np.random.default_rng(11)
    for case in range(200):
        n = int(rng.integers(1, 5))
        span = float(rng.uniform(50, 500))
        w = np.arange(n, dtype=np.int64)
        t0, t1 = (w * span) / n, ((w + 1) * span) / n
        m = int(rng.integers(1, 1500))
        key = rng.integers(0, 2, m).astype(np.int64) | (rng.integers(0, 2, m) << 32)
        # starts of every magnitude (the parts' sums then round, in an order of their own),
        # many short islands a window and a few long ones
        s = span * rng.random(m) ** 4 - 1.0
        long = rng.random(m) < 0.01
        e = s + np.where(long, rng.exponential(span / (2 * n), m),
                         (np.abs(s) + 1e-3) * rng.exponential(0.01, m))
        k, a, b = islands.islands(key, s, e)
        want: dict[tuple[int, int], float] = {}
        for kk, aa, bb in zip(k.tolist(), a.tolist(), b.tolist(), strict=True):
            want.setdefault((kk, 0), 0.0)
            for j in range(n):
                want.setdefault((kk, j), 0.0)
                if t1[j] > aa and t0[j] < bb:
                    want[kk, j] += min(t1[j], bb) - max(t0[j], aa)
        sums = utilwindows.WindowSums(t0, t1)
        cuts = sorted({0, len(k), *rng.integers(0, len(k) + 1, case % 4).tolist()})
        for x, y in zip(cuts, cuts[1:], strict=False):
            sums.add(k[x:y], a[x:y], b[x:y])
        got = sums.table()
        keys = ((np.array(got.column("resource_kind").to_pylist()) == "node").astype(np.int64)
                << 32) | got.column("resource_idx").to_numpy()
        have = dict(zip(zip(keys.tolist(), got.column("win").to_pylist(), strict=True),
                        got.column("busy_ns").to_pylist(), strict=True))
        assert have.keys() == want.keys()
        assert all(np.float64(have[x]).tobytes() == np.float64(want[x]).tobytes()
                   for x in want)


def test_latest_candidate_is_the_lexsorts_first():
    """_crit_pred's choice per op: the latest end, then the lowest edge priority, then the
    lowest predecessor position, as the first row of the four-key lexsort; duplicates and
    signed zeros included."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        m, n = int(rng.integers(1, 80)), int(rng.integers(1, 12))
        xi = rng.integers(0, n, m).astype(np.int32)
        pi = rng.integers(0, 2 * n, m).astype(np.int32)
        prio = rng.integers(0, 4, m).astype(np.int8)
        tp = rng.integers(-3, 4, m).astype(np.float64)
        tp[rng.random(m) < 0.1] = -0.0
        tp[rng.random(m) < 0.05] = -np.inf
        dup = rng.integers(0, m, m // 4)
        xi, pi, prio, tp = (np.r_[a, a[dup]] for a in (xi, pi, prio, tp))
        o = np.lexsort((pi, prio, -tp, xi))
        first = np.r_[True, xi[o][1:] != xi[o][:-1]]
        want = (xi[o][first], pi[o][first], prio[o][first], tp[o][first])
        got = critpred._latest(n, xi, pi, prio, tp)
        assert got[0].tolist() == want[0].tolist()
        for a, b in zip(got[1:], want[1:], strict=True):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_materialize_uses_the_twins_and_changes_no_query(run_dir, monkeypatch):
    queries = ("SELECT stage, sum(dur_ns) FROM _pe_segments GROUP BY ALL ORDER BY ALL",
               "SELECT resource_kind, resource_idx, util FROM utilisation ORDER BY ALL",
               "SELECT * FROM stage_breakdown_pe ORDER BY ALL",
               "SELECT resource_kind, resource_idx, win, round(util, 9) FROM utilisation_windows "
               "ORDER BY ALL",
               "SELECT * FROM critical_path",            # (in the materialised table's order)
               "SELECT count(*), sum(contrib_ns) FROM critical_path")
    called: list[str] = []
    twins_before = dict(run_mod.TWINS)

    def counted(view):
        def fn(con, **kw):
            called.append(view)
            return twins_before[view](con, **kw)
        return fn

    def materialized() -> list:
        with open_run(run_dir) as r:
            r.materialize()
            tables = {t for (t,) in r.con.sql("SELECT table_name FROM duckdb_tables()").fetchall()}
            # the twins' rows in a file of the spill directory, where there is one; the
            # SQL's in a table
            file = bool(run_mod.TWINS) and r._spill_dir is not None
            assert ("_m__crit_pred" in tables) == (not file)
            assert critpath.pred_kept(r.con)
            return [r.con.sql(q).fetchall() for q in queries]

    monkeypatch.setattr(run_mod, "TWINS", {v: counted(v) for v in twins_before})
    twins = materialized()
    assert sorted(called) == ["_busy_islands", "_crit_pred", "_pe_segments", "critical_path",
                              "utilisation_windows"]
    monkeypatch.setattr(run_mod, "TWINS", {})       # the SQL views, as before the twins
    sql = materialized()
    assert twins == sql and all(sql)


_SCAN_COLS = ("placed", "pk", "busy", "rk", "hq", "t_enter_ns", "t_leave_ns", "t_busy_start_ns",
              "queue_ns", "op_id")


def _scanned(con, hops=None) -> pa.Table:
    """Every row ``islands._hop_rows`` gives, as a table sorted by all its columns."""
    parts = [pa.table(dict(zip(_SCAN_COLS, cols, strict=True)))
             for cols in islands._hop_rows(con, hops)]
    return pa.concat_tables(parts).sort_by([(c, "ascending") for c in _SCAN_COLS])


# op_timing rewritten: some ops without a kind or a placement, so the join's NULL cases show
_HOLES = ("CREATE OR REPLACE VIEW op_timing AS SELECT * REPLACE ("
          "CASE WHEN op_id % 5 = 1 THEN NULL ELSE kind END AS kind, "
          "CASE WHEN op_id % 7 = 2 THEN NULL ELSE sip END AS sip) FROM _ot")


@pytest.mark.parametrize("op_timing", [
    None, _HOLES,
    # dense op_ids, fewer ops than the hops name: the hops of the others are dropped
    "CREATE OR REPLACE VIEW op_timing AS SELECT * FROM _ot WHERE op_id < (SELECT max(op_id) "
    "FROM _ot) // 2",
    # not 0, 1, 2, ...: the scan is _SCAN_SQL's own
    "CREATE OR REPLACE VIEW op_timing AS SELECT * FROM _ot WHERE op_id % 3 <> 1"])
def test_hop_rows_are_the_scan_sqls_rows(run_dir, op_timing, monkeypatch):
    """``_hop_ctx``'s join and categories done in numpy give ``_SCAN_SQL``'s rows: every
    category bit, HBM queueing, resource key and busy start, hops of no op dropped; the hops
    read through the view or from its file."""
    monkeypatch.setattr(islands, "STREAM_ROWS", 1000)
    with open_run(run_dir) as r:
        con = r.con
        if op_timing is not None:
            con.execute("CREATE TEMP TABLE _ot AS SELECT * FROM op_timing")
            con.execute(op_timing)
        cols = ", ".join(_SCAN_COLS)
        ref = con.sql(f"SELECT {cols} FROM ({islands._SCAN_SQL}) ORDER BY ALL").to_arrow_table()
        got = _scanned(con)
        from_file = _scanned(con, r.run_dirs[0] / "hops.parquet")
        dense = islands._op_ctx(con) is not None
        bits = {int(b) for b in (got.column("pk").to_numpy() & 511)}
    assert ref.num_rows > 0
    assert got.num_rows == ref.num_rows
    for c in _SCAN_COLS:
        assert np.array_equal(got.column(c).to_numpy(), ref.column(c).to_numpy()), c
    assert from_file.equals(got)
    assert dense == (op_timing is None or "% 3" not in op_timing)
    if op_timing == _HOLES:         # kindless hops fall to their transfer, sip-less unplaced
        assert 0 in bits and not got.column("placed").to_numpy().all()
    if op_timing is None and "gemm" in run_dir.name:
        assert {1, 32, 64, 256} <= bits       # gemm, dma_read, dma_write, other
        assert got.column("hq").to_numpy().any()


def test_category_bits_follow_hop_ctx():
    """Per stage and op kind, the bit of the category ``_hop_ctx.sql`` gives the hop."""
    lut, bit = islands._category_bits(), dict(islands._STAGE_BITS)
    code = {st: i for i, st in enumerate(islands._OWN + islands._CARRY, 1)}
    plain_, host, store, ipcq = 0, 1, 2, 3
    assert lut[code["gemm"], plain_] == bit["gemm"] and lut[code["gemm"], host] == bit["other"]
    assert lut[code["hbm"], plain_] == bit["dma_read"] == lut[code["fabric"], plain_]
    assert lut[code["sram"], store] == bit["dma_write"] and lut[code["hbm"], ipcq] == bit["ipcq"]
    assert lut[code["store"], store] == bit["store"] and lut[code["ipcq"], ipcq] == bit["ipcq"]
    assert (lut[0] == bit["other"]).all() and (lut[:, host] == bit["other"]).all()
    assert {"h2d": host, "d2h": host, "store": store, "send": ipcq,
                                  "recv": ipcq} == islands._KIND_CODE


def test_materialize_hands_the_scan_the_hops_file(run_dir, monkeypatch):
    """A single run's twins read its hops.parquet with pyarrow (once, for both views), and
    nothing of the hand-over is left on the run."""
    seen: list = []
    raw = islands._raw_hops

    def spy(con, hops):
        seen.append(hops)
        return raw(con, hops)
    monkeypatch.setattr(islands, "_raw_hops", spy)
    with open_run(run_dir) as r:
        r.materialize(("_pe_segments", "_busy_islands"))
        assert r._scans == {}
    assert seen == [run_dir / "hops.parquet"]
