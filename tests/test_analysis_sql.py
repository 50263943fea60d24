"""SQL golden tests: every public view of kbtrace/analysis/sql on the hand-made synthetic run.

Expected rows are worked out by hand from kbtrace.analysis.synthetic (makespan 180 ns).
"""

from __future__ import annotations

import pytest

from kbtrace.analysis.run import open_run
from kbtrace.analysis.sqllib import catalogue_markdown, view_docs
from kbtrace.analysis.synthetic import write_synthetic_run
from kbtrace.errors import AnalysisError, SchemaError


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    r = open_run(write_synthetic_run(tmp_path_factory.mktemp("synth")))
    yield r
    r.close()


def rows(run, q):
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in r)
            for r in run.con.sql(q).fetchall()]


def test_base_views_and_makespan(run):
    assert {"ops", "op_timing", "hops", "nodes", "links", "runs"} <= set(run.views())
    assert run.makespan_ns == 180.0
    assert run.pl("hops").height == 17
    assert rows(run, "SELECT name, makespan_ns, run_id FROM runs") == [("run", 180.0, "synth0000")]


def test_utilisation(run):
    got = rows(run, "SELECT resource_kind, resource_id, n_hops, busy_ns, busy_sum_ns, queue_ns, "
                    "util FROM utilisation WHERE n_hops > 0 ORDER BY resource_kind, resource_idx")
    p = "sip0.cube0."
    assert got == [
        ("link", f"{p}pe0.dma->{p}r0", 2, 18.0, 18.0, 2.0, 0.1),
        ("link", f"{p}r0->{p}pe0.dma", 2, 20.0, 20.0, 0.0, 0.111111),
        ("link", f"{p}pe1.dma->{p}r0", 2, 20.0, 20.0, 0.0, 0.111111),
        ("link", f"{p}r0->{p}pe1.dma", 1, 10.0, 10.0, 0.0, 0.055556),
        ("link", f"{p}pe0.ipcq->{p}pe1.ipcq", 1, 15.0, 15.0, 0.0, 0.083333),
        ("node", f"{p}pe0.fetch_store", 1, 10.0, 10.0, 0.0, 0.055556),
        ("node", f"{p}pe0.gemm", 1, 50.0, 50.0, 0.0, 0.277778),
        ("node", f"{p}pe1.fetch_store", 1, 5.0, 5.0, 0.0, 0.027778),
        ("node", f"{p}pe1.math", 1, 25.0, 25.0, 0.0, 0.138889),
        ("node", f"{p}pe1.ipcq", 1, 5.0, 5.0, 0.0, 0.027778),
        ("node", f"{p}hbm_ctrl.pe0", 4, 75.0, 75.0, 25.0, 0.416667),
    ]
    # every resource, used or not, is within [0, 1]
    assert rows(run, "SELECT count(*), min(util), max(util) <= 1 FROM utilisation") == [(21, 0.0, True)]


def test_utilisation_engine(run):
    got = rows(run, "SELECT engine, kind, n_ops, busy_ns, util FROM utilisation_engine ORDER BY engine")
    p = "sip0.cube0."
    assert got == [
        (f"{p}pe0.dma", "dma", 2, 80.0, 0.444444), (f"{p}pe0.gemm", "gemm", 1, 60.0, 0.333333),
        (f"{p}pe0.ipcq", "ipcq", 1, 20.0, 0.111111), (f"{p}pe0.pe_cpu", "pe_cpu", 1, 15.0, 0.083333),
        (f"{p}pe1.dma", "dma", 2, 90.0, 0.5), (f"{p}pe1.ipcq", "ipcq", 1, 60.0, 0.333333),
        (f"{p}pe1.math", "math", 1, 30.0, 0.166667),
    ]


def test_utilisation_windows_and_between(run):
    run.set_windows(4)
    try:
        got = rows(run, "SELECT win, t0_ns, t1_ns, busy_ns, util FROM utilisation_windows "
                        "WHERE resource_id = 'sip0.cube0.hbm_ctrl.pe0' ORDER BY win")
        assert got == [(0, 0.0, 45.0, 35.0, 0.777778), (1, 45.0, 90.0, 25.0, 0.555556),
                       (2, 90.0, 135.0, 0.0, 0.0), (3, 135.0, 180.0, 15.0, 0.333333)]
        assert rows(run, "SELECT count(*), max(util) <= 1 FROM utilisation_windows") == [(44, True)]
    finally:
        run.set_windows(20)
    got = rows(run, "SELECT resource_id, busy_ns, util FROM utilisation_between(0, 60) "
                    "WHERE resource_kind = 'node' AND busy_ns > 0 ORDER BY resource_idx")
    assert got == [("sip0.cube0.pe0.fetch_store", 10.0, 0.166667),
                   ("sip0.cube0.pe0.gemm", 10.0, 0.166667),
                   ("sip0.cube0.hbm_ctrl.pe0", 45.0, 0.75)]  # [10,50] + [55,60]

def test_materialised_utilisation_windows_follow_set_windows(tmp_path):
    """utilisation_windows materialised (the report reads it twice) is kept per window count:
    set_windows never leaves it at another count's rows."""
    q = ("SELECT win, t0_ns, t1_ns, busy_ns, util FROM utilisation_windows "
         "WHERE resource_id = 'sip0.cube0.hbm_ctrl.pe0' ORDER BY win")
    four = [(0, 0.0, 45.0, 35.0, 0.777778), (1, 45.0, 90.0, 25.0, 0.555556),
            (2, 90.0, 135.0, 0.0, 0.0), (3, 135.0, 180.0, 15.0, 0.333333)]
    with open_run(write_synthetic_run(tmp_path)) as r:
        twenty = rows(r, q)
        assert len(twenty) == 20 and twenty[0] == (0, 0.0, 9.0, 0.0, 0.0)
        r.materialize(("utilisation_windows",))
        assert rows(r, q) == twenty
        r.set_windows(4)                  # not cached: the view's SQL again
        assert rows(r, q) == four
        assert rows(r, "SELECT count(*) FROM utilisation_windows") == [(44,)]
        r.materialize(("utilisation_windows",))
        r.set_windows(20)                 # cached: its table
        assert rows(r, q) == twenty
        assert "_m_utilisation_windows_20" in r.con.sql(
            "SELECT sql FROM duckdb_views() WHERE view_name = 'utilisation_windows'").fetchall()[0][0]
        r.set_windows(4)
        assert rows(r, q) == four
        assert {t for t, in r.con.sql("SELECT table_name FROM duckdb_tables()").fetchall()
                if t.startswith("_m_utilisation_windows")} == {
            "_m_utilisation_windows_20", "_m_utilisation_windows_4"}


def test_stage_breakdown_pe_adds_up(run):
    got = rows(run, "SELECT pe, stage, time_ns FROM stage_breakdown_pe WHERE time_ns > 0 "
                    "ORDER BY pe, stage")
    assert got == [
        (0, "dma_read", 40.0), (0, "fetch", 10.0), (0, "gemm", 50.0), (0, "idle", 5.0),
        (0, "ipcq", 15.0),
        # PE 1's load waited 20 ns for the HBM pseudo-channel ([10, 30] of its hbm hop [10, 50]),
        # its store 5 ns ([160, 165]): hbm_queue, not dma_read / dma_write
        (1, "dma_read", 40.0), (1, "dma_write", 25.0), (1, "fetch", 5.0), (1, "hbm_queue", 25.0),
        (1, "ipcq", 60.0), (1, "math", 25.0),
    ]
    assert rows(run, "SELECT pe, sum(time_ns), any_value(span_ns), count(*) FROM stage_breakdown_pe "
                     "GROUP BY pe ORDER BY pe") == [(0, 120.0, 120.0, 10), (1, 180.0, 180.0, 10)]


def test_stage_breakdown_kind(run):
    got = rows(run, "SELECT kind, stage, n_ops, time_ns, queue_ns, share FROM stage_breakdown_kind "
                    "ORDER BY kind, stage")
    assert got == [
        ("composite", "fetch", 1, 10.0, 0.0, 0.166667), ("composite", "gemm", 1, 50.0, 0.0, 0.833333),
        ("load", "dma_read", 3, 140.0, 22.0, 1.0),
        ("math", "fetch", 1, 5.0, 0.0, 0.166667), ("math", "math", 1, 25.0, 0.0, 0.833333),
        ("recv", "ipcq", 1, 60.0, 0.0, 1.0), ("send", "ipcq", 1, 20.0, 0.0, 1.0),
        ("store", "dma_write", 1, 30.0, 5.0, 1.0),
    ]


def test_hotspots(run):
    got = rows(run, "SELECT rank, resource_id, n_hops, n_queued, queue_ns, max_queue_ns, "
                    "queue_share FROM hotspots ORDER BY rank")
    assert got == [(1, "sip0.cube0.hbm_ctrl.pe0", 4, 2, 25.0, 20.0, 0.925926),
                   (2, "sip0.cube0.pe0.dma->sip0.cube0.r0", 2, 1, 2.0, 2.0, 0.074074)]


def test_overlap(run):
    got = rows(run, "SELECT pe, span_ns, compute_ns, comm_ns, overlap_ns, comm_hidden, compute_share "
                    "FROM overlap ORDER BY pe")
    assert got == [(0, 120.0, 60.0, 95.0, 40.0, 0.421053, 0.5),
                   (1, 180.0, 30.0, 150.0, 0.0, 0.0, 0.166667)]


def test_critical_path_equals_makespan(run):
    got = rows(run, "SELECT step, op_id, pe, kind, edge, pred_op_id, t_from_ns, contrib_ns "
                    "FROM critical_path ORDER BY step")
    assert got == [
        (0, 0, 0, "load", "start", None, 0.0, 40.0),
        (1, 1, 0, "composite", "dep", 0, 40.0, 60.0),
        (2, 4, 0, "send", "dep", 1, 100.0, 20.0),
        (3, 6, 1, "recv", "ipcq", 4, 120.0, 0.0),
        (4, 7, 1, "math", "dep", 6, 120.0, 30.0),
        (5, 8, 1, "store", "dep", 7, 150.0, 30.0),
    ]
    assert rows(run, "SELECT sum(contrib_ns) FROM critical_path") == [(180.0,)]
    # resource edges: both loads that queued behind op0 name it as their releaser
    assert rows(run, "SELECT op_id, pred_op_id, edge FROM _crit_pred WHERE edge = 'resource' "
                     "ORDER BY op_id") == [(2, 0, "resource"), (5, 0, "resource")]


def test_every_view_documented():
    docs = view_docs()
    names = {d.name for d in docs}
    assert {"utilisation", "utilisation_engine", "utilisation_windows", "utilisation_between",
            "stage_breakdown_pe", "stage_breakdown_kind", "hotspots", "overlap",
            "critical_path"} <= names
    for d in docs:
        assert d.summary and d.columns, d.name
        assert all(u for _, u, _ in d.columns), d.name
    md = catalogue_markdown()
    assert "#### `critical_path` (view)" in md and "| `contrib_ns` | ns |" in md
    assert "#### `_hop_ctx`" not in md


def test_view_columns_match_docs(run):
    for d in view_docs():
        if d.is_macro or d.name == "_hop_ctx":
            continue
        cols = [c[0] for c in run.con.sql(f"DESCRIBE {d.name}").fetchall()]
        documented = []
        for c, _, _ in d.columns:
            documented.extend(x.strip() for x in c.split(","))
        assert documented == cols, d.name


def test_schema_version_mismatch(tmp_path):
    import pyarrow.parquet as pq

    run_dir = write_synthetic_run(tmp_path)
    t = pq.read_table(run_dir / "hops.parquet")
    t = t.replace_schema_metadata({**t.schema.metadata, b"kbtrace.schema_version": b"9.0"})
    pq.write_table(t, run_dir / "hops.parquet")
    with pytest.raises(SchemaError, match="written with schema 9.0"):
        open_run(run_dir)
    with pytest.raises(AnalysisError, match="no run.json"):
        open_run(tmp_path / "trace")


def test_critical_path_covers_launch_completion_tail(tmp_path):
    import json

    run_dir = write_synthetic_run(tmp_path)
    meta = json.loads((run_dir / "run.json").read_text())
    meta["makespan_ns"] = 200.0   # completion reaches the host 20 ns after the last op
    (run_dir / "run.json").write_text(json.dumps(meta))
    with open_run(run_dir) as r:
        assert r.makespan_ns == 200.0
        assert rows(r, "SELECT step, op_id, kind, edge, pred_op_id, contrib_ns FROM critical_path "
                       "WHERE step >= 5 ORDER BY step") == [
            (5, 8, "store", "dep", 7, 30.0), (6, None, "launch", "completion", 8, 20.0)]
        assert rows(r, "SELECT sum(contrib_ns) FROM critical_path") == [(200.0,)]
        assert rows(r, "SELECT max(util) <= 1 FROM utilisation") == [(True,)]


def test_docs_catalogue_current():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "analysis.md").read_text()
    section = doc.split("<!-- catalogue:begin -->\n")[1].split("<!-- catalogue:end -->")[0]
    assert section == catalogue_markdown(), "regenerate docs/analysis.md catalogue"


def test_resource_predecessor_ties_and_own_hops(tmp_path):
    """The 'resource' edge: the other ops that left the queued-on resource last. Ops 0 and 1
    both leave HBM node 11 at 40 ns; op 2 waits there until 40 ns, so both compete and the
    later-ending op 1 wins. Op 4 waits until 42 ns, but the last hop leaving by then (41 ns)
    is its own: the releasers before it (ops 0 and 1 at 40 ns) count."""
    from kbtrace import schema
    from kbtrace._io import write_table
    from kbtrace.analysis.critpred import crit_pred
    from kbtrace.analysis.synthetic import make_table

    run_dir = write_synthetic_run(tmp_path)
    #          op  t_end  hops on node 11: (t_enter, t_leave, queue)
    spec = {0: (50.0, [(0.0, 40.0, 0.0)]), 1: (55.0, [(5.0, 40.0, 0.0)]),
            3: (45.0, [(0.0, 30.0, 0.0)]), 2: (70.0, [(10.0, 60.0, 30.0)]),
            4: (80.0, [(20.0, 41.0, 0.0), (22.0, 70.0, 20.0)])}
    n = len(spec)
    ids = sorted(spec)
    write_table(run_dir / "op_timing.parquet", make_table(schema.OP_TIMING, {
        "op_id": ids, "launch": [0] * n, "program": ids, "sip": [0] * n, "cube": [0] * n,
        "pe": [0] * n, "seq": [0] * n, "kind": ["load"] * n, "name": ["load"] * n,
        "engine": ["sip0.cube0.pe0.dma"] * n, "t_issue_ns": [0.0] * n, "t_start_ns": [0.0] * n,
        "t_end_ns": [spec[o][0] for o in ids], "queue_ns": [0.0] * n, "nbytes": [64] * n}))
    hops = [(o, i, e, lv, q) for o in ids for i, (e, lv, q) in enumerate(spec[o][1])]
    m = len(hops)
    write_table(run_dir / "hops.parquet", make_table(schema.HOPS, {
        "op_id": [h[0] for h in hops], "hop": [h[1] for h in hops], "tile": [-1] * m,
        "stage": ["hbm"] * m, "node_idx": [11] * m, "link_idx": [-1] * m,
        "t_enter_ns": [h[2] for h in hops], "t_leave_ns": [h[3] for h in hops],
        "busy_ns": [0.0] * m, "queue_ns": [h[4] for h in hops], "crit_ns": [0.0] * m,
        "nbytes": [64] * m}))
    trace = tmp_path / "trace"
    write_table(trace / "ops.parquet", make_table(schema.OPS, {
        "op_id": ids, "launch": [0] * n, "program": ids, "pid0": ids, "pid1": [0] * n,
        "sip": [0] * n, "cube": [0] * n, "pe": [0] * n, "seq": [0] * n, "kind": ["load"] * n,
        "name": ["load"] * n, "is_async": [False] * n, "nbytes": [64] * n,
        "src_file": ["t.py"] * n, "src_line": [1] * n, "out_digest": [0] * n}))
    with open_run(run_dir) as r:
        assert rows(r, "SELECT op_id, pred_op_id, edge, pred_end_ns FROM _crit_pred "
                       "ORDER BY op_id") == [(2, 1, "resource", 55.0), (4, 1, "resource", 55.0)]
        # the numpy twin Run.materialize computes it with (analysis/critpred.py): the same
        assert crit_pred(r.con).to_pylist() == [
            {"op_id": 2, "pred_op_id": 1, "edge": "resource", "pred_end_ns": 55.0},
            {"op_id": 4, "pred_op_id": 1, "edge": "resource", "pred_end_ns": 55.0}]


def test_roofline_without_and_with_peaks(run, tmp_path):
    q = ("SELECT sip, cube, pe, span_ns, flops, vector_ops, hbm_bytes, intensity, gflops, "
         "hbm_gbps, peak_gflops, peak_hbm_gbps, roof_gflops, bound, attainment FROM roofline")
    # run.json has no peaks and the composite carries no m/n/k: no FLOPs, no roofs
    assert rows(run, q) == [
        (0, 0, 0, 120.0, 0.0, 0, 1024, 0.0, 0.0, 8.533333, None, None, None, None, None),
        (0, 0, 1, 180.0, 0.0, 128, 768, 0.0, 0.0, 4.266667, None, None, None, None, None)]
    # op 1 (composite gemm on PE0) as a 32 x 32 x 64 GEMM, and the peaks kbtrace replay records
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from kbtrace._io import write_table

    d = write_synthetic_run(tmp_path)
    ops_path = d.parent / "trace" / "ops.parquet"
    t = pq.read_table(ops_path)
    for col, v in (("m", 32), ("n", 32), ("k", 64)):
        vals = [v if i == 1 else None for i in t.column("op_id").to_pylist()]
        t = t.set_column(t.schema.get_field_index(col), t.schema.field(col),
                         pa.array(vals, t.schema.field(col).type))
    write_table(ops_path, t)
    info = json.loads((d / "run.json").read_text())
    info["peaks"] = {"gemm_gflops_per_pe": 2048.0, "math_gops_per_pe": 64.0,
                     "hbm_gbps_per_pe": 256.0, "pes": 2.0}
    (d / "run.json").write_text(json.dumps(info))
    with open_run(d) as r:
        # PE0: 2*32*32*64 = 131072 FLOP over 1024 HBM bytes = 128 FLOP/B, above the ridge
        # (2048 / 256 = 8): compute-bound; 131072 / 120 ns = 1092.27 GFLOP/s of a 2048 roof
        assert rows(r, q) == [
            (0, 0, 0, 120.0, 131072.0, 0, 1024, 128.0, 1092.266667, 8.533333, 2048.0, 256.0,
             2048.0, "compute", 0.533333),
            (0, 0, 1, 180.0, 0.0, 128, 768, 0.0, 0.0, 4.266667, 2048.0, 256.0, 0.0, None, None)]


def test_breakdown_stages_of_the_sql_are_the_schemas():
    """schema.BREAKDOWN_STAGES is the one list: _pe_segments attributes by its priority order,
    stage_breakdown_pe lists each of them (and idle), diff accepts stage.<each>."""
    import re
    from pathlib import Path

    from kbtrace import schema
    from kbtrace.analysis import differ

    sql = Path(__file__).resolve().parents[1] / "src" / "kbtrace" / "analysis" / "sql"
    seg = (sql / "_pe_segments.sql").read_text().split("AS stage,")[0].rsplit("SELECT", 1)[1]
    assert tuple(re.findall(r"THEN '(\w+)'", seg)) == schema.BREAKDOWN_STAGES
    listed = re.findall(r"\('(\w+)', \d+\)", (sql / "stage_breakdown_pe.sql").read_text())
    assert sorted(listed) == sorted((*schema.BREAKDOWN_STAGES, "idle"))
    assert set(differ._STAGES) == {*schema.BREAKDOWN_STAGES, "idle"}


def test_views_over_joins_and_groups_come_in_a_stated_order(run):
    """A view whose rows come out of a hash join or a GROUP BY has an ORDER BY: without one,
    ``utilisation``'s unused resources (the outer join's unmatched rows) came in one of two
    orders from run to run on the 1.0 M-op run, so ``kbtrace sql`` printed different text."""
    util = rows(run, "SELECT resource_kind, resource_idx FROM utilisation")
    assert util == sorted(util) and len(util) == 21 and util[0][0] == "link"
    assert rows(run, "SELECT sip, cube, pe FROM overlap") == [(0, 0, 0), (0, 0, 1)]
    kinds = rows(run, "SELECT kind, stage FROM stage_breakdown_kind")
    assert kinds == sorted(kinds) and len(kinds) > 1
