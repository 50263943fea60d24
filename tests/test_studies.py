"""kbtrace study: the framework (outputs, reference table, checks, calibration drift) on the
gemm study in quick mode, against its committed calibration record."""

from __future__ import annotations

import json

import polars as pl
import pytest

from kbtrace.cli import main
from kbtrace.studies.framework import Ref, calibration_drift, run_study


@pytest.fixture(scope="module")
def gemm_quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("study") / "gemm"
    return run_study("gemm", "topologies/small.yaml", quick=True, out=out)


def test_gemm_quick_outputs(gemm_quick):
    out = gemm_quick.out
    for f in ("gemm_stage_breakdown.png", "gemm_mac_utilization.png", "gemm_variants.png",
              "index.html", "study.json", "tables/reference.csv", "tables/points.md",
              "sweep/points.parquet", "sweep/sweep.json"):
        assert (out / f).is_file(), f
    pts = pl.read_parquet(out / "sweep" / "points.parquet")
    assert pts.height == 12 and set(pts["variant"]) == {"ref_ref", "load_ref", "load_load"}
    # body_ns: launch barrier to the last program's end (the kernel body), inside the makespan
    assert pts["body_ns"].is_not_null().all()
    assert ((pts["body_ns"] > 0) & (pts["body_ns"] < pts["makespan_ns"])).all()
    meta = json.loads((out / "study.json").read_text())
    assert meta["study"] == "gemm" and meta["quick"] is True and meta["topology"] == "small"
    html = (out / "index.html").read_text()
    assert html.count("data:image/png;base64") == 3 and "Reference vs kbtrace" in html


def test_gemm_reference_figure_and_checks(gemm_quick):
    refs = gemm_quick.refs_frame()
    r = refs.filter(pl.col("reference").is_not_null()).row(0, named=True)
    assert r["quantity"] == "32x3072x32 load_ref" and r["reference"] == 992.0
    # 48 GEMM tiles of 32x64x32 at 80 ns: GEMM-bound, ~4x the reference's DMA-bound window
    assert r["kbtrace"] == pytest.approx(3914.4)
    assert r["ratio"] == pytest.approx(3914.4 / 992.0) and r["note"]
    assert all(c.ok for c in gemm_quick.findings.checks)
    assert len(gemm_quick.findings.checks) == 6


def test_gemm_quick_matches_its_calibration_record(gemm_quick):
    d = gemm_quick.drift
    assert d is not None and d.height == 13 and d["ok"].all()
    assert gemm_quick.ok


def test_calibration_drift_flags_moved_and_missing_figures(gemm_quick):
    refs = list(gemm_quick.findings.refs)
    moved = Ref(refs[0].figure, refs[0].quantity, refs[0].unit, refs[0].reference,
                refs[0].measured * 1.05)
    d = calibration_drift("gemm", True, "small", [moved, *refs[2:]])
    bad = d.filter(~pl.col("ok"))
    assert bad.height == 2
    assert bad["why"].to_list() == ["", "missing from this run"]
    assert bad["drift"][0] == pytest.approx(0.05)
    assert calibration_drift("gemm", True, "default", refs) is None   # other topology


def test_unknown_study_is_a_usage_error(capsys):
    assert main(["study", "gemmm", "--quick"]) == 2
    assert "did you mean 'gemm'?" in capsys.readouterr().err


def test_gemm_study_is_deterministic(gemm_quick, tmp_path):
    again = run_study("gemm", "topologies/small.yaml", quick=True, out=tmp_path / "again")
    for f in ("study.json", "tables/points.csv", "tables/reference.csv", "tables/checks.csv",
              "sweep/points.parquet", "gemm_variants.png"):
        assert (again.out / f).read_bytes() == (gemm_quick.out / f).read_bytes(), f


def test_pe_dma_quick_on_default(tmp_path):
    res = run_study("pe_dma", "topologies/default.yaml", quick=True, out=tmp_path / "pe_dma")
    refs = {(r["figure"], r["quantity"]): r for r in res.refs_frame().to_dicts()}
    assert len(refs) == 19
    # within 10 % of the predecessor: a PE's own slice, the worst remote cube, across SIPs,
    # the hot slice with 1-3 and 8 writers, the SIP-wide local writes
    for q in ("same_cube_pe_local", "remote_cube_pe_remote_worst", "remote_sip", "ctrl_hot_1",
              "ctrl_hot_2", "ctrl_hot_3", "all_pe_cube0_to_pe0"):
        assert 0.9 <= refs[("latency", q)]["ratio"] <= 1.1, q
    assert refs[("latency", "same_cube_pe_local")]["kbtrace"] == pytest.approx(79.2)
    assert refs[("effective bandwidth", "sip_local_all")]["ratio"] == pytest.approx(
        26479.2 / 27200, rel=1e-4)
    # documented gaps: kbtrace spreads cube-to-cube writes over 4 UCIe lanes
    east = refs[("latency", "ucie_eastbound")]
    assert east["ratio"] < 0.9 and "4 UCIe lanes" in east["note"]
    assert refs[("effective bandwidth", "sip_hotspot_pe0")]["note"]
    assert all(c.ok for c in res.findings.checks) and res.ok
    assert res.drift is not None and res.drift["ok"].all()


def test_pe2pe_quick_known_deviation(tmp_path):
    res = run_study("pe2pe", "topologies/small.yaml", quick=True, out=tmp_path / "pe2pe")
    checks = {c.name: c for c in res.findings.checks}
    rule = checks["inter_h: IPCQ >= raw DMA at every size (reference rule)"]
    assert rule.ok is False and rule.expected is False and rule.as_expected
    assert "128 B 73.5/76.1" in rule.detail
    assert checks["inter_h: IPCQ >= raw DMA from 2048 B up"].ok
    assert res.ok and res.drift is not None and res.drift["ok"].all()
    table = (res.out / "tables" / "checks.md").read_text()
    assert "[~] KNOWN DEVIATION" in table


def test_gqa_quick_panels_verify_and_count(tmp_path):
    res = run_study("gqa", "topologies/small.yaml", quick=True, out=tmp_path / "gqa")
    df = pl.read_csv(res.out / "tables" / "panels.csv")
    assert df["panel"].to_list() == ["single_user_prefill", "multi_user_prefill",
                                     "single_user_decode", "multi_user_decode"]
    assert df["verified"].all()
    # decode: 2 GEMMs per rank per user (ADR-0056 D3); prefill: that for each ring step
    assert df["gemm"].to_list() == [128, 256, 16, 64]
    assert df["ipcq_send"].to_list() == [112, 192, 21, 72]
    refs = res.refs_frame().filter(pl.col("reference").is_not_null())
    assert refs["ratio"].to_list() == [1.0, 1.0]
    assert all(c.ok for c in res.findings.checks)
    assert res.drift is not None and res.drift["ok"].all()


def test_allreduce_quick_on_six_sips(tmp_path):
    res = run_study("allreduce", "topologies/default.yaml", quick=True,
                    out=tmp_path / "allreduce")
    refs = {(r["figure"], r["quantity"]): r for r in res.refs_frame().to_dicts()}
    t96 = refs[("latency", "torus_2d 96 KB/PE, centre root")]
    assert t96["reference"] == 17.2 and t96["kbtrace"] == pytest.approx(24.92, abs=0.01)
    assert "PE_MATH" in t96["note"]          # the gap is explained
    bk = [refs[("latency", f"buffer {k}, 64 KB/PE, torus")]["kbtrace"]
          for k in ("tcm", "hbm", "sram")]
    assert bk[0] < bk[1] < bk[2]             # the reference's order
    lat = pl.read_csv(res.out / "tables" / "latency.csv")
    assert sorted(set(lat["fabric"])) == ["mesh_2d", "ring_1d", "torus_2d"]
    # 6 SIPs were captured, not replayed from a 2-SIP trace: the fabrics differ
    at = dict(lat.filter(pl.col("n_elem") == 49152).select("fabric", "body_ns").iter_rows())
    assert at["torus_2d"] < at["mesh_2d"] < at["ring_1d"]
    assert (res.out / "allreduce_topology.png").is_file()
    assert all(c.ok for c in res.findings.checks) and res.ok
    assert res.drift is not None and res.drift["ok"].all()
