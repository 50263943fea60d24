"""``kbtrace report``: summary tables (CSV + markdown), PNG plots and one self-contained HTML page.

Layout of the report directory (default ``RUN/report``)::

    index.html                 everything below, PNGs embedded as base64 (jinja2 template
                               templates/page.html.j2, autoescaped)
    tables/<name>.csv|.md      summary, stage_totals, stage_breakdown_pe, hotspots,
                               critical_path, utilisation_by_kind, top_links, overlap, roofline
                               (+ attribution, when `kbtrace attribute RUN` was run on it)
    mesh_heatmap.png  stage_breakdown.png  timeline.png  link_util.png  util_windows.png
    roofline.png

A sweep or a directory of runs gets the report of ``sweepreport`` instead (same page writer).
"""

from __future__ import annotations

import base64
import functools
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import jinja2
import polars as pl
from markupsafe import Markup

from kbtrace._io import atomic_dir, atomic_path
from kbtrace.analysis import frames, plots
from kbtrace.analysis.formats import render, write_frame

__all__ = ["report", "write_page", "run_inputs", "TIMELINE_PES", "UNITS_NOTE"]

TIMELINE_PES = 64     # PEs drawn in timeline.png (the first ones, by sip, cube, pe)


#: The unit policy, printed on run and sweep report pages (plots.py applies it to the plots).
UNITS_NOTE = ("Times are in ns in every table and plot (columns named *_ns, axes marked (ns)); "
              "utilisation and shares are fractions in [0, 1].")


@functools.cache
def _page_template() -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.PackageLoader("kbtrace.analysis", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    return env.get_template("page.html.j2")


def _cell(v: Any) -> tuple[str, str]:
    """(CSS class, text) of one table cell: numbers right-aligned, floats to 6 digits."""
    if isinstance(v, bool) or v is None:
        return "text", "" if v is None else str(v)
    if isinstance(v, float):
        return "num", f"{v:.6g}"
    return ("num" if isinstance(v, int) else "text"), str(v)


def _anchor(heading: str, used: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-") or "section"
    a, i = base, 2
    while a in used:
        a, i = f"{base}-{i}", i + 1
    used.add(a)
    return a


def write_page(out_dir: Path, title: str, sections: list[tuple[str, str | None, str | None]],
               tables: dict[str, pl.DataFrame], pngs: dict[str, Path], *,
               note: str | Markup | Sequence[str | Markup] | None = None, max_rows: int = 40,
               units: str | None = None) -> None:
    """``index.html`` (PNGs embedded; ``templates/page.html.j2``, autoescaped) and
    ``summary.md`` (every table) in ``out_dir``. ``sections``: (heading, table name or None,
    png name or None); ``note``: text under the title, one paragraph per item of a sequence
    (escaped unless ``markupsafe.Markup``); ``units``: the unit policy line (``UNITS_NOTE``);
    a table shows its first ``max_rows`` rows (the CSV has all)."""
    used: set[str] = set()
    secs = []
    for heading, table, png in sections:
        s: dict[str, Any] = {"heading": heading, "anchor": _anchor(heading, used), "png": None,
                             "table": None}
        if png:
            data = pngs[png].read_bytes()
            w, h = struct.unpack(">II", data[16:24])      # the IHDR chunk of a PNG
            s["png"] = {"name": png, "b64": base64.b64encode(data).decode(), "width": w,
                        "height": h}
        if table:
            df = tables[table]
            s["table"] = {"name": table, "columns": df.columns,
                          "rows": [[_cell(v) for v in r] for r in df.head(max_rows).iter_rows()],
                          "more": max(0, df.height - max_rows)}
        secs.append(s)
    lines = [] if note is None else [note] if isinstance(note, str) else list(note)
    page = _page_template().render(title=title, note_lines=lines, sections=secs, units=units)
    with atomic_path(out_dir / "index.html") as tmp:
        tmp.write_text(page)
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
    write_page(out_dir, f"kbtrace report: {r.path.name}", sections, tables, pngs,
               units=UNITS_NOTE)
