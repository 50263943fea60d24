"""Report over many runs: a sweep (``points.parquet``) or any directory of run directories.

One row per point: its workload (the workload entry of the config: a workload with a
``grid`` of its own parameters is one workload over several traces), grid values (for a
sweep), makespan, speed-up against the slowest point of the same workload, and the run's
headline (``frames.headline``: top exclusive stage,
critical-path op kind, queueing hot spot, busiest link, GEMM GFLOP/s, roofline bound and
attainment); plus each point's exclusive stage totals. Plots:
makespan against each swept parameter, and the stage mix per point. Each point's own
report is one ``kbtrace report POINT_DIR`` away (the tables give the directories).

Layout of the report directory (default ``SWEEP/report``)::

    index.html                 everything below, PNGs embedded as base64
    tables/tuning.csv|.md      (sweeps over a workload's own parameters) the fastest
                               combination per workload and machine
    tables/points.csv|.md      one row per point
    tables/stages.csv|.md      point x exclusive stage: time_ns, share of PE busy time
    tables/stage_shares.csv|.md  the same shares, one row per point (the page shows this one)
    sweep_makespan.png  sweep_stages.png
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
from markupsafe import Markup

from kbtrace import schema
from kbtrace.errors import AnalysisError

__all__ = ["is_run_set", "point_frames", "workload_grid_keys", "tuning_frame",
           "stage_shares_frame", "report_sweep"]

_CATEGORIES = ("trace", "topology", "fidelity")
_HEADLINE = ("top_stage", "top_stage_share", "crit_kind", "crit_share", "hot_spot",
             "hot_spot_share", "max_link_util", "gflops", "bound",
             "attainment")   # frames.headline keys shown per point


def is_run_set(path: str | os.PathLike[str]) -> bool:
    """A sweep directory or a directory holding run directories (not a run itself)."""
    p = Path(path)
    return p.is_dir() and not (p / "run.json").is_file() and (
        (p / "points.parquet").is_file() or any(p.rglob("run.json")))


def _sweep_json(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The sweep's ``sweep.json`` ({} for a plain directory of runs)."""
    f = Path(root) / "sweep.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def _config_traces(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The traces of the sweep's resolved config (name, and base / grid when gridded)."""
    return (_sweep_json(root).get("config") or {}).get("traces", [])


def _points(root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """(point rows, grid parameter names): from points.parquet, else every run.json below.
    Each row's ``workload`` is its trace's workload entry (``base`` of a gridded workload in
    sweep.json), else the trace itself."""
    pts = root / "points.parquet"
    if _sweep_json(root).get("status") == "running":
        raise AnalysisError(f"{root}: the sweep was interrupted before it finished (sweep.json "
                            f"status: running); finish it with `kbtrace sweep CONFIG -o {root} "
                            f"--resume`")
    if pts.is_file():
        t = pq.read_table(pts)
        fixed = set(schema.SWEEP_POINTS.names)
        params = [c for c in t.column_names if c not in fixed]
        base = {tr.get("name"): tr.get("base") or tr.get("name") for tr in _config_traces(root)}
        rows = t.to_pylist()
        for r in rows:
            r["workload"] = base.get(r["trace"], r["trace"])
        return rows, params
    from kbtrace.analysis.run import flat_info, read_run_json

    rows = []
    for i, d in enumerate(sorted(p.parent for p in root.rglob("run.json"))):
        info = flat_info(read_run_json(d))
        rows.append({"point": i, "trace": info.get("workload") or "",
                     "workload": info.get("workload") or "", "topology":
                     info.get("topology") or "", "fidelity": info.get("fidelity") or "",
                     "run_dir": d.relative_to(root).as_posix(), "status": "ok", "error": None,
                     "run_id": info.get("run_id"), "makespan_ns": info.get("makespan_ns"),
                     "ops": info.get("ops"), "hops": info.get("hops"), "events": info.get("events")})
    if not rows:
        raise AnalysisError(f"{root}: no runs below it (no run.json); pass a run, a sweep or a "
                            "directory of runs")
    return rows, []


def point_frames(root: str | os.PathLike[str]) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """``(points, stages, params)``: one row per point (workload, grid values, makespan,
    ``speedup`` against the slowest point of the same workload, the headline of its run), the exclusive
    stage totals per point (long format), and the grid parameter names (empty for a plain
    set of runs)."""
    from kbtrace.analysis.frames import headline, stage_totals
    from kbtrace.analysis.run import open_run

    root = Path(root)
    rows, params = _points(root)
    out, stages = [], []
    for r in rows:
        row: dict[str, Any] = {"point": r["point"], "workload": r["workload"]}
        row.update({c: r[c] for c in _CATEGORIES})
        row.update({p: r[p] for p in params})
        row.update(status=r["status"], makespan_ns=r["makespan_ns"], ops=r["ops"],
                   hops=r["hops"], run_dir=r["run_dir"], error=r["error"])
        h: dict[str, Any] = {}
        if r["status"] == "ok":
            with open_run(root / r["run_dir"]) as run:
                st = stage_totals(run)
                h = headline(run, st)
            stages += [{"point": r["point"], "stage": s, "time_ns": t, "share": sh}
                       for s, t, sh in st.iter_rows()]
        for k in _HEADLINE:
            row[k] = h.get(k)
        out.append(row)
    points = pl.DataFrame(out, infer_schema_length=None)
    points = points.with_columns(   # only points of one workload are comparable
        (pl.col("makespan_ns").max().over("workload") / pl.col("makespan_ns")).alias("speedup")
    ).select("point", "workload", *_CATEGORIES, *params, "status", "makespan_ns", "speedup",
             *_HEADLINE, "ops", "hops", "run_dir", "error")
    stage_df = (pl.DataFrame(stages, schema={"point": pl.Int64, "stage": pl.Utf8,
                                             "time_ns": pl.Float64, "share": pl.Float64})
                .sort("point", "stage"))
    return points, stage_df, params


def workload_grid_keys(root: str | os.PathLike[str]) -> list[str]:
    """The workload parameters a sweep grids over (its config's workload ``grid`` keys)."""
    return list(dict.fromkeys(k for t in _config_traces(root) for k in (t.get("grid") or {})))


def tuning_frame(points: pl.DataFrame, params: list[str], wkeys: list[str]) -> pl.DataFrame:
    """For each gridded workload on each machine (topology, fidelity and topology grid
    values), its fastest combination of workload grid values (all of them on a tie): the
    tuning answer of a sweep over a workload's own parameters. ``speedup``: against the
    slowest combination there. Workloads without a grid are left out."""
    machine = ["workload", "topology", "fidelity", *[p for p in params if p not in wkeys]]
    if not wkeys:
        return pl.DataFrame()
    ok = points.filter((pl.col("status") == "ok")       # only workloads gridded over a key
                       & pl.any_horizontal(pl.col(k).is_not_null() for k in wkeys))
    if not ok.height:
        return pl.DataFrame()
    ranked = ok.with_columns(
        (pl.col("makespan_ns").max().over(machine) / pl.col("makespan_ns")).alias("speedup"),
        pl.col("makespan_ns").rank("min").over(machine).alias("_rank"))
    return (ranked.filter(pl.col("_rank") == 1)         # every equal-best combination
            .select(*machine, *wkeys, "makespan_ns", "speedup", "point")
            .sort(*machine, "point"))


def stage_shares_frame(stages: pl.DataFrame) -> pl.DataFrame:
    """``stages`` (long: point, stage, time_ns, share) as one row per point and one share
    column per exclusive stage (``schema.BREAKDOWN_STAGES`` order, then idle): the page's
    view of it (a few rows where the long table has ten per point)."""
    order = [*schema.BREAKDOWN_STAGES, "idle"]
    if not stages.height:
        return pl.DataFrame({"point": []}, schema={"point": pl.Int64})
    wide = stages.pivot(on="stage", index="point", values="share").sort("point")
    return wide.select("point", *[c for c in order if c in wide.columns])


def report_sweep(root: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Write the report of a sweep or directory of runs; return the report directory."""
    root = Path(root)
    out_dir = Path(out) if out else root / "report"
    points, stages, params = point_frames(root)
    tables = {"points": points, "stages": stages, "stage_shares": stage_shares_frame(stages)}
    tuning = tuning_frame(points, params, workload_grid_keys(root))
    if tuning.height:
        tables = {"tuning": tuning, **tables}
    from kbtrace._io import atomic_dir
    from kbtrace.analysis.reporter import run_inputs

    # built beside OUT and swapped in whole (an interrupted report leaves the earlier one)
    with atomic_dir(out_dir, "report", run_inputs([root])) as stage:
        _write_sweep_report(root, stage, points, stages, params, tables)
    return out_dir


def _write_sweep_report(root: Path, out_dir: Path, points: pl.DataFrame, stages: pl.DataFrame,
                        params: list[str], tables: dict[str, pl.DataFrame]) -> None:
    from kbtrace.analysis import plots
    from kbtrace.analysis.formats import write_frame
    from kbtrace.analysis.reporter import UNITS_NOTE, write_page

    for name, df in tables.items():
        write_frame(df, "csv", out_dir / "tables" / f"{name}.csv")
        write_frame(df, "md", out_dir / "tables" / f"{name}.md")
    # lines: per workload (the traces of a gridded workload are points on its lines),
    # topology and fidelity
    groups = tuple(c for c in ("workload", "topology", "fidelity") if points[c].n_unique() > 1)
    pngs = {"sweep_makespan": plots.plot_sweep_makespan(points, params,
                                                        out_dir / "sweep_makespan.png", groups),
            "sweep_stages": plots.plot_sweep_stages(stages, out_dir / "sweep_stages.png")}
    failed = points.filter(pl.col("status") != "ok").height
    source = _sweep_json(root).get("source")
    note = Markup("{} <code>kbtrace report {}</code>.").format(
        f"{points.height} point(s), {failed} failed"
        + (f"; config {Path(source).name}" if source else "") + ". Each point's own report:",
        f"{root.name}/<run_dir>")
    sections = [("Makespan", None, "sweep_makespan"),
                *([("Fastest workload parameters per machine", "tuning", None)]
                  if "tuning" in tables else []),
                ("Points", "points", None),
                ("Where the PE time went, per point (share of PE busy time)", "stage_shares",
                 "sweep_stages")]
    write_page(out_dir, f"kbtrace sweep report: {root.name}", sections, tables, pngs, note=note,
               max_rows=200, units=UNITS_NOTE)
