"""kbtrace report over many runs: a sweep (points.parquet) or a directory of run directories."""

from __future__ import annotations

import polars as pl
import pytest

from kbtrace import schema
from kbtrace.analysis.reporter import report
from kbtrace.analysis.run import open_run
from kbtrace.analysis.sweepreport import is_run_set, point_frames, stage_shares_frame
from kbtrace.capture import capture
from kbtrace.cli import main
from kbtrace.replay.sweep import run_sweep
from kbtrace.topology import compile_topology
from test_replay_util import TOPO_DIR

ROOT = TOPO_DIR.parent
SMALL = str(TOPO_DIR / "small.yaml")
BW = "cube.hbm.pc_bw_gbps"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep_report")
    small = compile_topology(SMALL)
    traces = []
    for name, params in (("gemm", {"M": 128, "N": 128, "K": 128}), ("softmax", {"R": 64})):
        capture(ROOT / "capture" / f"{name}.py", small, params, d / name)
        traces.append(str(d / name))
    res = run_sweep({"traces": traces, "topologies": [SMALL], "grid": {BW: [0, 4, 16, 64]}},
                    d / "sweep")
    assert not res.ok      # bandwidth 0 is refused: two failed points
    return d / "sweep"


def test_points_table_per_point_with_headline_and_speedup_within_a_workload(sweep):
    points, stages, params = point_frames(sweep)
    assert params == [BW]
    assert points.columns[:10] == ["point", "workload", "trace", "topology", "fidelity", BW,
                                   "status", "makespan_ns", "speedup", "top_stage"]
    assert points["workload"].to_list() == points["trace"].to_list()   # no workload grid
    assert points.select("point", "trace", BW, "status").rows() == [
        (0, "gemm", 0, "error"), (1, "gemm", 4, "ok"), (2, "gemm", 16, "ok"), (3, "gemm", 64, "ok"),
        (4, "softmax", 0, "error"), (5, "softmax", 4, "ok"), (6, "softmax", 16, "ok"),
        (7, "softmax", 64, "ok")]
    failed = points.filter(pl.col("status") == "error")
    assert failed["makespan_ns"].is_null().all() and failed["top_stage"].is_null().all()
    assert all("bandwidth must be > 0" in e for e in failed["error"].to_list())
    for trace in ("gemm", "softmax"):   # slowest point of each trace = 1x; more bandwidth, faster
        ok = points.filter((pl.col("trace") == trace) & (pl.col("status") == "ok")).sort(BW)
        assert ok["speedup"][0] == 1.0
        assert ok["makespan_ns"].is_sorted(descending=True)
        ms = ok["makespan_ns"].to_list()
        assert ok["speedup"].to_list() == pytest.approx([ms[0] / m for m in ms])
    gemm4 = points.row(1, named=True)
    # at 4 GB/s per pseudo-channel the PEs mostly wait for HBM: its own stage, not dma_read
    assert gemm4["top_stage"] == "hbm_queue" and gemm4["crit_kind"] == "load"
    assert gemm4["hot_spot"].endswith("hbm_ctrl.pe0") and 0.9 < gemm4["hot_spot_share"] <= 1.0
    # stage shares of each ok point add up to 1; failed points have none
    sums = stages.group_by("point").agg(pl.col("share").sum()).sort("point")
    assert sums["point"].to_list() == [1, 2, 3, 5, 6, 7]
    assert sums["share"].to_list() == pytest.approx([1.0] * 6)
    wide = stage_shares_frame(stages)      # the page's view: a row per point, schema order
    assert wide.columns == ["point", *schema.BREAKDOWN_STAGES, "idle"]
    assert wide["point"].to_list() == [1, 2, 3, 5, 6, 7]
    assert wide.row(0, named=True)["hbm_queue"] == stages.filter(
        (pl.col("point") == 1) & (pl.col("stage") == "hbm_queue"))["share"][0]


def test_report_of_a_sweep_is_self_contained_and_deterministic(sweep, tmp_path, capsys):
    a_point = pl.read_parquet(sweep / "points.parquet")["run_dir"][1]
    assert is_run_set(sweep) and not is_run_set(sweep / a_point)
    assert main(["report", str(sweep), "-o", str(tmp_path / "a")]) == 0
    assert capsys.readouterr().out.strip() == f"report: {tmp_path / 'a' / 'index.html'}"
    report(sweep, tmp_path / "b")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert [f.as_posix() for f in files] == [
        ".kbtrace", "index.html", "summary.md", "sweep_makespan.png", "sweep_stages.png", "tables/points.csv",
        "tables/points.md", "tables/stage_shares.csv", "tables/stage_shares.md", "tables/stages.csv",
        "tables/stages.md"]
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    html = (tmp_path / "a" / "index.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "8 point(s), 2 failed" in html
    with open_run(sweep) as r:          # an open run set gets the same report
        report(r, tmp_path / "c")
    assert (tmp_path / "c" / "index.html").read_bytes() == (tmp_path / "a" / "index.html").read_bytes()


def test_report_of_a_directory_of_runs(tmp_path):
    data = tmp_path / "data"
    for wl in ("gemm", "softmax"):
        assert main(["run", wl, "--out", str(data), "--no-report", "--no-verify"]) == 0
    out = report(data / "runs")
    points = pl.read_csv(out / "tables" / "points.csv")
    assert points.select("point", "trace", "run_dir").rows() == [
        (0, "gemm", "gemm-small-fast"), (1, "softmax", "softmax-small-fast")]
    assert points["speedup"].to_list() == [1.0, 1.0]     # each alone in its trace
    assert (out / "sweep_makespan.png").read_bytes()[:4] == b"\x89PNG"


def test_report_of_a_sweep_whose_points_all_failed(sweep, tmp_path):
    trace = sweep.parent / "softmax"        # captured by the fixture
    run_sweep({"traces": [str(trace)], "topologies": [SMALL], "grid": {BW: [0, -1]}},
              tmp_path / "s")
    out = report(tmp_path / "s")
    points = pl.read_csv(out / "tables" / "points.csv")
    assert points["status"].to_list() == ["error", "error"]
    assert points["makespan_ns"].is_null().all() and points["speedup"].is_null().all()
    assert (out / "tables" / "stages.csv").read_text().strip() == "point,stage,time_ns,share"
    assert (out / "tables" / "stage_shares.csv").read_text().strip() == "point"
    assert "2 point(s), 2 failed" in (out / "index.html").read_text()
