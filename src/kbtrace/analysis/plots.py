"""Matplotlib (Agg) plots of analysis frames. Each function takes frames, writes one PNG."""

from __future__ import annotations

import math
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402

__all__ = ["STAGE_COLORS", "plot_mesh_heatmap", "plot_stage_bars", "plot_timeline",
           "plot_link_util", "plot_util_windows"]

STAGE_COLORS = {
    "dma_read": "#1f77b4", "fetch": "#17becf", "gemm": "#d62728", "math": "#ff7f0e",
    "store": "#bcbd22", "dma_write": "#2ca02c", "ipcq": "#9467bd", "other": "#7f7f7f",
    "idle": "#e5e5e5",
}
_PNG_META = {"Software": None}


def _save(fig: plt.Figure, path: str | os.PathLike[str]) -> Path:
    from kbtrace._io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=90, metadata=_PNG_META)
    plt.close(fig)
    return Path(path)


def plot_mesh_heatmap(nodes: pl.DataFrame, links: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Utilisation of nodes (dots) and intra-cube links (segments), one panel per cube."""
    cubes = nodes.select("sip", "cube").unique().sort("sip", "cube").rows()
    n = max(1, len(cubes))
    cols = max(1, math.ceil(math.sqrt(n)))
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols + 1, 3.0 * rows), squeeze=False)
    cmap = plt.get_cmap("inferno_r")
    sc = None
    for i, (sip, cube) in enumerate(cubes):
        ax = axes[i // cols][i % cols]
        nd = nodes.filter((pl.col("sip") == sip) & (pl.col("cube") == cube))
        lk = links.filter((pl.col("sip") == sip) & (pl.col("cube") == cube))
        if lk.height:
            segs = [((r[0], r[1]), (r[2], r[3])) for r in lk.select("x0", "y0", "x1", "y1").rows()]
            lc = LineCollection(segs, cmap=cmap, norm=plt.Normalize(0, 1), linewidths=2)
            lc.set_array(lk["util"].to_numpy())
            ax.add_collection(lc)
        sc = ax.scatter(nd["x_mm"], nd["y_mm"], c=nd["util"], cmap=cmap, vmin=0, vmax=1, s=18,
                        edgecolors="k", linewidths=0.3)
        ax.set_title(f"sip{sip}.cube{cube}", fontsize=9)
        ax.set_aspect("equal", adjustable="datalim")
        ax.tick_params(labelsize=6)
    for j in range(len(cubes), rows * cols):
        axes[j // cols][j % cols].axis("off")
    if sc is not None:
        fig.colorbar(sc, ax=axes, shrink=0.8, label="utilisation (busy fraction of makespan)")
    fig.suptitle("Utilisation over the cube mesh (nodes and intra-cube links)", fontsize=10)
    return _save(fig, path)


def plot_stage_bars(wide: pl.DataFrame, path: str | os.PathLike[str], max_pes: int = 64) -> Path:
    """Stacked exclusive stage time per PE (adds up to each PE's busy span)."""
    df = wide.head(max_pes)
    fig, ax = plt.subplots(figsize=(max(6, 0.22 * df.height + 2), 4))
    bottom = [0.0] * df.height
    x = list(range(df.height))
    for stage, color in STAGE_COLORS.items():
        if stage not in df.columns:
            continue
        vals = [v / 1000 for v in df[stage].fill_null(0).to_list()]
        ax.bar(x, vals, bottom=bottom, color=color, label=stage, width=0.85)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(x, df["pe_label"].to_list(), rotation=90, fontsize=6)
    ax.set_ylabel("time (us)")
    ax.set_title("Stage breakdown per PE (exclusive time)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    return _save(fig, path)


def plot_timeline(seg: pl.DataFrame, path: str | os.PathLike[str], max_pes: int = 64) -> Path:
    """Per-PE timeline: exclusive stage of every instant (idle left blank)."""
    pes = seg.select("sip", "cube", "pe").unique().sort("sip", "cube", "pe").head(max_pes).rows()
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.22 * len(pes) + 1.2)))
    for row, (sip, cube, pe) in enumerate(pes):
        s = seg.filter((pl.col("sip") == sip) & (pl.col("cube") == cube) & (pl.col("pe") == pe))
        for stage, grp in s.group_by("stage", maintain_order=True):
            st = stage[0]
            bars = [(a / 1000, d / 1000) for a, d in grp.select("t0_ns", "dur_ns").rows()]
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=STAGE_COLORS.get(st, "#444444"))
    ax.set_yticks(range(len(pes)), [f"s{a}.c{b}.pe{c}" for a, b, c in pes], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    ax.set_title("Per-PE timeline (exclusive stage)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for s, c in STAGE_COLORS.items() if s != "idle"]
    ax.legend(handles, [s for s in STAGE_COLORS if s != "idle"], fontsize=6, ncol=8,
              loc="upper center", bbox_to_anchor=(0.5, -0.12))
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


def plot_util_windows(df: pl.DataFrame, makespan_ns: float, path: str | os.PathLike[str]) -> Path:
    """Heat map: busiest resources (rows) x equal time windows (columns), utilisation colour."""
    import numpy as np

    names = df["resource_id"].unique(maintain_order=True).to_list()
    n_win = int(df["win"].max() or 0) + 1 if df.height else 1
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
