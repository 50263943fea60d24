"""open_run API, run sets, the example notebook and the `kbtrace sql` CLI on the synthetic run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

import kbtrace
from kbtrace.analysis.synthetic import write_synthetic_run
from kbtrace.cli import main
from kbtrace.errors import AnalysisError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def run_dir(tmp_path):
    return write_synthetic_run(tmp_path)


def test_open_run_polars_accessors(run_dir):
    with kbtrace.open_run(run_dir) as run:
        hops = run.pl("hops")
        assert isinstance(hops, pl.DataFrame) and hops.height == 17
        assert hops.schema["stage"] == pl.String
        df = run.sql("SELECT kind, count(*) AS n FROM ops GROUP BY kind ORDER BY kind")
        assert df.rows() == [("composite", 1), ("load", 3), ("math", 1), ("recv", 1),
                             ("send", 1), ("store", 1), ("wait", 1)]
        with pytest.raises(AnalysisError, match="not a view name"):
            run.pl("hops; DROP VIEW hops")
        with pytest.raises(AnalysisError, match="SQL failed"):
            run.sql("SELECT nope FROM hops")


def test_run_set_has_runs_view(tmp_path):
    a = write_synthetic_run(tmp_path / "a")
    b = write_synthetic_run(tmp_path / "b")
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.move(a, runs / "r1")
    shutil.move(b, runs / "r2")
    for r in ("r1", "r2"):  # trace_dir was relative to the old location
        meta = json.loads((runs / r / "run.json").read_text())
        meta["trace_dir"] = str(tmp_path / ("a" if r == "r1" else "b") / "trace")
        (runs / r / "run.json").write_text(json.dumps(meta))
    with kbtrace.open_run(runs) as rs:
        assert rs.sql("SELECT name, makespan_ns FROM runs ORDER BY name").rows() == [
            ("r1", 180.0), ("r2", 180.0)]
        assert rs.sql("SELECT run_name, count(*) FROM hops GROUP BY ALL ORDER BY 1").rows() == [
            ("r1", 17), ("r2", 17)]


def test_example_notebook_executes(monkeypatch):
    nb = json.loads((REPO / "analysis" / "example.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert len(code) >= 5
    monkeypatch.delenv("KBTRACE_RUN", raising=False)
    ns: dict = {}
    for src in code:
        exec(compile(src, "example.ipynb", "exec"), ns)  # noqa: S102 - the test runs the notebook
    assert ns["cp"]["contrib_ns"].sum() == 180.0
    assert ns["hot"].row(0)[1] == "sip0.cube0.hbm_ctrl.pe0"


def test_cli_sql_formats(run_dir, tmp_path, capsys):
    assert main(["sql", str(run_dir), "top_hotspots"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2].split()[:3] == ["1", "node", "sip0.cube0.hbm_ctrl.pe0"]
    assert out.rstrip().endswith("(2 rows)")
    assert main(["sql", str(run_dir), "SELECT step, op_id FROM critical_path ORDER BY step",
                 "--format", "csv"]) == 0
    assert capsys.readouterr().out == "step,op_id\n0,0\n1,1\n2,4\n3,6\n4,7\n5,8\n"
    assert main(["sql", str(run_dir), "SELECT 1 AS a", "-f", "md"]) == 0
    assert capsys.readouterr().out == "| a |\n|---|\n| 1 |\n"
    pq_out = tmp_path / "cp.parquet"
    assert main(["sql", str(run_dir), "critical_path_summary", "-f", "parquet", "-o", str(pq_out)]) == 0
    assert pl.read_parquet(pq_out)["contrib_ns"].sum() == 180.0
    assert main(["sql", str(run_dir), "no_such_query"]) == 2
    assert "no saved query 'no_such_query'" in capsys.readouterr().err


def test_sql_output_deterministic(run_dir, tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    for p in (a, b):
        assert main(["sql", str(run_dir), "SELECT * FROM utilisation ORDER BY resource_kind, "
                     "resource_idx", "-f", "parquet", "-o", str(p)]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_top_level_exports_are_functions(run_dir):
    for _ in range(2):   # the second lookup must not return a submodule
        assert callable(kbtrace.verify) and callable(kbtrace.diff) and callable(kbtrace.report)
        assert callable(kbtrace.open_run)
    assert kbtrace.diff(run_dir, run_dir).unchanged


def test_every_saved_query_runs(run_dir):
    from kbtrace.analysis.formats import resolve_query, saved_queries

    found = saved_queries()
    assert {"top_hotspots", "busiest_links", "stage_totals", "critical_path_summary",
            "pe_summary"} <= set(found)
    with kbtrace.open_run(run_dir) as run:
        for name in found:
            assert run.sql(resolve_query(name)).height > 0, name
            assert found[name].read_text().startswith(f"-- {name}:"), name


def test_materialize_keeps_results_and_names(run_dir):
    qs = ["SELECT * FROM utilisation ORDER BY resource_kind, resource_idx",
          "SELECT * FROM critical_path ORDER BY step",
          "SELECT * FROM stage_breakdown_pe ORDER BY sip, cube, pe, stage",
          "SELECT * FROM overlap ORDER BY sip, cube, pe"]
    with kbtrace.open_run(run_dir) as run:
        before = [run.sql(q) for q in qs]
        views = set(run.views())
        run.materialize()
        assert set(run.views()) == views
        for q, df in zip(qs, before, strict=True):
            assert run.sql(q).equals(df), q
        tables = {r[0] for r in run.con.sql("SELECT table_name FROM duckdb_tables()").fetchall()}
        assert {"_m_utilisation", "_m_utilisation_windows_20"} <= tables
        # the numpy twins' rows are files in the run's spill directory, not tables
        twinned = ("_pe_segments", "_busy_islands", "_crit_pred", "critical_path")
        assert not {f"_m_{v}" for v in twinned} & tables, tables
        for v in twinned:
            sql, = run.con.sql(f"SELECT sql FROM duckdb_views() WHERE view_name = '{v}'"
                               ).fetchall()[0]
            assert f"read_parquet('{run._spill_dir}/twin-{v}-" in sql, sql
        with pytest.raises(AnalysisError, match="not a view name"):
            run.materialize(("hops; DROP VIEW hops",))
        with pytest.raises(AnalysisError, match="materialising view 'nope' failed"):
            run.materialize(("nope",))
