"""The HBM pseudo-channel log (``--hbm-pcs``: ``hbm_pcs.parquet``) and its Perfetto tracks."""

from __future__ import annotations

import itertools
import json

import polars as pl
import pytest

from kbtrace import schema
from kbtrace.analysis.main import run_workload
from kbtrace.analysis.perfetto import export_perfetto
from kbtrace.replay import ReplayOptions, replay
from kbtrace.replay.hbm import HbmController, pc_table
from kbtrace.topology.params import HbmParams


def _ctrl(pcs: int = 4, burst: int = 64, bw: float = 8.0) -> HbmController:
    h = HbmController(7, HbmParams(pcs_per_pe=pcs, burst_bytes=burst, pc_bw_gbps=bw,
                                   efficiency=1.0, switch_penalty_ns=0.0))
    h.log = []
    return h


def test_pc_table_merges_an_ops_back_to_back_bursts_per_pc():
    h = _ctrl()
    # 512 B read at t=0 from PC 0: 8 bursts, 2 per PC, back to back (8 ns each at 8 GB/s)
    h.read(0, 512, 0.0, op_id=3)
    # a second op reads PC 1 only, arriving at 4 ns: queued behind op 3's two bursts
    h.commit(64, 64, 4.0, 0, op_id=5)
    t = pc_table([h]).to_pylist()
    assert [(r["pc"], r["op_id"], r["t_start_ns"], r["t_end_ns"], r["nbytes"]) for r in t] == [
        (0, 3, 0.0, 16.0, 128), (1, 3, 0.0, 16.0, 128), (1, 5, 16.0, 24.0, 64),
        (2, 3, 0.0, 16.0, 128), (3, 3, 0.0, 16.0, 128)]
    assert {r["node_idx"] for r in t} == {7} and not any(r["write"] for r in t)
    assert pc_table([h]).schema == schema.HBM_PCS


def test_pc_table_of_a_short_last_burst_and_of_nothing():
    h = _ctrl()
    h.read(64 * 3, 200, 10.0, op_id=1)      # bursts of 64, 64, 64, 8 B from PC 3 on
    rows = pc_table([h]).to_pylist()
    assert sorted((r["pc"], r["nbytes"], r["t_end_ns"]) for r in rows) == [
        (0, 64, 18.0), (1, 64, 18.0), (2, 8, 11.0), (3, 64, 18.0)]
    assert pc_table([_ctrl()]).num_rows == 0 and pc_table([]).schema == schema.HBM_PCS


@pytest.fixture(scope="module")
def gemm(tmp_path_factory):
    d = tmp_path_factory.mktemp("pcs")
    s = run_workload("gemm", topology="small", out=d / "data", verify_data=False,
                     make_report=False, attribute=False, hbm_pcs=True)
    return d, s


@pytest.mark.parametrize("fidelity", ["fast", "flit"])
def test_log_conserves_bytes_and_a_pc_serves_one_burst_at_a_time(gemm, fidelity, tmp_path):
    d, s = gemm
    trace = d / "data" / "traces" / "gemm-small"
    run = replay(trace, "topologies/small.yaml",
                 ReplayOptions(fidelity=fidelity, out_dir=str(tmp_path / "r"), hbm_pcs=True))
    pcs = pl.read_parquet(run.run_dir / "hbm_pcs.parquet")
    hops = pl.read_parquet(run.run_dir / "hops.parquet")
    ot = pl.read_parquet(run.run_dir / "op_timing.parquet")
    # every byte that reached or left an HBM controller went through one pseudo-channel
    assert pcs["nbytes"].sum() == hops.filter(pl.col("stage") == "hbm")["nbytes"].sum() > 0
    assert pcs["write"].any() and not pcs["write"].all()
    srt = pcs.sort("node_idx", "pc", "t_start_ns").with_columns(
        prev=pl.col("t_end_ns").shift(1).over("node_idx", "pc"))
    assert srt.filter(pl.col("t_start_ns") < pl.col("prev") - 1e-6).height == 0
    # each service lies inside its op's lifetime
    j = pcs.join(ot.select("op_id", "t_issue_ns", "t_end_ns"), on="op_id", suffix="_op")
    assert j.height == pcs.height
    assert j.filter((pl.col("t_start_ns") < pl.col("t_issue_ns") - 1e-6)
                    | (pl.col("t_end_ns") > pl.col("t_end_ns_op") + 1e-6)).height == 0
    assert pcs["pc"].max() < 8 and pcs["pc"].min() >= 0      # small.yaml: 8 PCs per PE


def test_the_log_changes_no_result_and_no_run_id(gemm, tmp_path):
    d, s = gemm
    trace = d / "data" / "traces" / "gemm-small"
    a = replay(trace, "topologies/small.yaml", ReplayOptions(out_dir=str(tmp_path / "a")))
    b = replay(trace, "topologies/small.yaml",
               ReplayOptions(out_dir=str(tmp_path / "b"), hbm_pcs=True))
    assert a.run_id == b.run_id and a.makespan_ns == b.makespan_ns
    for f in ("op_timing.parquet", "hops.parquet"):
        assert (a.run_dir / f).read_bytes() == (b.run_dir / f).read_bytes()
    assert not (a.run_dir / "hbm_pcs.parquet").exists()
    files = json.loads((b.run_dir / "run.json").read_text())["files"]
    assert "hbm_pcs.parquet" in files
    assert "hbm_pcs.parquet" not in json.loads((a.run_dir / "run.json").read_text())["files"]
    c = replay(trace, "topologies/small.yaml",
               ReplayOptions(out_dir=str(tmp_path / "c"), hbm_pcs=True))
    assert (c.run_dir / "hbm_pcs.parquet").read_bytes() == \
        (b.run_dir / "hbm_pcs.parquet").read_bytes()


def test_perfetto_draws_a_track_per_pseudo_channel(gemm, tmp_path):
    d, s = gemm
    out = tmp_path / "t.json"
    export_perfetto(s.run_dir, out)
    ev = json.loads(out.read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
             if e["ph"] == "M" and e["name"] == "thread_name"}
    pcs = pl.read_parquet(s.run_dir / "hbm_pcs.parquet")
    sl = [e for e in ev if e["ph"] == "X" and e["cat"] == "hbm_pc"]
    assert len(sl) == pcs.height
    tracks = {names[(e["pid"], e["tid"])] for e in sl}
    assert tracks == {f"hbm_ctrl.pe0 pc{p:02d}" for p in pcs["pc"].unique().to_list()}
    ot = pl.read_parquet(s.run_dir / "op_timing.parquet")
    label = {r["op_id"]: f"{r['kind']}/{r['name']}" for r in ot.iter_rows(named=True)}
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in sl:
        by_track.setdefault((e["pid"], e["tid"]), []).append(
            (float(e["ts"]), float(e["ts"]) + float(e["dur"])))
        assert e["name"] == label[e["args"]["op_id"]]        # the op it served
    for spans in by_track.values():     # one lane per PC: its slices never overlap
        spans.sort()
        assert all(b[0] >= a[1] - 1e-9 for a, b in itertools.pairwise(spans))


def test_perfetto_keeps_the_earliest_pseudo_channel_slices_under_the_cap(gemm, tmp_path,
                                                                         monkeypatch):
    from kbtrace.analysis import perfetto
    d, s = gemm
    monkeypatch.setattr(perfetto, "MAX_FABRIC_SLICES", 100)
    out = tmp_path / "cap.json"
    export_perfetto(s.run_dir, out)
    doc = json.loads(out.read_text())
    sl = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "hbm_pc"]
    pcs = pl.read_parquet(s.run_dir / "hbm_pcs.parquet")
    assert len(sl) == 100
    assert doc["otherData"]["pc_slices_left_out"] == pcs.height - 100
    kept = sorted(e["args"]["op_id"] for e in sl)
    first = pcs.sort("t_start_ns", "node_idx", "pc").head(100)
    assert kept == sorted(first["op_id"].to_list())
    assert max(float(e["ts"]) for e in sl) * 1000 <= first["t_start_ns"].max() + 0.5
