"""Matplotlib (Agg) plots of analysis frames. Each function takes frames, writes one PNG."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.collections import LineCollection, PolyCollection  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

__all__ = ["STAGE_COLORS", "plot_mesh_heatmap", "plot_stage_bars", "plot_timeline",
           "timeline_image", "plot_link_util", "plot_roofline", "plot_util_windows",
           "plot_sweep_makespan", "plot_tornado",
           "plot_sweep_stages"]

STAGE_COLORS = {
    "dma_read": "#1f77b4", "fetch": "#17becf", "gemm": "#d62728", "math": "#ff7f0e",
    "store": "#bcbd22", "dma_write": "#2ca02c", "ipcq": "#9467bd", "other": "#7f7f7f",
    "idle": "#e5e5e5",
}
_PNG_META = {"Software": None}


def _f(v: Any) -> float:
    """A polars scalar (``Series.min()`` and the like: typed as any Python value) as float."""
    return float(v)


def _save(fig: plt.Figure, path: str | os.PathLike[str], tight: bool = False) -> Path:
    """Write ``fig`` as PNG atomically (``tight``: cropped to the drawn content)."""
    from kbtrace._io import atomic_path

    crop: dict[str, Any] = {"bbox_inches": "tight", "pad_inches": 0.15} if tight else {}
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=90, metadata=_PNG_META, **crop)
    plt.close(fig)
    return Path(path)


def _cube_offsets(cubes: list[tuple[int, int]], w: float, h: float) -> dict[tuple[int, int], tuple[float, float]]:
    """Drawing offset of each (sip, cube) tile: a SIP's cubes in a near-square grid (row-major
    from the top left), SIPs side by side; ``w`` / ``h``: tile pitch."""
    per_sip: dict[int, list[int]] = {}
    for sip, cube in cubes:
        per_sip.setdefault(sip, []).append(cube)
    out = {}
    x0 = 0.0
    for sip in sorted(per_sip):
        cs = per_sip[sip]
        cols = max(1, math.ceil(math.sqrt(len(cs))))
        for i, cube in enumerate(cs):
            out[(sip, cube)] = (x0 + (i % cols) * w, -(i // cols) * h)
        x0 += cols * w + 0.35 * w
    return out


def plot_mesh_heatmap(nodes: pl.DataFrame, links: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Utilisation of nodes (dots) and intra-cube links (segments) of every cube, drawn as tiles
    of one plot (a SIP's cubes in a grid, SIPs side by side; positions in mm within each cube)."""
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
    pitch_x, pitch_y = span_x * 1.15, span_y * 1.3
    off = _cube_offsets(cubes, pitch_x, pitch_y)
    tiles_x = (max(o[0] for o in off.values()) / pitch_x + 1) if off else 1
    tiles_y = (-min(o[1] for o in off.values()) / pitch_y + 1) if off else 1
    fig_w = min(18.0, max(7.0, (3.0 if tiles_x <= 3 else 1.9) * tiles_x + 1.6))
    fig, ax = plt.subplots(figsize=(fig_w, max(3.0, 0.75 * fig_w * tiles_y * pitch_y
                                                   / (tiles_x * pitch_x) + 1.0)))

    def shifted(df: pl.DataFrame, xs: list[str], ys: list[str]) -> list[np.ndarray]:
        o = [off[(a, b)] for a, b in df.select("sip", "cube").rows()]
        dx = np.array([v[0] for v in o]) - x_lo
        dy = np.array([v[1] for v in o]) - y_lo
        return ([df[c].to_numpy() + dx for c in xs] + [df[c].to_numpy() + dy for c in ys])

    if links.height:
        x0, x1, y0, y1 = shifted(links, ["x0", "x1"], ["y0", "y1"])
        segs = np.stack([np.stack([x0, y0], axis=1), np.stack([x1, y1], axis=1)], axis=1)
        lc = LineCollection(list(segs), cmap=cmap, norm=norm, linewidths=1.6)
        lc.set_array(links["util"].to_numpy())
        ax.add_collection(lc)
    if nodes.height:
        x, y = shifted(nodes, ["x_mm"], ["y_mm"])
        ax.scatter(x, y, c=nodes["util"].to_numpy(), cmap=cmap, norm=norm, s=10,
                   edgecolors="k", linewidths=0.25, zorder=3)
    frames = []
    for (sip, cube), (ox, oy) in off.items():
        bx, by = ox - 0.05 * span_x, oy - 0.05 * span_y
        bw, bh = span_x * 1.1, span_y * 1.1
        frames.append([(bx, by), (bx + bw, by), (bx + bw, by + bh), (bx, by + bh), (bx, by)])
        ax.text(ox + span_x / 2, by + bh, f"sip{sip}.cube{cube}", ha="center", va="bottom",
                fontsize=7)
    if frames:
        ax.add_collection(LineCollection(frames, colors="#bbbbbb", linewidths=0.6, zorder=0))
    ax.set_aspect("equal", adjustable="datalim")
    ax.autoscale_view()
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, shrink=0.7, pad=0.01,
                 label="utilisation (busy fraction of makespan)")
    ax.set_title("Utilisation over the cube mesh (nodes and intra-cube links)", fontsize=10)
    return _save(fig, path, tight=True)


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


def plot_stage_bars(wide: pl.DataFrame, path: str | os.PathLike[str], max_pes: int = 64) -> Path:
    """Stacked exclusive stage time per PE (adds up to each PE's busy span); the first
    ``max_pes`` PEs."""
    df = wide.head(max_pes)
    fig, ax = plt.subplots(figsize=(max(6, 0.22 * df.height + 2), 4))
    handles, labels = _stacked_bars(ax, {st: df[st].fill_null(0).to_numpy().astype(float) / 1000
                                         for st in STAGE_COLORS if st in df.columns})
    ax.set_xticks(range(df.height), df["pe_label"].to_list(), rotation=90, fontsize=6)
    ax.set_ylabel("time (us)")
    more = f", first {df.height} of {wide.height} PEs" if wide.height > df.height else ""
    ax.set_title(f"Stage breakdown per PE (exclusive time{more})")
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return _save(fig, path)


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
        fig, ax = plt.subplots(figsize=(max(6.0, 0.3 * ok.height + 2), 4))
        ax.bar(range(ok.height), (ms / 1000).to_list(), color="#1f77b4")
        ax.set_xticks(range(ok.height), ok["run_dir"].to_list(), rotation=90, fontsize=6)
        ax.set_ylabel("makespan (us)")
        if log_y:
            ax.set_yscale("log")
        ax.set_title("Makespan per run")
        fig.tight_layout()
        return _save(fig, path)
    panels = params[:max_panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels) + 0.8, 3.8), squeeze=False)
    for ax, dim in zip(axes[0], panels, strict=False):
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
            ax.plot(x, (g["makespan_ns"] / 1000).to_list(), marker="o", markersize=3,
                    linewidth=1.2, label=label if n < max_lines else None)
            n += 1
        vals = sorted(set(have[dim].to_list())) if numeric else []
        if numeric and vals and vals[0] > 0 and vals[-1] / vals[0] >= 8:
            ax.set_xscale("log", base=2)
            ax.set_xticks(vals, [f"{v:g}" for v in vals])
            ax.minorticks_off()
        elif not numeric:
            ax.set_xticks(range(len(cats)), cats, rotation=30, fontsize=7)
        ax.set_xlabel(dim, fontsize=8)
        ax.set_ylabel("makespan (us)")
        if log_y:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        if others and n:
            outside = {"loc": "upper left", "bbox_to_anchor": (1.0, 1.0)} if n > 3 else {}
            ax.legend(fontsize=6, title=None if n <= max_lines else f"first {max_lines} of {n}",
                      title_fontsize=6, **outside)
    more = f" (first {max_panels} of {len(params)} grid parameters)" if len(params) > max_panels else ""
    fig.suptitle(f"Makespan over the sweep{more}", fontsize=10)
    fig.tight_layout()
    return _save(fig, path, tight=True)     # legends may sit right of the panels


def plot_sweep_stages(stages: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Stacked share of PE busy time per exclusive stage, one bar per point."""
    pts = sorted(set(stages["point"].to_list())) if stages.height else []
    idx = {p: i for i, p in enumerate(pts)}
    stacks: dict[str, np.ndarray] = {}
    for point, stage, share in stages.select("point", "stage", "share").iter_rows():
        stacks.setdefault(stage, np.zeros(len(pts)))[idx[point]] = share or 0.0
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(pts) + 2.5), 3.8))
    handles, labels = _stacked_bars(ax, stacks) if stacks else ([], [])
    ax.set_xticks(range(len(pts)), [str(p) for p in pts], fontsize=7)
    ax.set_xlabel("point")
    ax.set_ylabel("share of PE busy time")
    ax.set_title("Exclusive stage mix per point")
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
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
              extent=(0.0, max(t_end_ns, 1.0) / 1000, max(1, len(pes)) - 0.5, -0.5))
    ax.set_yticks(range(len(pes)), [f"s{a}.c{b}.pe{c}" for a, b, c in pes], fontsize=6)
    ax.set_xlabel("time (us)")
    shown = len(pes)
    total = n_pes if n_pes is not None else shown
    more = f", first {shown} of {total} PEs" if total > shown else ""
    ax.set_title(f"Per-PE timeline (exclusive stage{more})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for s, c in STAGE_COLORS.items() if s != "idle"]
    ax.legend(handles, [s for s in STAGE_COLORS if s != "idle"], fontsize=6, ncol=8,
              loc="upper center", bbox_to_anchor=(0.5, 0.0), borderaxespad=6.0)
    fig.tight_layout()
    return _save(fig, path)


def plot_link_util(links: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Horizontal bars: the most utilised links."""
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.25 * links.height + 1)))
    labels = [r.replace("sip", "s").replace(".cube", ".c") for r in links["resource_id"].to_list()]
    ax.barh(range(links.height), links["util"].to_list(), color="#1f77b4")
    ax.set_yticks(range(links.height), labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("utilisation (busy fraction of makespan)")
    ax.set_title("Most utilised links")
    fig.tight_layout()
    return _save(fig, path)


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
    ax.set_yticks(y, attr["resource"].to_list(), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("makespan change (% of the recorded run)")
    ax.set_title("What would help most: each resource class made faster / slower")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return _save(fig, path)


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
        ax.legend(fontsize=7, loc="upper left")
    else:
        ax.text(0.5, 0.5, "no GEMM work with HBM traffic in this run (or no recorded peaks)",
                ha="center", va="center", transform=ax.transAxes, fontsize=9)
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("GFLOP/s (over the PE's busy span)")
    ax.set_title("Roofline per PE (GEMM work)")
    fig.tight_layout()
    return _save(fig, path)


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
                   extent=(0, makespan_ns / 1000, len(names) - 0.5, -0.5))
    ax.set_yticks(range(len(names)), [n.replace("sip", "s").replace(".cube", ".c") for n in names],
                  fontsize=6)
    ax.set_xlabel("time (us)")
    ax.set_title("Utilisation over time (busiest resources)")
    fig.colorbar(im, ax=ax, label="utilisation in window")
    fig.tight_layout()
    return _save(fig, path)
