"""End to end over real captures and replays of every capture/ workload (small topology, fast)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kbtrace._io import write_table
from kbtrace.analysis.baseline import baseline_root, check_baselines, workloads
from kbtrace.analysis.differ import diff
from kbtrace.analysis.main import capture_and_replay
from kbtrace.analysis.run import open_run, read_run_json
from kbtrace.analysis.verifier import verify
from kbtrace.cli import main
from test_replay_util import copy_run, rehash

REPO = Path(__file__).resolve().parents[1]
SMALL = REPO / "topologies" / "small.yaml"
WORKLOADS = [p.stem for p in workloads()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    out = {}
    for name in WORKLOADS:
        capture_and_replay(REPO / "capture" / f"{name}.py", SMALL, [], "fast",
                           root / name / "trace", root / name / "run")
        out[name] = root / name / "run"
    return out


def test_workloads_present():
    assert {"gemm", "ring_allreduce"} <= set(WORKLOADS)


@pytest.mark.parametrize("name", WORKLOADS)
def test_verify_passes_and_invariants_hold(runs, name):
    res = verify(runs[name])
    assert res.ok, res.text()
    assert res.order_violations == []
    with open_run(runs[name]) as r:
        lo, hi = r.sql("SELECT min(util), max(util) FROM utilisation").row(0)
        assert lo >= 0.0 and hi <= 1.0
        assert r.sql("SELECT max(util) FROM utilisation_windows").item() <= 1.0
        assert r.sql("SELECT max(util) FROM utilisation_engine").item() <= 1.0
        gap = r.sql("SELECT max(abs(s - sp)) FROM (SELECT sip, cube, pe, sum(time_ns) AS s, "
                    "any_value(span_ns) AS sp FROM stage_breakdown_pe GROUP BY ALL)").item()
        assert gap < 1e-6
        cp = r.sql("SELECT sum(contrib_ns) FROM critical_path").item()
        assert cp == pytest.approx(r.info["makespan_ns"], rel=1e-12, abs=1e-6)
        assert r.sql("SELECT count(*) FROM critical_path WHERE contrib_ns < 0").item() == 0


def test_verify_catches_corrupted_input(runs, tmp_path, capsys):
    run = copy_run(runs["gemm"], tmp_path / "g")
    mem = pq.read_table(run.parent / "trace" / "memory.parquet")
    rows = mem.to_pylist()
    i = next(k for k, r in enumerate(rows) if r["role"] == "input")
    data = bytearray(rows[i]["data"])
    val = np.frombuffer(bytes(data[:4]), dtype="<f4")[0] + np.float32(1.5)
    data[:4] = np.float32(val).tobytes()
    col = mem.column("data").to_pylist()
    col[i] = bytes(data)
    mem = mem.set_column(mem.schema.get_field_index("data"), mem.schema.field("data"),
                         pa.array(col, type=mem.schema.field("data").type))
    write_table(run.parent / "trace" / "memory.parquet", mem)
    rehash(run.parent / "trace" / "trace.json", "content_hash", "memory.parquet")
    from kbtrace._io import trace_hash  # the run follows its (crafted) trace
    info = json.loads((run / "run.json").read_text())
    info["trace"]["hash"] = trace_hash(json.loads((run.parent / "trace" / "trace.json")
                                                  .read_text()), run.parent / "trace")
    (run / "run.json").write_text(json.dumps(info))
    assert main(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("verify: FAIL")
    res = verify(run)
    div = res.first_divergence
    assert div is not None and div.kind == "load" and div.src_line is not None
    assert f"first diverging op: op {div.op_id} load/" in out
    assert any(not t.ok for t in res.tensors)


def test_verify_catches_swapped_dependent_ops(runs, tmp_path):
    run = copy_run(runs["gemm"], tmp_path / "g")
    ops = pq.read_table(run.parent / "trace" / "ops.parquet")
    dot = next(r for r in ops.select(["op_id", "kind", "deps"]).to_pylist()
               if r["kind"] == "dot" and r["deps"])
    a, b = dot["deps"][0], dot["op_id"]
    t = pq.read_table(run / "op_timing.parquet")
    ids = t.column("op_id").to_pylist()
    cols = {}
    for c in ("t_issue_ns", "t_start_ns", "t_end_ns"):
        v = t.column(c).to_pylist()
        v[ids.index(a)], v[ids.index(b)] = v[ids.index(b)], v[ids.index(a)]
        cols[c] = v
    for c, v in cols.items():
        t = t.set_column(t.schema.get_field_index(c), t.schema.field(c), pa.array(v, pa.float64()))
    write_table(run / "op_timing.parquet", t)
    rehash(run / "run.json", "files", "op_timing.parquet")
    res = verify(run)
    assert not res.ok
    assert (b, a) in res.order_violations
    assert res.first_divergence is not None


def test_diff_self_and_halved_hbm_bandwidth(runs, tmp_path, capsys):
    from kbtrace.replay import ReplayOptions, replay
    from kbtrace.topology import compile_topology

    base = runs["gemm"]
    assert main(["diff", str(base), str(base), "--fail-on", "makespan>2%"]) == 0
    assert "verdict: no change" in capsys.readouterr().out
    topo = compile_topology(SMALL)
    slow = compile_topology(SMALL, overrides={
        "cube.hbm.pc_bw_gbps": topo.params.cube.hbm.pc_bw_gbps / 2})
    replay(base.parent / "trace", slow, ReplayOptions(out_dir=str(tmp_path / "slow")))
    rc = main(["diff", str(base), str(tmp_path / "slow"), "--fail-on", "makespan>2%"])
    out = capsys.readouterr().out
    res = diff(base, tmp_path / "slow")
    assert res.metrics["makespan"].pct > 2.0, out
    assert rc == 1 and "REGRESSION: makespan changed by +" in out


def test_committed_baselines_match(runs):
    assert (baseline_root() / "gemm" / "summary.json").is_file()
    for name, res in check_baselines(WORKLOADS, fail_on=["makespan>2%", "ops.added>0",
                                                         "ops.removed>0"]):
        assert not res.failed, f"{name}: {res.render('text')}"


def test_kbtrace_run_main_job(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)     # defaults resolve against the repo root
    assert main(["run", "--out", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kbtrace run: gemm on small (fast)")
    assert "verify    PASS" in out and "bottleneck" in out
    assert "\n  roofline  " in out and "GFLOP/s on 32 PE(s)" in out and "memory-bound" in out
    run_dir = tmp_path / "data" / "runs" / "gemm-small-fast"
    assert (run_dir / "report" / "index.html").is_file()
    assert (run_dir / "report" / "timeline.perfetto.json").is_file()
    assert main(["sql", str(run_dir), "top_hotspots", "-f", "csv"]) == 0
    assert capsys.readouterr().out.startswith("rank,resource_kind,resource_id")


def test_kbtrace_run_with_topology_overrides(tmp_path, capsys):
    data = tmp_path / "data"
    base = ["run", "gemm", "-p", "M=128", "-p", "N=128", "--out", str(data), "--no-report"]
    assert main(base) == 0
    capsys.readouterr()
    assert main([*base, "--set", "cube.hbm.pc_bw_gbps=16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kbtrace run: gemm-M_128-N_128 on small-cube.hbm.pc_bw_gbps_16 (fast)")
    assert "verify    PASS" in out
    runs = data / "runs"
    plain = read_run_json(runs / "gemm-M_128-N_128-small-fast")
    slow = read_run_json(runs / "gemm-M_128-N_128-small-cube.hbm.pc_bw_gbps_16-fast")
    assert slow["makespan_ns"] > 1.5 * plain["makespan_ns"]     # loads are HBM-bound
    assert slow["topology"]["hash"] != plain["topology"]["hash"]
    # each run keeps the trace placed for its topology and overrides
    assert sorted(p.name for p in (data / "traces").iterdir()) == [
        "gemm-M_128-N_128-small", "gemm-M_128-N_128-small-cube.hbm.pc_bw_gbps_16"]
    assert slow["trace"]["path"].endswith("gemm-M_128-N_128-small-cube.hbm.pc_bw_gbps_16")
    assert main([*base, "--set", "cube.hbm.nonsense=1"]) == 2
    assert "unknown key 'nonsense'" in capsys.readouterr().err


def test_same_run_gives_identical_analysis_outputs(runs, tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    for p in (a, b):
        assert main(["sql", str(runs["ring_allreduce"]), "SELECT * FROM critical_path ORDER BY step",
                     "-f", "parquet", "-o", str(p)]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_ring_allreduce_critical_path_crosses_pes_via_ipcq(runs):
    with open_run(runs["ring_allreduce"]) as r:
        edges = dict(r.sql("SELECT edge, count(*) FROM critical_path GROUP BY edge").rows())
        assert edges.get("ipcq", 0) >= 2
        n_pes = r.sql("SELECT count(DISTINCT (sip, cube, pe)) FROM critical_path "
                      "WHERE op_id IS NOT NULL").item()
        assert n_pes >= 3
        # every ipcq step is a recv released by its matching send
        bad = r.sql("SELECT count(*) FROM critical_path c JOIN ops o USING (op_id) "
                    "WHERE c.edge = 'ipcq' AND (o.kind <> 'recv' OR o.match_op_id <> c.pred_op_id)")
        assert bad.item() == 0


def test_roofline_counts_gemm_flops_and_hbm_bytes_against_the_recorded_peaks(runs):
    from kbtrace.analysis.frames import roofline, roofline_total
    from kbtrace.topology import compile_topology

    peaks = compile_topology(SMALL).peaks()
    assert peaks == {"gemm_gflops_per_pe": 2048.0, "math_gops_per_pe": 64.0,
                     "hbm_gbps_per_pe": 256.0, "pes": 32.0}      # 2*32*32*1 GHz; 8 PCs x 32 GB/s
    with open_run(runs["gemm"]) as r:
        assert r.info["peaks"] == peaks
        roof = roofline(r)
        assert roof["flops"].sum() == 2 * 256 * 256 * 128          # the default gemm: 2*M*N*K
        moved = int(r.sql("SELECT sum(nbytes) FROM ops WHERE kind IN ('load', 'store')").item())
        assert roof["hbm_bytes"].sum() == moved                   # every load / store is HBM
        row = roof.row(0, named=True)
        assert row["intensity"] == pytest.approx(row["flops"] / row["hbm_bytes"])
        assert row["roof_gflops"] == pytest.approx(min(2048.0, row["intensity"] * 256.0))
        assert row["attainment"] == pytest.approx(row["flops"] / row["span_ns"] / row["roof_gflops"])
        assert row["bound"] == ("memory" if row["intensity"] < 8.0 else "compute")
        tot = roofline_total(r)
        assert tot["n_gemm_pes"] == roof.height
        assert tot["gflops"] == pytest.approx(roof["flops"].sum() / r.makespan_ns)
        assert tot["peak_gflops"] == 2048.0 * roof.height and tot["ridge"] == 8.0
        assert tot["intensity"] == pytest.approx(2 * 256 * 256 * 128 / moved)
    with open_run(runs["softmax"]) as r:                         # no GEMM work
        assert roofline(r).height == 0 and roofline_total(r)["gflops"] is None


def test_a_run_finds_its_trace_from_any_directory(tmp_path, monkeypatch, capsys):
    """``kbtrace run`` / ``replay`` with relative paths (the default ``data/``) record the
    trace's absolute path, so verify and report work from another directory later; ``kbtrace
    run --progress`` shows the replay's status line."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["run", "gemm", "-p", "M=64", "-p", "N=64", "-p", "K=64", "--no-report",
                 "--out", "data", "--progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("replay: 20/20 ops (100%), t = ")      # --progress
    run_dir = next((work / "data" / "runs").iterdir())
    recorded = read_run_json(run_dir)["trace"]["path"]
    assert Path(recorded).is_absolute() and (Path(recorded) / "ops.parquet").is_file()
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert verify(run_dir).ok
    assert main(["verify", str(run_dir)]) == 0
    assert open_run(run_dir).trace_dir == Path(recorded)
    # the whole tree moved (a copied data/ directory): found relative to the run directory
    moved = tmp_path / "moved"
    work.rename(moved)
    run_dir = moved / run_dir.relative_to(work)
    assert not Path(recorded).exists() and verify(run_dir).ok
    assert open_run(run_dir).trace_dir == moved / Path(recorded).relative_to(work)
    capsys.readouterr()
    assert main(["sql", str(run_dir), "SELECT count(*) AS n FROM ops"]) == 0
    assert "was not found" not in capsys.readouterr().err
    # a trace that cannot be found at all: sql / report say so (its ops view is empty)
    shutil.rmtree(moved / Path(recorded).relative_to(work))
    assert main(["sql", str(run_dir), "SELECT count(*) AS n FROM ops"]) == 0
    err = capsys.readouterr().err
    assert f"kbtrace: note: {run_dir}: its trace ({recorded}) was not found" in err


def test_parallel_materialisation_gives_the_single_threaded_rows(tmp_path, monkeypatch):
    """The views ``materialize`` computes on every core hold exactly the rows of a
    single-threaded evaluation (the run has two hop row groups, so DuckDB splits the scan)."""
    from kbtrace.analysis.run import PARALLEL_SAFE
    capture_and_replay(REPO / "capture" / "gemm.py", SMALL,
                       {"M": 832, "N": 832}, "fast", tmp_path / "t", tmp_path / "r")
    assert pq.ParquetFile(tmp_path / "r" / "hops.parquet").num_row_groups >= 2
    single = open_run(tmp_path / "r")
    want = {v: single.con.execute(f"SELECT * FROM {v} ORDER BY ALL").fetchall()
            for v in sorted(PARALLEL_SAFE)}
    run = open_run(tmp_path / "r")
    run.materialize()
    for v, rows in want.items():
        assert len(rows) > 0
        assert run.con.execute(f"SELECT * FROM {v}").fetchall() == rows, v
    assert run.con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
    # a one-core machine sorts them too, so float sums over them add in the same order
    import kbtrace.analysis.run as R
    monkeypatch.setattr(R.os, "cpu_count", lambda: 1)
    one = open_run(tmp_path / "r")
    one.materialize()
    for v, rows in want.items():
        assert one.con.execute(f"SELECT * FROM {v}").fetchall() == rows, v
    q = "SELECT * FROM stage_breakdown_pe ORDER BY ALL"
    assert one.con.execute(q).fetchall() == run.con.execute(q).fetchall()
