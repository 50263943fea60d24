"""The report's plots as a reader sees them: both directions of a link visible in the heat
map, hotter on top; readable type; nothing cut off; one time unit (ns) as in the tables."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from kbtrace import schema
from kbtrace.analysis import plots
from kbtrace.analysis.reporter import report
from kbtrace.analysis.synthetic import write_synthetic_run


def _links(rows):
    return pl.DataFrame(rows, schema=["sip", "cube", "x0", "y0", "x1", "y1", "util"],
                        orient="row")


def test_link_segments_put_the_two_directions_side_by_side_hotter_last():
    lk = _links([(0, 0, 0.0, 0.0, 1.0, 0.0, 0.81),     # A -> B, hot
                 (0, 0, 1.0, 0.0, 0.0, 0.0, 0.0),      # B -> A, cold (drawn on top before)
                 (0, 0, 0.0, 0.0, 0.0, 2.0, 0.3)])     # A -> C, going +y
    segs, util = plots.link_segments(lk, 0.1)
    assert util.tolist() == [0.0, 0.3, 0.81]           # hottest drawn last (on top)
    # right of travel: A->B (+x) moves to -y, B->A (-x) to +y, A->C (+y) to +x
    assert segs[2].tolist() == [[0.0, -0.1], [1.0, -0.1]]
    assert segs[0].tolist() == [[1.0, 0.1], [0.0, 0.1]]
    assert segs[1].tolist() == [[0.1, 0.0], [0.1, 2.0]]


def _pixels_near(png, rgb, tol=0.06):
    with Image.open(png) as im:
        img = np.asarray(im.convert("RGB"), dtype=float) / 255.0
    return int((np.abs(img - np.array(rgb)).max(axis=2) < tol).sum())


def test_mesh_heatmap_shows_a_hot_link_whose_cold_reverse_comes_later(tmp_path):
    """gemm M=256 on small hid 21 of 744 segments, 0.81-utilised UCIe links among them: the
    reverse direction (utilisation 0, later in link order) was painted over the hot one."""
    nodes = pl.DataFrame({"sip": [0, 0], "cube": [0, 0], "node_id": ["a", "b"],
                          "kind": ["router", "router"], "x_mm": [0.0, 4.0], "y_mm": [0.0, 0.0],
                          "util": [0.0, 0.0]})
    lk = _links([(0, 0, 0.0, 0.0, 4.0, 0.0, 0.81), (0, 0, 4.0, 0.0, 0.0, 0.0, 0.0)])
    png = plots.plot_mesh_heatmap(nodes, lk, tmp_path / "m.png")
    hot = plt.get_cmap("inferno_r")(0.81)[:3]
    cold = plt.get_cmap("inferno_r")(0.0)[:3]
    n_hot, n_cold = _pixels_near(png, hot), _pixels_near(png, cold)
    assert n_hot > 200 and n_cold > 200, (n_hot, n_cold)   # both directions visible
    # the colour bar holds a few of each; the link holds most of them
    bar = plots.plot_mesh_heatmap(nodes, lk.with_columns(pl.lit(0.5).alias("util")),
                                  tmp_path / "bar.png")
    assert n_hot > 3 * max(1, _pixels_near(bar, hot))


def test_stage_colours_cover_the_breakdown_stages_of_the_schema():
    assert list(plots.STAGE_COLORS) != []
    assert set(plots.STAGE_COLORS) == {*schema.BREAKDOWN_STAGES, "idle"}


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    """Every figure of a run report and of the sweep plots, as saved by ``plots._save``:
    (name, figure, PNG size in px)."""
    seen = []
    real = plots._save

    def spy(fig, path, relayout=True):
        out = real(fig, path, relayout)
        with Image.open(out) as im:
            seen.append((out.name, fig, im.size))
        return out

    d = tmp_path_factory.mktemp("figs")
    mp = pytest.MonkeyPatch()
    mp.setattr(plots, "_save", spy)
    try:
        report(write_synthetic_run(d / "run"), d / "r")
        pts = pl.DataFrame({"point": [0, 1, 2], "status": ["ok"] * 3, "bw": [4, 16, 64],
                            "makespan_ns": [9000.0, 4000.0, 2500.0],
                            "run_dir": ["p0", "p1", "p2"]})
        plots.plot_sweep_makespan(pts, ["bw"], d / "sm.png")
        plots.plot_sweep_makespan(pts, [], d / "sm0.png")
        plots.plot_sweep_stages(pl.DataFrame({"point": [0, 0, 1], "stage": ["gemm", "hbm_queue",
                                                                             "gemm"],
                                              "share": [0.4, 0.6, 1.0]}), d / "ss.png")
    finally:
        mp.undo()
    return seen


def _texts(fig):
    """The texts a figure draws: tick labels of the ticks inside the view (matplotlib keeps
    label objects for ticks it does not draw) and every other visible text."""
    ticks = {id(lb) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
             for t in axis.get_major_ticks() + axis.get_minor_ticks() for lb in (t.label1, t.label2)}
    drawn = [lb for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
             for t in axis._update_ticks() for lb in (t.label1, t.label2)]
    return [t for t in [*drawn, *(t for t in fig.findobj(plt.Text) if id(t) not in ticks)]
            if t.get_visible() and t.get_text().strip()]


def test_every_plot_is_saved_and_type_is_readable(figures):
    names = {n for n, _, _ in figures}
    assert names == {"mesh_heatmap.png", "stage_breakdown.png", "timeline.png", "link_util.png",
                     "util_windows.png", "roofline.png", "sm.png", "sm0.png", "ss.png"}
    for name, fig, _ in figures:
        small = [(t.get_text(), t.get_fontsize()) for t in _texts(fig)
                 if t.get_fontsize() < plots.MIN_FONT_PT]
        assert not small, f"{name}: text under {plots.MIN_FONT_PT} pt: {small[:5]}"


def test_no_text_is_cut_off(figures):
    """link_util.png cut its first (longest) label at the left edge: every PNG is the drawn
    content's bounding box (plus the pad), so each text lies inside it."""
    for name, fig, (w, h) in figures:
        r = FigureCanvasAgg(fig).get_renderer()          # closed by _save: a canvas again
        box = fig.get_tightbbox(r)                        # inches
        assert (w, h) == pytest.approx((round((box.width + 0.24) * plots.DPI),
                                        round((box.height + 0.24) * plots.DPI)), abs=2), name
        full = box.transformed(fig.dpi_scale_trans)
        for t in _texts(fig):
            e = t.get_window_extent(r)
            assert full.x0 - 1 <= e.x0 and e.x1 <= full.x1 + 1, (name, t.get_text())
            assert full.y0 - 1 <= e.y0 and e.y1 <= full.y1 + 1, (name, t.get_text())


def test_one_time_unit_ns_as_in_the_tables(figures):
    time_axes = 0
    for name, fig, _ in figures:
        for ax in fig.axes:
            for label in (ax.get_xlabel(), ax.get_ylabel()):
                assert not any(u in label for u in ("(us)", "µs", "(ms)", "(s)")), (name, label)
                if label.startswith(("time", "makespan")):
                    assert label.endswith("(ns)"), (name, label)
                    time_axes += 1
    assert time_axes >= 5   # stage bars, timeline, util windows, two sweep makespans


def test_plots_leave_the_callers_matplotlib_settings_alone(tmp_path):
    before = plt.rcParams["font.size"]
    plots.plot_link_util(pl.DataFrame({"resource_id": ["a->b"], "util": [0.5]}),
                         tmp_path / "l.png")
    assert plt.rcParams["font.size"] == before



def test_roofline_legend_lies_clear_of_the_roof_and_points(tmp_path):
    """gemm M=256 on small: the legend sat across the roof line in the upper left."""
    seen = []
    real = plots._save

    def spy(fig, path, relayout=True):
        seen.append(fig)
        return real(fig, path, relayout)

    roof = pl.DataFrame({"intensity": [7.11] * 4, "gflops": [72.6, 69.9, 67.0, 65.4],
                         "peak_gflops": [2048.0] * 4, "peak_hbm_gbps": [256.0] * 4})
    mp = pytest.MonkeyPatch()
    mp.setattr(plots, "_save", spy)
    try:
        plots.plot_roofline(roof, tmp_path / "roof.png")
    finally:
        mp.undo()
    fig = seen[0]
    r = FigureCanvasAgg(fig).get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(r)
    assert not legend.overlaps(ax.get_window_extent(r))
    assert [t.get_text() for t in ax.get_legend().get_texts()][1] == "4 PE(s)"


def test_empty_roofline_shows_no_meaningless_scale(figures):
    """The synthetic run has no GEMM work with HBM traffic: a note, not a 0..1 log-less scale."""
    fig = next(f for n, f, _ in figures if n == "roofline.png")
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [] and list(ax.get_yticks()) == []
    assert any("no GEMM work" in t.get_text() for t in ax.texts)


MAX_PX = round((plots.MAX_W_IN + 0.24) * plots.DPI)      # the widest PNG (crop pad included)


def test_no_plot_is_wider_than_the_page(figures):
    for name, _, (w, _h) in figures:
        assert w <= MAX_PX, (name, w)


def test_many_cubes_panels_and_bars_wrap_instead_of_widening(tmp_path):
    """default.yaml (2 SIPs x 16 cubes) drew a 2,253 px heat map, shown at 55% on the page
    (its 9 pt type at ~7 px); 4 sweep parameters a 1,840 px row; 64 PEs a 1,600 px bar chart."""
    from PIL import Image

    nodes = pl.DataFrame([(s, c, f"n{s}.{c}.{i}", "router", float(i % 3), float(i // 3), 0.1)
                          for s in range(2) for c in range(16) for i in range(9)],
                         schema=["sip", "cube", "node_id", "kind", "x_mm", "y_mm", "util"],
                         orient="row")
    links = _links([(s, c, 0.0, 0.0, 1.0, 0.0, 0.5) for s in range(2) for c in range(16)])
    where, rows, cols = plots._cube_grid(sorted({(s, c) for s in range(2) for c in range(16)}))
    assert (rows, cols) == (8, 4) and where[(1, 0)] == (4, 0) and where[(0, 5)] == (1, 1)
    assert plots._cube_grid([(0, c) for c in range(4)])[1:] == (2, 2)
    assert plots._cube_grid([(s, c) for s in range(2) for c in range(4)])[1:] == (2, 4)
    pts = pl.DataFrame({"point": range(16), "status": ["ok"] * 16,
                        **{k: [i >> b & 1 for i in range(16)] for b, k in enumerate("abcd")},
                        "makespan_ns": [1000.0 + i for i in range(16)],
                        "run_dir": [f"p{i}" for i in range(16)]})
    wide = pl.DataFrame({"pe_label": [f"sip0.cube{i // 8}.pe{i % 8}" for i in range(64)],
                         "gemm": [100.0] * 64, "dma_read": [50.0] * 64})
    for png in (plots.plot_mesh_heatmap(nodes, links, tmp_path / "m.png"),
                plots.plot_sweep_makespan(pts, list("abcd"), tmp_path / "s.png"),
                plots.plot_stage_bars(wide, tmp_path / "b.png"),
                plots.plot_sweep_stages(pl.DataFrame({"point": range(300), "stage": ["gemm"] * 300,
                                                      "share": [1.0] * 300}), tmp_path / "t.png")):
        with Image.open(png) as im:
            assert im.size[0] <= MAX_PX, (png.name, im.size)
