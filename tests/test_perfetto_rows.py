"""The timeline's op rows and cross-engine dependencies computed in numpy from a single run's
files (``analysis._perfetto_rows``) are the rows of the SQL they replace (``perfetto.OPS_QUERY``,
``perfetto.DEPS_QUERY``), in the same order: on real runs, on crafted files with ties, NaN,
-0.0, infinities, non-ASCII engine names and row groups of their own dictionaries, and the
exported timeline is byte for byte the one the SQL gives."""

from __future__ import annotations

import math
from types import SimpleNamespace

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kbtrace.analysis.perfetto as pf
from kbtrace.analysis._perfetto_rows import OP_COLUMNS, cross_engine_deps, op_rows
from kbtrace.analysis.main import run_workload
from kbtrace.analysis.run import open_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pfrows")
    out = []
    for wl, params in (("ring_allreduce", {}), ("gemm", {"M": 64, "N": 64, "K": 128}),
                       ("data_dependent", {})):
        s = run_workload(wl, params=params, out=d / "data", verify_data=False,
                         make_report=False, attribute=False)
        out.append(s.run_dir)
    return out


def _sql_rows(con, ops_q: str) -> list[tuple]:
    return con.sql(ops_q).fetchall()


def _numpy_rows(run) -> list[tuple]:
    got = op_rows(run, 7)          # small batches: the order runs across them
    assert got is not None
    rows = []
    for b in got:
        assert b.schema.names == OP_COLUMNS
        rows += list(zip(*[c.to_pylist() for c in b.columns], strict=True))
    return rows


def _same(a: list[tuple], b: list[tuple]) -> bool:
    """Equal rows, NaN equal to NaN and -0.0 told from 0.0."""
    def key(v):
        return ("nan",) if isinstance(v, float) and math.isnan(v) else (
            (v, math.copysign(1.0, v)) if isinstance(v, float) else v)
    return [tuple(key(v) for v in r) for r in a] == [tuple(key(v) for v in r) for r in b]


def test_op_rows_and_deps_are_the_sql_rows_on_real_runs(runs):
    for run_dir in runs:
        with open_run(run_dir) as r:
            want = _sql_rows(r.con, pf.OPS_QUERY)
            assert len(want) > 10 and _same(_numpy_rows(r), want)
            n_want = r.con.sql(f"SELECT count(*) FROM ({pf.DEPS_QUERY})").fetchall()[0][0]
            for limit in (0, 3, 10**9):
                got = cross_engine_deps(r, limit, batch=5)
                assert got is not None
                n, dep, op = got
                first = r.con.sql(f"{pf.DEPS_QUERY} ORDER BY 1, 2 LIMIT {limit}").fetchall()
                assert n == n_want and list(zip(dep.tolist(), op.tolist(), strict=True)) == first
    with open_run(runs[0]) as r:
        assert cross_engine_deps(r, 10**9)[0] > 0       # the ring has cross-engine deps


def test_timeline_is_byte_for_byte_the_sql_one(runs, tmp_path, monkeypatch):
    for i, run_dir in enumerate(runs):
        pf.export_perfetto(run_dir, tmp_path / f"np{i}.json")
    monkeypatch.setattr(pf, "op_rows", lambda run, rows: None)
    monkeypatch.setattr(pf, "cross_engine_deps", lambda run, limit: None)
    monkeypatch.setattr(pf, "MAX_FLOWS", pf.MAX_FLOWS)
    for i, run_dir in enumerate(runs):
        pf.export_perfetto(run_dir, tmp_path / f"sql{i}.json")
        assert (tmp_path / f"np{i}.json").read_bytes() == (tmp_path / f"sql{i}.json").read_bytes()


def test_flows_past_the_cap_are_the_sql_ones(runs, tmp_path, monkeypatch):
    """With few flows allowed, the dependency flows drawn and counted are the SQL's."""
    monkeypatch.setattr(pf, "MAX_FLOWS", 4)
    pf.export_perfetto(runs[0], tmp_path / "np.json")
    monkeypatch.setattr(pf, "op_rows", lambda run, rows: None)
    monkeypatch.setattr(pf, "cross_engine_deps", lambda run, limit: None)
    pf.export_perfetto(runs[0], tmp_path / "sql.json")
    assert (tmp_path / "np.json").read_bytes() == (tmp_path / "sql.json").read_bytes()


def _crafted(tmp_path):
    """op_timing and ops files with every order corner the sort keys have."""
    nan, inf = math.nan, math.inf
    # (op_id, engine, t_start_ns, t_end_ns)
    rows = [(0, "sip0.cube0.pe0.dma", 5.0, 9.0), (1, "sip0.cube0.pe0.dma", 5.0, 9.0),
            (2, "sip0.cube0.pe0.dma", 5.0, nan), (3, "sip0.cube0.pe0.dma", 5.0, inf),
            (4, "sip0.cube0.pe0.dma", -0.0, 1.0), (5, "sip0.cube0.pe0.dma", 0.0, 1.0),
            (6, "sip0.cube0.pe0.dma", nan, 3.0), (7, "Zeta", 1.0, 2.0), (8, "zeta", 1.0, 2.0),
            (9, "\u00e9ngine", 1.0, 2.0), (10, "sip0.cube0.pe0.dma", -inf, -0.0),
            (11, "sip0.cube0.pe0.dma", 5.0, -inf), (13, "Zeta", 1.0, nan),
            (14, "Zeta", 1.0, 2.0), (15, "sip0.cube0.pe0.gemm", 2.0, 2.0)]
    n = len(rows)
    op_timing = pa.table({
        "op_id": pa.array([r[0] for r in rows], pa.int64()),
        "launch": pa.array([i % 2 for i in range(n)], pa.int32()),
        "program": pa.array([i % 3 for i in range(n)], pa.int32()),
        "seq": pa.array(list(range(n)), pa.int32()),
        "kind": pa.array(["dma" if i % 2 else "gemm" for i in range(n)]).dictionary_encode(),
        "name": pa.array([f"n{i % 4}" for i in range(n)]).dictionary_encode(),
        "engine": pa.array([r[1] for r in rows]).dictionary_encode(),
        "t_start_ns": pa.array([r[2] for r in rows], pa.float64()),
        "t_end_ns": pa.array([r[3] for r in rows], pa.float64()),
        "queue_ns": pa.array([0.5 * i for i in range(n)], pa.float64()),
        "nbytes": pa.array([64 * i for i in range(n)], pa.int64()),
    })
    run_dir, trace_dir = tmp_path / "run", tmp_path / "trace"
    run_dir.mkdir()
    trace_dir.mkdir()
    pq.write_table(op_timing, run_dir / "op_timing.parquet", row_group_size=4)
    deps = [[], [0], [0, 0, 7], None, [99, -1, 3], [None, 8], [9, 14, 2], [15], [1], [],
            [13], [12], [4, 5], [7, 13]]   # op 12 has no timing; 99 and -1 are no ops
    ops = pa.table({"op_id": pa.array(range(len(deps)), pa.int64()),
                    "deps": pa.array(deps, pa.list_(pa.int64()))})
    pq.write_table(ops, trace_dir / "ops.parquet", row_group_size=3)
    con = duckdb.connect()
    con.execute(f"CREATE VIEW op_timing AS SELECT * FROM read_parquet('{run_dir}/op_timing.parquet')")
    con.execute(f"CREATE VIEW ops AS SELECT * FROM read_parquet('{trace_dir}/ops.parquet')")
    run = SimpleNamespace(run_dirs=(run_dir,), path=run_dir, sandbox=False, trace_dir=trace_dir,
                          con=con, error=lambda exc: exc)
    return run, con


def test_op_rows_and_deps_on_crafted_files(tmp_path):
    run, con = _crafted(tmp_path)
    want = _sql_rows(con, pf.OPS_QUERY)
    got = _numpy_rows(run)
    assert _same(got, want)
    # 'Zeta' < 'sip0...' < 'zeta' < 'éngine' (code points); NaN ends first descending;
    # -inf starts first
    assert [r[0] for r in got][:5] == [13, 7, 14, 10, 4]
    n_want = con.sql(f"SELECT count(*) FROM ({pf.DEPS_QUERY})").fetchall()[0][0]
    for limit in (0, 1, 4, 100):
        n, dep, op = cross_engine_deps(run, limit, batch=2)
        first = con.sql(f"{pf.DEPS_QUERY} ORDER BY 1, 2 LIMIT {limit}").fetchall()
        assert n == n_want and list(zip(dep.tolist(), op.tolist(), strict=True)) == first
    assert n_want == 7       # 2<-7, 5<-8, 6<-9, 6<-14, 7<-15, 8<-1, 10<-13


def test_a_run_set_or_sandbox_falls_back_to_the_sql(tmp_path):
    run, _ = _crafted(tmp_path)
    for other in (SimpleNamespace(**{**vars(run), "sandbox": True}),
                  SimpleNamespace(**{**vars(run), "path": tmp_path})):
        assert op_rows(other, 8) is None and cross_engine_deps(other, 8) is None
