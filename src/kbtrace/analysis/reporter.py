"""``kbtrace report``: summary tables (CSV + markdown), PNG plots and one self-contained HTML page.

Layout of the report directory (default ``RUN/report``)::

    index.html                 everything below, PNGs embedded as base64
    tables/<name>.csv|.md      summary, stage_totals, stage_breakdown_pe, hotspots,
                               critical_path, utilisation_by_kind, top_links, overlap, roofline
                               (+ attribution, when `kbtrace attribute RUN` was run on it)
    mesh_heatmap.png  stage_breakdown.png  timeline.png  link_util.png  util_windows.png
    roofline.png

A sweep or a directory of runs gets the report of ``sweepreport`` instead (same page writer).
"""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path
from typing import Any, cast

import polars as pl

from kbtrace._io import atomic_dir, atomic_path
from kbtrace.analysis import frames, plots
from kbtrace.analysis.formats import render, write_frame

__all__ = ["report", "write_page", "run_inputs", "TIMELINE_PES"]

TIMELINE_PES = 64     # PEs drawn in timeline.png (the first ones, by sip, cube, pe)


def _html_table(df: pl.DataFrame, max_rows: int = 40) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = []
    for r in df.head(max_rows).iter_rows():
        cells = "".join(f"<td>{html.escape(f'{v:.6g}' if isinstance(v, float) else str(v))}</td>"
                        for v in r)
        body.append(f"<tr>{cells}</tr>")
    more = f"<p class=more>{df.height - max_rows} more rows in the CSV</p>" if df.height > max_rows else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


_CSS = ("body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;"
        "font-size:12px;margin-bottom:1em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
        "th{background:#eee}img{max-width:100%;border:1px solid #ddd}h2{margin-top:1.5em}")


def write_page(out_dir: Path, title: str, sections: list[tuple[str, str | None, str | None]],
               tables: dict[str, pl.DataFrame], pngs: dict[str, Path], *, note: str | None = None,
               max_rows: int = 40) -> None:
    """``index.html`` (PNGs embedded) and ``summary.md`` (every table) in ``out_dir``;
    ``sections``: (heading, table name or None, png name or None); ``note``: HTML under the title."""
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    if note:
        parts.append(f"<p>{note}</p>")
    for heading, table, png in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        if png:
            b64 = base64.b64encode(pngs[png].read_bytes()).decode()
            parts.append(f'<img alt="{png}" src="data:image/png;base64,{b64}">')
        if table:
            parts.append(_html_table(tables[table], max_rows))
    parts.append("</body></html>\n")
    with atomic_path(out_dir / "index.html") as tmp:
        tmp.write_text("\n".join(parts))
    with atomic_path(out_dir / "summary.md") as tmp:
        tmp.write_text("\n".join(f"## {n}\n\n{render(df, 'md')}" for n, df in tables.items()))


def run_inputs(dirs: Any, trace_dir: Path | None = None, skip: tuple[str, ...] = ("report",)
               ) -> list[Path]:
    """What a report (or any output) over run or sweep directories ``dirs`` reads, as paths an
    output may not be, contain or lie inside (``_owned.check_inputs``): every entry of each
    directory but its own ``report`` (so the default ``RUN/report`` can be rewritten while
    ``-o RUN`` cannot), and the trace directory."""
    out: list[Path] = []
    for d in dirs:
        out.extend(p for p in sorted(Path(d).iterdir()) if p.name not in skip)
    return [*out, *([trace_dir] if trace_dir is not None else [])]


def report(run: Any, out: str | os.PathLike[str] | None = None) -> Path:
    """Write the report for a run (path or open Run), or for a sweep / directory of runs
    (``sweepreport.report_sweep``); return the report directory."""
    from kbtrace.analysis.run import Run, open_run
    from kbtrace.analysis.sweepreport import is_run_set, report_sweep

    if isinstance(run, Run) and (len(run.run_dirs) > 1 or run.path != run.run_dirs[0]):
        return report_sweep(run.path, out)
    if not isinstance(run, Run) and is_run_set(run):
        return report_sweep(run, out)
    owned = not isinstance(run, Run)
    r = open_run(run) if owned else run
    try:
        out_dir = Path(out) if out else r.path / "report"
        if owned:   # the report reads these views several times; a caller's Run is left as is
            r.materialize()
        tables = frames.report_frames(r)
        # built beside OUT and swapped in whole: an interrupted report leaves the earlier one
        with atomic_dir(out_dir, "report", run_inputs(r.run_dirs, r.trace_dir)) as stage:
            _write_run_report(r, tables, stage)
        return out_dir
    finally:
        if owned:
            r.close()


def _attribution(run_dir: Path, run_id: str | None) -> pl.DataFrame | None:
    """``RUN/attribution/attribution.parquet`` (``schema.ATTRIBUTION``) when it was made from
    this run (its attribution.json names the run id), else None."""
    import json

    import pyarrow.parquet as pq

    from kbtrace import schema
    d = run_dir / "attribution"
    if not (d / "attribution.parquet").is_file() or not (d / "attribution.json").is_file():
        return None
    try:
        made_from = json.loads((d / "attribution.json").read_text()).get("run_id")
    except (ValueError, AttributeError):
        return None
    if run_id is not None and made_from != run_id:
        return None                # an attribution of an earlier run of this directory
    t = pq.read_table(d / "attribution.parquet")
    schema.check_schema(t.schema, schema.ATTRIBUTION, str(d / "attribution.parquet"))
    return cast(pl.DataFrame, pl.from_arrow(t.select([f.name for f in schema.ATTRIBUTION])))


def _write_run_report(r: Any, tables: dict[str, pl.DataFrame], out_dir: Path) -> None:
    for name, df in tables.items():
        write_frame(df, "csv", out_dir / "tables" / f"{name}.csv")
        write_frame(df, "md", out_dir / "tables" / f"{name}.md")
    pngs = {
        "mesh_heatmap": plots.plot_mesh_heatmap(frames.mesh_util(r), frames.link_mesh_util(r),
                                                out_dir / "mesh_heatmap.png"),
        "stage_breakdown": plots.plot_stage_bars(tables["stage_breakdown_pe"],
                                                 out_dir / "stage_breakdown.png"),
        "timeline": plots.plot_timeline(frames.pe_segment_batches(r, TIMELINE_PES),
                                        out_dir / "timeline.png", TIMELINE_PES,
                                        frames.n_pes(r), r.makespan_ns,
                                        pes=frames.first_pes(r, TIMELINE_PES)),
        "link_util": plots.plot_link_util(tables["top_links"], out_dir / "link_util.png"),
        "util_windows": plots.plot_util_windows(frames.util_windows(r), r.makespan_ns,
                                                out_dir / "util_windows.png"),
        "roofline": plots.plot_roofline(tables["roofline"], out_dir / "roofline.png"),
    }
    sections = [("Summary", "summary", None), ("Stage totals (all PEs)", "stage_totals", None),
                ("Stage breakdown per PE", "stage_breakdown_pe", "stage_breakdown"),
                ("Per-PE timeline", None, "timeline"),
                ("Utilisation heat map", "utilisation_by_kind", "mesh_heatmap"),
                ("Utilisation over time", None, "util_windows"),
                ("Links", "top_links", "link_util"),
                ("Queueing hot spots", "hotspots", None),
                ("Critical path by op kind", "critical_path", None),
                ("Roofline", "roofline", "roofline"),
                ("Comm/compute overlap per PE", "overlap", None)]
    attr = _attribution(r.path, r.info.get("run_id"))
    if attr is not None:     # `kbtrace attribute RUN` was run on this very run
        tables["attribution"] = attr
        write_frame(attr, "csv", out_dir / "tables" / "attribution.csv")
        write_frame(attr, "md", out_dir / "tables" / "attribution.md")
        pngs["tornado"] = plots.plot_tornado(attr, out_dir / "tornado.png")
        sections.insert(1, ("What would help most (kbtrace attribute)", "attribution",
                            "tornado"))
    write_page(out_dir, f"kbtrace report: {r.path.name}", sections, tables, pngs)
