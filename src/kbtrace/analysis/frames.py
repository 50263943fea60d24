"""Question -> polars frame. Report, plots and the CLI consume these; nothing here plots."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import polars as pl
import pyarrow as pa

from kbtrace.analysis._memory import release_cache

__all__ = ["summary_frame", "headline", "roofline", "roofline_total", "stage_totals", "stage_wide", "top_hotspots", "critical_path_by_kind",
           "node_util_by_kind", "top_links", "pe_overlap", "pe_segments", "pe_segment_batches", "first_pes", "n_pes", "mesh_util",
           "link_mesh_util", "util_windows", "report_frames"]


def summary_frame(run: Any) -> pl.DataFrame:
    from kbtrace.analysis.run import flat_info

    info = flat_info(run.info)
    cp = run.sql("SELECT count(*) AS n, sum(contrib_ns) AS t FROM critical_path").row(0)
    util = run.sql("SELECT max(util) FROM utilisation").item()
    rows = [("run", str(run.path)), ("run_id", str(info.get("run_id"))),
            ("workload", str(info.get("workload"))), ("topology", str(info.get("topology"))),
            ("fidelity", str(info.get("fidelity"))),
            ("makespan_ns", f"{run.makespan_ns:.3f}"),
            ("ops", str(run.sql("SELECT count(*) FROM op_timing").item())),
            ("hops", str(run.sql("SELECT count(*) FROM hops").item())),
            ("critical_path_ops", str(cp[0])), ("critical_path_ns", f"{(cp[1] or 0):.3f}"),
            ("max_resource_util", f"{(util or 0):.4f}")]
    roof = roofline_total(run)
    for key, fmt in (("gflops", ".3f"), ("peak_gflops", ".1f"), ("intensity", ".4f"),
                     ("ridge", ".4f"), ("bound", "s"), ("attainment", ".4f")):
        if roof[key] is not None:
            rows.append((f"roofline_{key}", format(roof[key], fmt)))
    return pl.DataFrame(rows, schema=["key", "value"], orient="row")


def headline(run: Any, stages: pl.DataFrame | None = None) -> dict[str, Any]:
    """Where a run's time went, in a few numbers: the exclusive stage with the most PE busy
    time (``top_stage``, ``top_stage_share``), the op kind holding most of the critical path
    (``crit_kind``, ``crit_share`` of the makespan), the resource with the most queueing
    (``hot_spot``, ``hot_spot_kind``, ``hot_spot_queue_ns``, ``hot_spot_share`` of all
    queueing) and the highest link utilisation (``max_link_util``), plus ``roofline_total``.
    None where a run has nothing to say (no queueing, no links used). ``stages``: the run's
    ``stage_totals`` if the caller has them already."""
    st = (stages if stages is not None else stage_totals(run)).head(1)
    cp = run.sql("SELECT kind, sum(contrib_ns) / (SELECT makespan_ns FROM _span) AS share "
                 "FROM critical_path GROUP BY kind ORDER BY share DESC, kind LIMIT 1")
    hs = run.sql("SELECT resource_id, kind, queue_ns, queue_share FROM hotspots ORDER BY rank LIMIT 1")
    lk = top_links(run, 1)
    out: dict[str, Any] = dict.fromkeys(
        ("top_stage", "top_stage_share", "crit_kind", "crit_share", "hot_spot", "hot_spot_kind",
         "hot_spot_queue_ns", "hot_spot_share"))
    if st.height:
        out["top_stage"], out["top_stage_share"] = st["stage"][0], st["share"][0]
    if cp.height:
        out["crit_kind"], out["crit_share"] = cp.row(0)
    if hs.height:
        (out["hot_spot"], out["hot_spot_kind"], out["hot_spot_queue_ns"],
         out["hot_spot_share"]) = hs.row(0)
    out["max_link_util"] = lk["util"][0] if lk.height else None
    out.update(roofline_total(run))
    return out


def roofline(run: Any) -> pl.DataFrame:
    """The ``roofline`` view: one row per PE with GEMM work."""
    return run.sql("SELECT * FROM roofline WHERE flops > 0 ORDER BY sip, cube, pe")


def roofline_total(run: Any) -> dict[str, Any]:
    """The run against the roofline of the PEs that did GEMM work (``n_gemm_pes``): ``gflops``
    (all their FLOPs over the makespan), ``peak_gflops`` and ``peak_hbm_gbps`` (per-PE peaks x
    those PEs), ``intensity`` (FLOP/B), ``ridge`` (FLOP/B where the roofs meet), ``bound``,
    ``roof_gflops`` and ``attainment`` (gflops / roof). None without GEMM work or peaks."""
    f, b, n, pg, pb, ms = run.sql(
        "SELECT CAST(sum(flops) AS DOUBLE), CAST(sum(hbm_bytes) AS DOUBLE), count(*), "
        "any_value(peak_gflops), "
        "any_value(peak_hbm_gbps), (SELECT makespan_ns FROM _span) FROM roofline "
        "WHERE flops > 0").row(0)
    out: dict[str, Any] = dict.fromkeys(("gflops", "peak_gflops", "peak_hbm_gbps", "intensity",
                                         "ridge", "bound", "roof_gflops", "attainment"))
    out["n_gemm_pes"] = int(n or 0)
    if not n or not ms:
        return out
    out["gflops"] = f / ms
    out["intensity"] = f / b if b else None
    if pg is None or pb is None:
        return out
    peak, bw = pg * n, pb * n
    roof = peak if out["intensity"] is None else min(peak, out["intensity"] * bw)
    out.update(peak_gflops=peak, peak_hbm_gbps=bw, ridge=pg / pb, roof_gflops=roof,
               bound="compute" if roof >= peak else "memory", attainment=out["gflops"] / roof)
    return out


def stage_totals(run: Any) -> pl.DataFrame:
    return run.sql("SELECT stage, sum(time_ns) AS time_ns, sum(time_ns) / sum(sum(time_ns)) OVER () "
                   "AS share FROM stage_breakdown_pe GROUP BY stage ORDER BY time_ns DESC, stage")


def stage_wide(run: Any) -> pl.DataFrame:
    """One row per PE (label sipS.cubeC.peP), one column per stage (ns)."""
    df = run.sql("SELECT printf('sip%d.cube%d.pe%d', sip, cube, pe) AS pe_label, sip, cube, pe, "
                 "stage, time_ns FROM stage_breakdown_pe")
    if df.height == 0:
        return df
    wide = df.pivot(on="stage", index=["pe_label", "sip", "cube", "pe"], values="time_ns")
    return wide.sort(["sip", "cube", "pe"])


def top_hotspots(run: Any, n: int = 20) -> pl.DataFrame:
    return run.sql(f"SELECT rank, resource_kind, resource_id, kind, n_queued, queue_ns, max_queue_ns, "
                   f"queue_share FROM hotspots ORDER BY rank LIMIT {int(n)}")


def critical_path_by_kind(run: Any) -> pl.DataFrame:
    return run.sql("SELECT kind, edge, count(*) AS n_ops, sum(contrib_ns) AS contrib_ns, "
                   "sum(contrib_ns) / (SELECT makespan_ns FROM _span) AS share "
                   "FROM critical_path GROUP BY kind, edge ORDER BY contrib_ns DESC, kind, edge")


def node_util_by_kind(run: Any) -> pl.DataFrame:
    return run.sql("SELECT resource_kind, kind, count(*) AS n, count(*) FILTER (WHERE n_hops > 0) AS n_used, "
                   "avg(util) AS mean_util, max(util) AS max_util, sum(queue_ns) AS queue_ns "
                   "FROM utilisation GROUP BY ALL ORDER BY max_util DESC, resource_kind, kind")


def top_links(run: Any, n: int = 25) -> pl.DataFrame:
    return run.sql(f"SELECT resource_id, kind, n_hops, nbytes, util, gbps FROM utilisation "
                   f"WHERE resource_kind = 'link' AND n_hops > 0 ORDER BY util DESC, resource_idx "
                   f"LIMIT {int(n)}")


def pe_overlap(run: Any) -> pl.DataFrame:
    return run.sql("SELECT * FROM overlap ORDER BY sip, cube, pe")


def _first_pes_sql(n: int) -> str:
    """The first ``n`` PEs with a busy span, by (sip, cube, pe): the timeline's rows."""
    return (f"SELECT sip, cube, pe FROM _pe_span WHERE sip IS NOT NULL ORDER BY sip, cube, pe "
            f"LIMIT {int(n)}")


def _pe_segments_sql(max_pes: int | None) -> str:
    pes = "" if max_pes is None else f"JOIN ({_first_pes_sql(max_pes)}) USING (sip, cube, pe) "
    return ("SELECT sip, cube, pe, t0_ns, dur_ns, stage FROM _pe_segments "
            f"{pes}WHERE stage <> 'idle' ORDER BY sip, cube, pe, t0_ns")


def pe_segments(run: Any, max_pes: int | None = None) -> pl.DataFrame:
    """Non-idle ``_pe_segments`` pieces (sip, cube, pe, t0_ns, dur_ns, stage) of every PE, or of
    the first ``max_pes`` PEs (by sip, cube, pe) that have a span; all pieces of each."""
    return run.sql(_pe_segments_sql(max_pes))


def pe_segment_batches(run: Any, max_pes: int | None = None,
                       batch_rows: int = 262_144) -> Iterator[pl.DataFrame]:
    """``pe_segments`` in frames of at most ``batch_rows`` rows (streamed from DuckDB), so a
    consumer that folds them (``plots.timeline_image``) holds one batch at a time."""
    import duckdb

    try:
        reader = run.con.sql(_pe_segments_sql(max_pes)).to_arrow_reader(batch_rows)
    except duckdb.Error as exc:  # surfaced like Run.sql's
        raise run.error(exc) from exc
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            release_cache(run.con)      # the sort's memory, before the image is drawn
            return
        except (duckdb.Error, pa.ArrowException) as exc:   # a page read mid-stream
            raise run.error(exc) from exc
        yield cast(pl.DataFrame, pl.from_arrow(batch))


def first_pes(run: Any, n: int) -> list[tuple[int, int, int]]:
    """The first ``n`` PEs with a busy span, by (sip, cube, pe)."""
    return [tuple(r) for r in run.sql(_first_pes_sql(n)).rows()]


def n_pes(run: Any) -> int:
    """PEs with a busy span (those the per-PE views cover)."""
    return int(run.sql("SELECT count(*) AS n FROM _pe_span")["n"][0])


def mesh_util(run: Any) -> pl.DataFrame:
    """Nodes inside cubes with drawing positions and utilisation."""
    return run.sql("SELECT n.sip, n.cube, n.node_id, CAST(n.kind AS VARCHAR) AS kind, n.x_mm, n.y_mm, "
                   "coalesce(u.util, 0.0) AS util FROM nodes n LEFT JOIN utilisation u "
                   "ON u.resource_kind = 'node' AND u.resource_idx = n.node_idx "
                   "WHERE n.cube IS NOT NULL ORDER BY n.sip, n.cube, n.node_idx")


def link_mesh_util(run: Any) -> pl.DataFrame:
    """Links whose both ends are in the same cube, with end positions and utilisation."""
    return run.sql("SELECT a.sip, a.cube, a.x_mm AS x0, a.y_mm AS y0, b.x_mm AS x1, b.y_mm AS y1, "
                   "coalesce(u.util, 0.0) AS util FROM links l "
                   "JOIN nodes a ON a.node_idx = l.src_idx JOIN nodes b ON b.node_idx = l.dst_idx "
                   "LEFT JOIN utilisation u ON u.resource_kind = 'link' AND u.resource_idx = l.link_idx "
                   "WHERE a.cube IS NOT NULL AND a.cube = b.cube AND a.sip = b.sip "
                   "ORDER BY a.sip, a.cube, l.link_idx")


def util_windows(run: Any, top: int = 30) -> pl.DataFrame:
    """utilisation_windows for the ``top`` busiest resources (long format)."""
    return run.sql(f"WITH t AS (SELECT resource_kind, resource_idx FROM utilisation WHERE n_hops > 0 "
                   f"ORDER BY util DESC, resource_kind, resource_idx LIMIT {int(top)}) "
                   "SELECT w.resource_id, w.win, w.t0_ns, w.util FROM utilisation_windows w "
                   "JOIN t USING (resource_kind, resource_idx) ORDER BY w.resource_id, w.win")


def report_frames(run: Any) -> dict[str, pl.DataFrame]:
    """Every summary table of the report, by file stem."""
    return {
        "summary": summary_frame(run), "stage_totals": stage_totals(run),
        "stage_breakdown_pe": stage_wide(run), "hotspots": top_hotspots(run),
        "critical_path": critical_path_by_kind(run), "utilisation_by_kind": node_util_by_kind(run),
        "top_links": top_links(run), "overlap": pe_overlap(run), "roofline": roofline(run),
    }
