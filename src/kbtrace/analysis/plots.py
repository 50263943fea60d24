"""Matplotlib (Agg) plots of analysis frames. Each function takes frames, writes one PNG.

Conventions of every plot (the report page shows the PNGs at or near their natural size):

* **Units**: times are in ns, in the plots as in the tables (``*_ns`` columns), with
  thousands separators on the axis (``_ns_axis``); utilisation is a fraction in [0, 1].
* **Type**: ``_RC`` (10 pt text, 9 pt ticks and legends at 100 dpi: 12 px and more on the
  page); nothing smaller.
* **Layout**: every PNG is cropped to what was drawn (``bbox_inches="tight"``), so no label
  is cut off, legends outside the axes included; none is wider than ``MAX_W_IN`` (the page),
  so the page never shows it shrunk: many cubes or panels wrap into rows, many bars thin
  out their labels.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar, cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.collections import LineCollection, PolyCollection  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
)

F = TypeVar("F", bound=Callable[..., Path])

__all__ = ["STAGE_COLORS", "plot_mesh_heatmap", "plot_stage_bars", "plot_timeline",
           "timeline_image", "plot_link_util", "plot_roofline", "plot_util_windows",
           "plot_sweep_makespan", "plot_tornado",
           "plot_sweep_stages"]

#: Colour of each exclusive stage (``schema.BREAKDOWN_STAGES`` and idle), in stacking order.
STAGE_COLORS = {
    "hbm_queue": "#8c564b", "dma_read": "#1f77b4", "fetch": "#17becf", "gemm": "#d62728", "math": "#ff7f0e",
    "store": "#bcbd22", "dma_write": "#2ca02c", "ipcq": "#9467bd", "other": "#7f7f7f",
    "idle": "#e5e5e5",
}
_PNG_META = {"Software": None}
DPI = 100
#: Matplotlib settings of every plot (``_styled``); sizes in points (1 pt = DPI / 72 px).
_RC: dict[str, Any] = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "figure.titlesize": 11,
       "xtick.labelsize": 9, "ytick.labelsize": 9, "legend.fontsize": 9,
       "legend.title_fontsize": 9, "figure.dpi": DPI, "savefig.dpi": DPI}
MIN_FONT_PT = 9.0      # the smallest text of any plot (tests/test_report_plots.py checks it)
#: The widest figure, inches: about the report page's content width at a 1280 px window, so
#: a PNG is never shown shrunk (and its type with it). Wide content wraps into rows instead.
MAX_W_IN = 12.4


def _styled(fn: F) -> F:
    """Run a plot function under ``_RC`` (a context: the caller's matplotlib settings are
    left as they were)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Path:
        with plt.rc_context(_RC):  # type: ignore[arg-type]  # (keys typed as literals)
            return fn(*args, **kwargs)
    return cast(F, wrapper)


def _ns_axis(axis: Any, what: str) -> None:
    """Label ``axis`` as ``what (ns)`` with thousands separators on its ticks."""
    axis.set_label_text(f"{what} (ns)")
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))


def _num(v: float) -> str:
    """A tick value as matplotlib's own formatter writes it (a true minus sign)."""
    return f"{v:g}".replace("-", "\N{MINUS SIGN}")


def _f(v: Any) -> float:
    """A polars scalar (``Series.min()`` and the like: typed as any Python value) as float."""
    return float(v)


def _save(fig: plt.Figure, path: str | os.PathLike[str], relayout: bool = True) -> Path:
    """Write ``fig`` as PNG atomically, cropped to the drawn content (no label cut off);
    ``relayout``: ``tight_layout`` first (panels and labels do not overlap)."""
    from kbtrace._io import atomic_path

    if relayout:
        fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, metadata=_PNG_META, bbox_inches="tight",
                    pad_inches=0.12)
    plt.close(fig)
    return Path(path)


def _cube_grid(cubes: list[tuple[int, int]], max_cols: int = 4
               ) -> tuple[dict[tuple[int, int], tuple[int, int]], int, int]:
    """Panel (row, column) of each (sip, cube): a SIP's cubes in a near-square grid of at most
    ``max_cols`` columns (row-major from the top left); SIPs side by side while they fit in
    ``max_cols`` columns together, else one below the other; plus the grid's rows and columns."""
    per_sip: dict[int, list[int]] = {}
    for sip, cube in cubes:
        per_sip.setdefault(sip, []).append(cube)
    shape = {sip: min(max_cols, max(1, math.ceil(math.sqrt(len(cs)))))
             for sip, cs in per_sip.items()}
    side = sum(shape.values()) <= max_cols
    out, row0, col0, rows, cols = {}, 0, 0, 1, 1
    for sip in sorted(per_sip):
        cs, w = per_sip[sip], shape[sip]
        for i, cube in enumerate(cs):
            out[(sip, cube)] = (row0 + i // w, col0 + i % w)
        h = math.ceil(len(cs) / w)
        rows, cols = max(rows, row0 + h), max(cols, col0 + w)
        if side:
            col0 += w
        else:
            row0 += h
    return out, rows, cols


def link_segments(links: pl.DataFrame, offset: float) -> tuple[np.ndarray, np.ndarray]:
    """Drawing segments ``(n, 2, 2)`` and utilisations of directed links (columns x0, y0, x1,
    y1, util): each segment moved ``offset`` (data units) to the right of its direction, so
    the two directions of a link lie side by side, never on top of each other; sorted by
    utilisation (stable), so where segments still cross, the hotter one is drawn last (on
    top)."""
    order = np.argsort(links["util"].to_numpy(), kind="stable")
    x0, y0, x1, y1, util = (links[c].to_numpy().astype(float)[order]
                            for c in ("x0", "y0", "x1", "y1", "util"))
    dx, dy = x1 - x0, y1 - y0
    n = np.hypot(dx, dy)
    n[n == 0] = 1.0
    ox, oy = dy / n * offset, -dx / n * offset           # right-hand normal
    segs = np.stack([np.stack([x0 + ox, y0 + oy], axis=1),
                     np.stack([x1 + ox, y1 + oy], axis=1)], axis=1)
    return segs, util


_LINK_LW = 2.2     # points: link segment width in the heat map (each direction its own line)


@_styled
def plot_mesh_heatmap(nodes: pl.DataFrame, links: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Utilisation of nodes (dots) and intra-cube links (segments) of every cube, one framed
    panel per cube (a SIP's cubes in a grid, SIPs side by side; positions in mm within the
    cube, ticks on the outer edges). Each direction of a link is its own segment, offset to
    the right of its direction (``link_segments``), hotter segments on top.

    All panels are drawn in one axes, each cube moved to its slot: 32 axes (default.yaml)
    spent most of the plot's time laying out hundreds of tick labels and titles."""
    cubes = [tuple(r) for r in nodes.select("sip", "cube").unique().sort("sip", "cube").rows()]
    cmap = plt.get_cmap("inferno_r")
    norm = plt.Normalize(0, 1)
    if nodes.height:
        x_lo, x_hi = _f(nodes["x_mm"].min()), _f(nodes["x_mm"].max())
        y_lo, y_hi = _f(nodes["y_mm"].min()), _f(nodes["y_mm"].max())
    else:
        x_lo = y_lo = 0.0
        x_hi = y_hi = 1.0
    span_x, span_y = max(x_hi - x_lo, 1e-9), max(y_hi - y_lo, 1e-9)
    pad = 0.06 * max(span_x, span_y)
    where, rows, cols = _cube_grid(cubes)
    # a fixed layout, inches: margins for the axis labels, the two-line title and the colour
    # bar, gaps for the panel titles; the panels have the data's aspect, so they fill their slots
    left, right, top, bottom, gap_w, gap_h = 0.75, 1.15, 0.8, 0.55, 0.2, 0.42
    panel_w = min(4.0, (MAX_W_IN - left - right - gap_w * (cols - 1)) / cols)
    mm = panel_w / (span_x + 2 * pad)                  # inches per mm
    panel_h = mm * (span_y + 2 * pad)
    fig_w = left + panel_w * cols + gap_w * (cols - 1) + right
    fig_h = top + panel_h * rows + gap_h * (rows - 1) + bottom
    step_x, step_y = span_x + 2 * pad + gap_w / mm, span_y + 2 * pad + gap_h / mm   # slot pitch, mm
    fig = plt.figure(figsize=(fig_w, fig_h))
    ax = fig.add_axes((left / fig_w, bottom / fig_h, (fig_w - left - right) / fig_w,
                       (fig_h - top - bottom) / fig_h))
    ax.set_xlim(x_lo - pad, x_lo - pad + step_x * cols - gap_w / mm)
    ax.set_ylim(y_lo - pad + step_y * rows - gap_h / mm, y_lo - pad)   # y grows downwards
    ax.set_aspect("equal")
    for side in ax.spines.values():
        side.set_visible(False)
    x_ticks = np.asarray(MaxNLocator(nbins=6).tick_values(x_lo - pad, x_hi + pad))
    y_ticks = np.asarray(MaxNLocator(nbins=6).tick_values(y_lo - pad, y_hi + pad))
    x_ticks = x_ticks[(x_ticks >= x_lo - pad) & (x_ticks <= x_hi + pad)]
    y_ticks = y_ticks[(y_ticks >= y_lo - pad) & (y_ticks <= y_hi + pad)]
    ax.set_xticks(np.concatenate([x_ticks + c * step_x for c in range(cols)]),
                  [_num(v) for _ in range(cols) for v in x_ticks])
    ax.set_yticks(np.concatenate([y_ticks + r * step_y for r in range(rows)]),
                  [_num(v) for _ in range(rows) for v in y_ticks])
    ax.set_xlabel("x in the cube (mm)")
    ax.set_ylabel("y in the cube (mm)")
    boxes, titles = [], []
    for (sip, cube), (r, c) in where.items():
        x0, y0 = x_lo - pad + c * step_x, y_lo - pad + r * step_y
        x1, y1 = x0 + span_x + 2 * pad, y0 + span_y + 2 * pad
        boxes.append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
        titles.append((x0 + (span_x + 2 * pad) / 2, y0, f"sip{sip}.cube{cube}"))
    ax.add_collection(PolyCollection(boxes, facecolors="none", edgecolors="k",
                                     linewidths=0.8, clip_on=False, zorder=2.5))
    for x, y, label in titles:       # above the frame: 4 pt of air, as an axes title has
        ax.annotate(label, (x, y), xytext=(0, 4), textcoords="offset points", ha="center",
                    va="bottom", fontsize=_RC["axes.titlesize"])
    body_h = fig_h - top - bottom
    cax = fig.add_axes(((fig_w - right + 0.25) / fig_w, (bottom + 0.1 * body_h) / fig_h,
                        0.18 / fig_w, 0.8 * body_h / fig_h))
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), cax=cax,
                 label="utilisation (busy fraction of makespan)")
    fig.suptitle("Utilisation over the cube mesh: nodes (dots) and intra-cube links\n"
                 "(each direction of a link drawn right of its travel, hotter on top)",
                 y=1 - 0.08 / fig_h, va="top")
    pt = 1.0 / 72.0 / mm                              # 1 pt in mm (data units)
    seg_parts, seg_util, dots, dot_util = [], [], [], []
    by_cube_links = links.partition_by(["sip", "cube"], as_dict=True) if links.height else {}
    by_cube_nodes = nodes.partition_by(["sip", "cube"], as_dict=True) if nodes.height else {}
    for (sip, cube), (r, c) in where.items():
        shift = np.array([c * step_x, r * step_y])
        lk = by_cube_links.get((sip, cube))
        if lk is not None and lk.height:
            segs, util = link_segments(lk, 0.55 * _LINK_LW * pt)
            seg_parts.append(segs + shift)
            seg_util.append(util)
        nd = by_cube_nodes.get((sip, cube))
        if nd is not None and nd.height:
            dots.append(np.stack([nd["x_mm"].to_numpy(), nd["y_mm"].to_numpy()], axis=1)
                        + shift)
            dot_util.append(nd["util"].to_numpy())
    if seg_parts:
        segs, util = np.concatenate(seg_parts), np.concatenate(seg_util)
        order = np.argsort(util, kind="stable")     # hotter on top across cubes too
        lc = LineCollection(list(segs[order]), cmap=cmap, norm=norm, linewidths=_LINK_LW,
                            capstyle="butt")
        lc.set_array(util[order])
        ax.add_collection(lc)
    if dots:
        xy = np.concatenate(dots)
        ax.scatter(xy[:, 0], xy[:, 1], c=np.concatenate(dot_util), cmap=cmap, norm=norm,
                   s=14, edgecolors="k", linewidths=0.3, zorder=3)
    return _save(fig, path, relayout=False)    # the offsets assume the drawn layout


def _bar_labels(ax: plt.Axes, labels: list[str], rotation: int = 90) -> None:
    """One x tick label per bar while each gets the room of its text (14 px turned on its
    side, 8 px a character level), else every k-th."""
    # the axes' width as laid out: what a draw would give, without one
    width_px = ax.get_position().width * ax.figure.bbox.width
    need = 14 if rotation else 8 * max((len(t) for t in labels), default=1) + 6
    step = max(1, math.ceil(len(labels) * need / max(width_px, 1.0)))
    ax.set_xticks(range(0, len(labels), step), labels[::step], rotation=rotation)


def _stacked_bars(ax: plt.Axes, stacks: dict[str, np.ndarray]) -> tuple[list, list[str]]:
    """Stacked bars at x = 0..n-1, one ``PolyCollection`` per stage (in ``STAGE_COLORS``
    order; far faster than a patch per bar); returns legend handles and labels."""
    n = len(next(iter(stacks.values()))) if stacks else 0
    x = np.arange(n, dtype=float)
    bottom = np.zeros(n)
    handles, labels = [], []
    for stage, color in STAGE_COLORS.items():
        if stage not in stacks:
            continue
        top = bottom + stacks[stage]
        x0, x1 = x - 0.425, x + 0.425
        verts = np.stack([np.stack(c, axis=1) for c in
                          ((x0, bottom), (x1, bottom), (x1, top), (x0, top))], axis=1)
        ax.add_collection(PolyCollection(list(verts), facecolors=color, edgecolors="none"))
        handles.append(plt.Rectangle((0, 0), 1, 1, color=color))
        labels.append(stage)
        bottom = top
    ax.set_xlim(-0.6, max(n, 1) - 0.4)
    ax.set_ylim(0, float(bottom.max()) * 1.05 if n and bottom.max() > 0 else 1.0)
    return handles, labels


@_styled
def plot_stage_bars(wide: pl.DataFrame, path: str | os.PathLike[str], max_pes: int = 64) -> Path:
    """Stacked exclusive stage time per PE (adds up to each PE's busy span); the first
    ``max_pes`` PEs."""
    df = wide.head(max_pes)
    fig, ax = plt.subplots(figsize=(min(MAX_W_IN, max(6, 0.22 * df.height + 2)), 4))
    handles, labels = _stacked_bars(ax, {st: df[st].fill_null(0).to_numpy().astype(float)
                                         for st in STAGE_COLORS if st in df.columns})
    _bar_labels(ax, df["pe_label"].to_list())
    _ns_axis(ax.yaxis, "time")
    more = f", first {df.height} of {wide.height} PEs" if wide.height > df.height else ""
    ax.set_title(f"Stage breakdown per PE (exclusive time{more})")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


@_styled
def plot_sweep_makespan(points: pl.DataFrame, params: list[str], path: str | os.PathLike[str],
                        groups: tuple[str, ...] = (), max_panels: int = 4,
                        max_lines: int = 10) -> Path:
    """Makespan of a sweep's points: one panel per grid parameter in ``params`` (x = its
    values, log2 when they span >= 8x; one line per combination of the other parameters and
    the ``groups`` columns, e.g. trace), or one bar per point when there are no parameters.
    Log y when makespans span >= 20x. Failed points are left out."""
    ok = points.filter(pl.col("status") == "ok")
    ms = ok["makespan_ns"]
    log_y = ok.height > 0 and _f(ms.min()) > 0 and _f(ms.max()) / _f(ms.min()) >= 20
    if not params:
        fig, ax = plt.subplots(figsize=(min(MAX_W_IN, max(6.0, 0.3 * ok.height + 2)), 4))
        ax.bar(range(ok.height), ms.to_list(), color="#1f77b4")
        _bar_labels(ax, ok["run_dir"].to_list())
        _ns_axis(ax.yaxis, "makespan")
        if log_y:
            ax.set_yscale("log")
        ax.set_title("Makespan per run")
        return _save(fig, path)
    panels = params[:max_panels]
    ncol = min(2, len(panels))          # two panels a row: the page's width
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.4 * ncol + 0.8, 4.2 * nrow), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, dim in zip(axes.flat, panels, strict=False):
        others = [d for d in (*groups, *params) if d != dim]
        have = ok.filter(pl.col(dim).is_not_null())   # workload keys: null for other traces
        numeric = have[dim].dtype.is_numeric()
        cats = sorted({str(v) for v in have[dim].to_list()})
        lines = have.group_by(others, maintain_order=True) if others else [((), have)]
        n = 0
        for key, g in lines:
            g = g.sort(dim)
            x = g[dim].to_list() if numeric else [cats.index(str(v)) for v in g[dim].to_list()]
            label = ", ".join(f"{d}={v}" for d, v in zip(others, key, strict=True)) or None
            ax.plot(x, g["makespan_ns"].to_list(), marker="o", markersize=3,
                    linewidth=1.2, label=label if n < max_lines else None)
            n += 1
        vals = sorted(set(have[dim].to_list())) if numeric else []
        if numeric and vals and vals[0] > 0 and vals[-1] / vals[0] >= 8:
            ax.set_xscale("log", base=2)
            ax.set_xticks(vals, [f"{v:g}" for v in vals])
            ax.minorticks_off()
        elif not numeric:
            ax.set_xticks(range(len(cats)), cats, rotation=30)
        ax.set_xlabel(dim)
        _ns_axis(ax.yaxis, "makespan")
        if log_y:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        if others and n:
            outside = ({"loc": "upper center", "bbox_to_anchor": (0.5, -0.2), "ncol": 2}
                       if n > 3 else {})      # many lines: below the panel
            ax.legend(title=None if n <= max_lines else f"first {max_lines} of {n}",
                      **outside)
    more = f" (first {max_panels} of {len(params)} grid parameters)" if len(params) > max_panels else ""
    fig.suptitle(f"Makespan over the sweep{more}")
    return _save(fig, path)


@_styled
def plot_sweep_stages(stages: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Stacked share of PE busy time per exclusive stage, one bar per point."""
    pts = sorted(set(stages["point"].to_list())) if stages.height else []
    idx = {p: i for i, p in enumerate(pts)}
    stacks: dict[str, np.ndarray] = {}
    for point, stage, share in stages.select("point", "stage", "share").iter_rows():
        stacks.setdefault(stage, np.zeros(len(pts)))[idx[point]] = share or 0.0
    fig, ax = plt.subplots(figsize=(min(MAX_W_IN - 1.8, max(6.0, 0.25 * len(pts) + 2.5)), 3.8))
    handles, labels = _stacked_bars(ax, stacks) if stacks else ([], [])
    _bar_labels(ax, [str(p) for p in pts], rotation=0)
    ax.set_xlabel("point")
    ax.set_ylabel("share of PE busy time")
    ax.set_title("Exclusive stage mix per point")
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def _coverage(t0: np.ndarray, t1: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time each pixel ``[edges[k], edges[k+1])`` spends inside the sorted, disjoint intervals
    ``[t0, t1)``: differences of the covered time before each edge."""
    cum = np.concatenate(([0.0], np.cumsum(t1 - t0)))
    i = np.searchsorted(t1, edges, side="right")          # intervals ended by each edge
    inside = np.zeros(len(edges))
    part = i < len(t0)
    j = i[part]
    inside[part] = np.clip(edges[part] - t0[j], 0.0, t1[j] - t0[j])
    return np.diff(cum[i] + inside)


def timeline_image(seg: pl.DataFrame | Iterable[pl.DataFrame], pes: list[tuple[int, int, int]],
                   t_end_ns: float, width_px: int = 1200,
                   band: tuple[int, int, int] = (1, 8, 1)) -> np.ndarray:
    """RGB image of the per-PE timeline: one band of rows per PE in ``pes`` (``band`` = blank,
    coloured, blank pixel rows), ``width_px`` columns over ``[0, t_end_ns]``. A pixel's colour is
    the time-weighted mix of the stage colours over its time slice (white where idle), so every
    piece is drawn, however short, and the image is exact at its resolution. ``seg``: the
    pieces (``frames.pe_segments``), or batches of them (``frames.pe_segment_batches``: folded
    one at a time, so memory does not grow with the run); pieces of PEs not in ``pes`` are
    ignored."""
    pad0, body, pad1 = band
    rows_per = pad0 + body + pad1
    img = np.ones((max(1, len(pes)) * rows_per, width_px, 3))
    if not len(pes) or t_end_ns <= 0:
        return img
    edges = np.linspace(0.0, t_end_ns, width_px + 1)
    px = t_end_ns / width_px
    row_of = {p: r for r, p in enumerate(pes)}
    mix = np.zeros((len(pes), width_px, 3))      # time-weighted colour per PE and pixel
    busy = np.zeros((len(pes), width_px))        # busy fraction per PE and pixel
    rgb: dict[str, np.ndarray] = {}
    for batch in ([seg] if isinstance(seg, pl.DataFrame) else seg):
        keyed = batch.with_columns(pl.col("stage").cast(pl.Utf8)).partition_by(
            ["sip", "cube", "pe", "stage"], as_dict=True, maintain_order=True)
        for (sip, cube, pe, stage), part in keyed.items():
            r = row_of.get((sip, cube, pe))
            if r is None:
                continue
            t0 = part["t0_ns"].to_numpy()
            t1 = t0 + part["dur_ns"].to_numpy()
            order = np.argsort(t0, kind="stable")
            frac = _coverage(t0[order], t1[order], edges) / px
            c = rgb.get(stage)
            if c is None:
                c = rgb[stage] = np.array(matplotlib.colors.to_rgb(STAGE_COLORS.get(stage,
                                                                                    "#444444")))
            mix[r] += frac[:, None] * c
            busy[r] += frac
    line = np.clip(mix + np.clip(1.0 - busy, 0.0, 1.0)[:, :, None], 0.0, 1.0)
    for r in range(len(pes)):
        img[r * rows_per + pad0:r * rows_per + pad0 + body] = line[r]
    return img


@_styled
def plot_timeline(seg: pl.DataFrame | Iterable[pl.DataFrame], path: str | os.PathLike[str],
                  max_pes: int = 64, n_pes: int | None = None, t_end_ns: float | None = None,
                  pes: list[tuple[int, int, int]] | None = None) -> Path:
    """Per-PE timeline: exclusive stage of every instant (idle left blank), drawn as one image
    (``timeline_image``) over ``[0, t_end_ns]``. ``pes``: the PEs to draw (default: the first
    ``max_pes`` of ``seg``, which must then be a frame; batches need both ``pes`` and
    ``t_end_ns``); ``n_pes``: how many PEs the run has (the title says when only some are shown)."""
    if pes is None or t_end_ns is None:
        if not isinstance(seg, pl.DataFrame):
            raise ValueError("plot_timeline: pass pes and t_end_ns with batches of pieces")
        if pes is None:
            pes = seg.select("sip", "cube", "pe").unique().sort("sip", "cube", "pe").head(
                max_pes).rows()
        if t_end_ns is None:
            t_end_ns = _f((seg["t0_ns"] + seg["dur_ns"]).max() or 0.0) if seg.height else 0.0
    img = timeline_image(seg, pes, t_end_ns)
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.22 * len(pes) + 1.2)))
    ax.imshow(img, aspect="auto", interpolation="antialiased",
              extent=(0.0, max(t_end_ns, 1.0), max(1, len(pes)) - 0.5, -0.5))
    ax.set_yticks(range(len(pes)), [f"s{a}.c{b}.pe{c}" for a, b, c in pes])
    _ns_axis(ax.xaxis, "time")
    shown = len(pes)
    total = n_pes if n_pes is not None else shown
    more = f", first {shown} of {total} PEs" if total > shown else ""
    ax.set_title(f"Per-PE timeline (exclusive stage{more})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for s, c in STAGE_COLORS.items() if s != "idle"]
    ax.legend(handles, [s for s in STAGE_COLORS if s != "idle"], ncol=8,
              loc="upper center", bbox_to_anchor=(0.5, 0.0), borderaxespad=6.0)
    return _save(fig, path)


@_styled
def plot_link_util(links: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Horizontal bars: the most utilised links."""
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.25 * links.height + 1)))
    labels = [r.replace("sip", "s").replace(".cube", ".c") for r in links["resource_id"].to_list()]
    ax.barh(range(links.height), links["util"].to_list(), color="#1f77b4")
    ax.set_yticks(range(links.height), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("utilisation (busy fraction of makespan)")
    ax.set_title("Most utilised links")
    return _save(fig, path)


@_styled
def plot_tornado(attr: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Tornado chart of ``kbtrace attribute`` (``schema.ATTRIBUTION`` rows, in rank order):
    per resource class, the makespan change in percent with it ``factor`` x faster (left,
    green) and slower (right, red)."""
    fig, ax = plt.subplots(figsize=(7.5, max(2.5, 0.32 * attr.height + 1.2)))
    y = np.arange(attr.height)
    f = float(attr["factor"][0]) if attr.height else 2.0
    ax.barh(y, [-g for g in attr["faster_gain_pct"].to_list()], color="#2ca02c",
            label=f"{f:g}x faster")
    slow = attr["slower_loss_pct"].to_list()
    if any(v is not None for v in slow):
        ax.barh(y, [v or 0.0 for v in slow], color="#d62728", label=f"{f:g}x slower")
    ax.axvline(0, color="k", linewidth=0.8)
    ax.set_yticks(y, attr["resource"].to_list())
    ax.invert_yaxis()
    ax.set_xlabel("makespan change (% of the recorded run)")
    ax.set_title("What would help most: each resource class made faster / slower")
    ax.legend(loc="lower right")
    return _save(fig, path)


@_styled
def plot_roofline(roof: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Roofline of one PE (log-log: arithmetic intensity vs GFLOP/s) with every PE that did
    GEMM work and moved HBM bytes as a point (a PE without HBM traffic has no finite
    intensity: the legend counts those apart); the roofs are the run's per-PE GEMM and HBM
    peaks."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ok = roof.filter(pl.col("intensity").is_not_null() & (pl.col("gflops") > 0))
    no_hbm = roof.filter(pl.col("intensity").is_null() & (pl.col("gflops") > 0)).height
    pg = roof["peak_gflops"].drop_nulls()
    pb = roof["peak_hbm_gbps"].drop_nulls()
    if ok.height and pg.len() and pb.len():
        peak, bw = float(pg[0]), float(pb[0])
        ai = ok["intensity"].to_numpy()
        lo = min(float(ai.min()), peak / bw) / 4
        hi = max(float(ai.max()), peak / bw) * 4
        xs = np.geomspace(lo, hi, 200)
        ax.plot(xs, np.minimum(peak, xs * bw), color="k", linewidth=1.2,
                label=f"roof: {peak:,.0f} GFLOP/s, {bw:,.0f} GB/s per PE")
        ax.axvline(peak / bw, color="#999999", linestyle=":", linewidth=0.8)
        ax.scatter(ai, ok["gflops"].to_numpy(), s=14, color="#d62728", zorder=3,
                   label=f"{ok.height} PE(s)" + (f" (+{no_hbm} without HBM traffic, not shown)"
                                                  if no_hbm else ""))
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        # below the axes: inside, it lay across the roof (gemm M=256 on small)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    else:
        ax.text(0.5, 0.5, "no GEMM work with HBM traffic in this run (or no recorded peaks)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])      # no scale to show
        ax.set_yticks([])
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("GFLOP/s (over the PE's busy span)")
    ax.set_title("Roofline per PE (GEMM work)")
    return _save(fig, path)


@_styled
def plot_util_windows(df: pl.DataFrame, makespan_ns: float, path: str | os.PathLike[str]) -> Path:
    """Heat map: busiest resources (rows) x equal time windows (columns), utilisation colour."""
    names = df["resource_id"].unique(maintain_order=True).to_list()
    n_win = int(_f(df["win"].max() or 0)) + 1 if df.height else 1
    grid = np.zeros((max(1, len(names)), n_win))
    index = {n: i for i, n in enumerate(names)}
    for rid, win, _, util in df.iter_rows():
        grid[index[rid], win] = util
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.22 * len(names) + 1.2)))
    im = ax.imshow(grid, aspect="auto", cmap="inferno_r", vmin=0, vmax=1, interpolation="nearest",
                   extent=(0, makespan_ns, len(names) - 0.5, -0.5))
    ax.set_yticks(range(len(names)), [n.replace("sip", "s").replace(".cube", ".c") for n in names])
    _ns_axis(ax.xaxis, "time")
    ax.set_title("Utilisation over time (busiest resources)")
    fig.colorbar(im, ax=ax, label="utilisation in window")
    return _save(fig, path)
