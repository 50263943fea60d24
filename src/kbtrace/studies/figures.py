"""Figures of the studies (matplotlib, Agg): every function takes plain lists, writes one PNG.

Conventions, so a reader can tell them apart at a glance: kbtrace's measurements are filled
bars or solid lines with filled markers; models (ideal pipelines, lower bounds) are dashed
lines; the reference's figures are black hollow diamonds or black dotted lines, labelled
"reference ...". Every axis names its quantity and unit; every figure has a legend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from kbtrace.analysis.plots import _save  # noqa: E402  (atomic PNG write, fixed metadata)

__all__ = ["stacked_bars", "grouped_bars", "bars_with_lines", "lines"]

REF_STYLE: dict[str, Any] = {"marker": "D", "markerfacecolor": "none", "markeredgecolor": "black",
             "markersize": 9, "markeredgewidth": 1.8, "linestyle": "none"}


def _finish(fig, ax, title: str, xlabel: str, ylabel: str, path: Path, legend_loc: str = "best"):
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc=legend_loc, ncol=2 if legend_loc == "upper center" else 1)
    fig.tight_layout()
    return _save(fig, path)


def stacked_bars(path: Path, names: Sequence[str], series: dict[str, Sequence[float]], *,
                 title: str, xlabel: str, ylabel: str, log: bool = False) -> Path:
    """Side-by-side bars per name (one per series; 'stacked' in the sense of one group per
    name): per-stage engine times need a log axis, where stacking would mislead."""
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(names) + 2), 4.8))
    series = {k: v for k, v in series.items() if any(float(a) > 0 for a in v)}  # drop empty
    x = np.arange(len(names))
    w = 0.8 / max(1, len(series))
    for i, (label, vals) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * w, [float(a) for a in vals], w, label=label)
    ax.set_xticks(x, names, rotation=20, ha="right")
    if log:
        ax.set_yscale("log")
        pos = [float(a) for v in series.values() for a in v if float(a) > 0]
        if pos:
            ax.set_ylim(min(pos) * 0.5, max(pos) * 8)   # headroom for the legend
    return _finish(fig, ax, title, xlabel, ylabel, path, legend_loc="upper center")


def grouped_bars(path: Path, names: Sequence[str], series: dict[str, Sequence[float]], *,
                 title: str, xlabel: str, ylabel: str, log: bool = False,
                 ref_points: dict[tuple[str, str], tuple[float, str]] | None = None,
                 variants: Sequence[str] | None = None, annotate: bool = False) -> Path:
    """Bars grouped per name, one colour per series; ``ref_points[(name, series)] = (value,
    label)`` draws a reference marker over that bar."""
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(names) + 2), 4.5))
    x = np.arange(len(names))
    keys = list(variants or series)
    w = 0.8 / max(1, len(keys))
    for i, label in enumerate(keys):
        xs = x + (i - (len(keys) - 1) / 2) * w
        bars = ax.bar(xs, [float(v) for v in series[label]], w, label=label)
        if annotate:
            for b, v in zip(bars, series[label], strict=True):
                ax.annotate(f"{v:.0f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=7)
    for (name, label), (val, text) in (ref_points or {}).items():
        i = keys.index(label) if label in keys else 0
        xi = list(names).index(name) + (i - (len(keys) - 1) / 2) * w
        ax.plot([xi], [val], label=text, **REF_STYLE)
    ax.set_xticks(x, names, rotation=20, ha="right")
    if log:
        ax.set_yscale("log")
    return _finish(fig, ax, title, xlabel, ylabel, path)


def bars_with_lines(path: Path, names: Sequence[str], bars: dict[str, Sequence[float]],
                    lines_: dict[str, Sequence[float]], *, title: str, xlabel: str,
                    ylabel: str) -> Path:
    """Measured bars per name with model curves (dashed) across the names."""
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(names) + 2), 4.5))
    x = np.arange(len(names))
    w = 0.8 / max(1, len(bars))
    for i, (label, vals) in enumerate(bars.items()):
        ax.bar(x + (i - (len(bars) - 1) / 2) * w, [float(v) for v in vals], w, label=label)
    top = 0.0
    for (label, vals), m in zip(lines_.items(), "os^v", strict=False):
        ax.plot(x, [float(v) for v in vals], linestyle="--", marker=m, label=label)
        top = max(top, *map(float, vals))
    top = max([top, *(float(v) for vals in bars.values() for v in vals)])
    ax.set_ylim(0, top * 1.45)          # room for the legend above the data
    ax.set_xticks(x, names, rotation=20, ha="right")
    return _finish(fig, ax, title, xlabel, ylabel, path, legend_loc="upper center")


def lines(path: Path | None, series: dict[str, tuple[Sequence[float], Sequence[float]]], *,
          title: str, xlabel: str, ylabel: str, logx: bool = False, logy: bool = False,
          refs: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None,
          dashed: Sequence[str] = (), ax: plt.Axes | None = None) -> Path | None:
    """Solid lines with markers (measured), dashed for the ``dashed`` labels (models), black
    dotted with hollow diamonds for ``refs``. With ``ax``, draws there and writes nothing."""
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
    assert ax is not None
    for label, (xs, ys) in series.items():
        style = "--" if label in dashed else "-"
        ax.plot(list(xs), list(ys), linestyle=style, marker="o" if style == "-" else None,
                markersize=4, label=label)
    for label, (xs, ys) in (refs or {}).items():
        ax.plot(list(xs), list(ys), color="black", linestyle=":", marker="D",
                markerfacecolor="none", markersize=7, label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if not own:
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        return None
    assert path is not None
    return _finish(fig, ax, title, xlabel, ylabel, path)
