"""report (tables, PNGs, HTML) and the Perfetto export on the synthetic run."""

from __future__ import annotations

import base64
import json

import polars as pl
import pytest

from kbtrace.analysis.perfetto import export_perfetto
from kbtrace.analysis.reporter import report
from kbtrace.analysis.synthetic import write_synthetic_run
from kbtrace.cli import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("rep"))


def test_report_writes_tables_pngs_and_self_contained_html(run_dir, tmp_path):
    out = report(run_dir, tmp_path / "r")
    for png in ("mesh_heatmap", "stage_breakdown", "timeline", "link_util", "util_windows",
                "roofline"):
        data = (out / f"{png}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    html = (out / "index.html").read_text()
    assert html.count("data:image/png;base64,") == 6 and "src=\"http" not in html
    first = html.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(first)[:4] == b"\x89PNG"
    totals = pl.read_csv(out / "tables" / "stage_totals.csv")
    assert dict(totals.select("stage", "time_ns").rows()) == {
        "dma_read": 80.0, "ipcq": 75.0, "gemm": 50.0, "dma_write": 25.0, "math": 25.0,
        "hbm_queue": 25.0, "fetch": 15.0, "idle": 5.0, "other": 0.0, "store": 0.0}
    summary = dict(pl.read_csv(out / "tables" / "summary.csv").rows())
    assert summary["makespan_ns"] == "180.000" and summary["critical_path_ns"] == "180.000"
    assert "| rank |" in (out / "tables" / "hotspots.md").read_text()


def test_report_tables_deterministic(run_dir, tmp_path):
    a, b = report(run_dir, tmp_path / "a"), report(run_dir, tmp_path / "b")
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 27   # 9 tables x (csv, md) + 6 PNGs + index.html + summary.md + marker
    for f in files:           # PNGs and the HTML page too: same run -> same bytes
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_perfetto_one_track_per_engine(run_dir, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["export", "perfetto", str(run_dir), "-o", str(out)]) == 0
    assert "open it in https://ui.perfetto.dev" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    procs = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    tracks = sorted(e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"
                    and e["pid"] == 1)
    assert "sip0.cube0" in procs
    assert tracks == ["pe0.dma", "pe0.gemm", "pe0.ipcq", "pe0.pe_cpu", "pe1.dma", "pe1.ipcq",
                      "pe1.math"]    # one per engine; no op overlaps on an engine here
    slices = [e for e in ev if e["ph"] == "X" and e["cat"] != "fabric"]
    assert len(slices) == 9
    store = next(e for e in slices if e["args"]["op_id"] == 8)
    # integer ns as exact decimal microsecond strings (Perfetto truncates float*1000)
    assert (store["ts"], store["dur"], store["name"]) == ("0.150", "0.030", "store/store")
    flows = [e for e in ev if e["ph"] in "stf"]
    ipcq = [e for e in flows if e["cat"] == "flow.ipcq"]
    assert ipcq[0]["ph"] == "s" and ipcq[-1]["ph"] == "f" and len({e["id"] for e in ipcq}) == 1
    assert all(sum(e["ph"] == "s" for e in flows if e["id"] == i) == 1 ==
               sum(e["ph"] == "f" for e in flows if e["id"] == i) for i in {e["id"] for e in flows})


def test_perfetto_lanes_for_overlapping_ops(run_dir, tmp_path):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from kbtrace._io import write_table

    d = write_synthetic_run(tmp_path / "ov")
    t = pq.read_table(d / "op_timing.parquet")
    eng = pc.if_else(pc.equal(t.column("op_id"), 1), "sip0.cube0.pe0.dma",
                     t.column("engine").cast("string"))
    t = t.set_column(t.schema.get_field_index("engine"), "engine",
                     eng.dictionary_encode().cast(t.schema.field("engine").type))
    write_table(d / "op_timing.parquet", t)   # composite [40,100] now overlaps load [45,85] on dma
    n = export_perfetto(d, tmp_path / "ov.json")
    ev = json.loads((tmp_path / "ov.json").read_text())["traceEvents"]
    assert n == len(ev)
    tracks = sorted(e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name")
    assert "pe0.dma [2]" in tracks and tracks.count("pe0.dma") == 1


def test_timeline_image_mixes_stage_colours_by_time_per_pixel():
    import numpy as np
    from matplotlib.colors import to_rgb

    from kbtrace.analysis.plots import STAGE_COLORS, timeline_image

    # PE (0,0,0): gemm [0, 50), dma_read [50, 75); PE (0,0,1): math [25, 100)
    seg = pl.DataFrame({"sip": [0, 0, 0], "cube": [0, 0, 0], "pe": [0, 0, 1],
                        "t0_ns": [0.0, 50.0, 25.0], "dur_ns": [50.0, 25.0, 75.0],
                        "stage": ["gemm", "dma_read", "math"]})
    img = timeline_image(seg, [(0, 0, 0), (0, 0, 1)], 100.0, width_px=8, band=(1, 2, 1))
    assert img.shape == (8, 8, 3)
    gemm, dma, math_ = (np.array(to_rgb(STAGE_COLORS[s])) for s in ("gemm", "dma_read", "math"))
    white = np.ones(3)
    pe0, pe1 = img[1], img[5]                      # first coloured row of each band
    assert (img[0] == 1).all() and (img[3] == 1).all() and (img[1] == img[2]).all()
    np.testing.assert_allclose(pe0[:4], np.tile(gemm, (4, 1)))    # 12.5 ns per pixel
    np.testing.assert_allclose(pe0[4:6], np.tile(dma, (2, 1)))
    np.testing.assert_allclose(pe0[6:], np.tile(white, (2, 1)))
    np.testing.assert_allclose(pe1[:2], np.tile(white, (2, 1)))
    np.testing.assert_allclose(pe1[2:], np.tile(math_, (6, 1)))
    # a piece shorter than a pixel is mixed in by its share of the pixel's time
    seg2 = pl.DataFrame({"sip": [0], "cube": [0], "pe": [0], "t0_ns": [10.0], "dur_ns": [5.0],
                         "stage": ["gemm"]})
    px = timeline_image(seg2, [(0, 0, 0)], 100.0, width_px=4, band=(0, 1, 0))[0]
    np.testing.assert_allclose(px[0], 0.2 * gemm + 0.8 * white)
    np.testing.assert_allclose(px[1:], np.tile(white, (3, 1)))
    # folded batch by batch (how the report streams pieces), the image is the same
    pes = [(0, 0, 0), (0, 0, 1)]
    whole = timeline_image(seg, pes, 100.0, width_px=8, band=(1, 2, 1))
    parts = timeline_image((seg.slice(i, 1) for i in range(seg.height)), pes, 100.0,
                           width_px=8, band=(1, 2, 1))
    np.testing.assert_allclose(parts, whole)


def test_timeline_frame_keeps_every_piece_of_the_first_pes(run_dir):
    from kbtrace.analysis import frames
    from kbtrace.analysis.run import open_run

    with open_run(run_dir) as r:
        every = r.sql("SELECT count(*) AS n FROM _pe_segments WHERE stage <> 'idle'")["n"][0]
        assert frames.pe_segments(r).height == every
        first = frames.pe_segments(r, max_pes=1)
        assert set(first.select("sip", "cube", "pe").rows()) == {(0, 0, 0)}
        assert first.height == r.sql("SELECT count(*) AS n FROM _pe_segments WHERE pe = 0 "
                                     "AND stage <> 'idle'")["n"][0]
        assert frames.n_pes(r) == 2 and frames.first_pes(r, 1) == [(0, 0, 0)]
        batches = list(frames.pe_segment_batches(r, batch_rows=3))
        assert [b.height for b in batches][:-1] == [3] * (len(batches) - 1)
        assert pl.concat(batches).equals(frames.pe_segments(r))
