"""Render query results: aligned text tables, CSV, markdown, Parquet; resolve saved queries."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from kbtrace._io import atomic_path, write_table
from kbtrace.errors import AnalysisError

__all__ = ["FORMATS", "render", "write_frame", "saved_query_dirs", "resolve_query",
           "saved_queries"]

# polars only in annotations: the CLI imports this module to build its parser, and importing
# polars costs ~140 ms on every command (kbtrace --help 0.56 -> 0.33 s without it)
if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

FORMATS = ("table", "csv", "md", "parquet")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def render(df: pl.DataFrame, fmt: str) -> str:
    """Text rendering of a frame: 'table' (aligned), 'csv' or 'md'."""
    if fmt == "csv":
        buf = io.StringIO()
        df.write_csv(buf)
        return buf.getvalue()
    rows = [[_cell(v) for v in r] for r in df.iter_rows()]
    head = list(df.columns)
    if fmt == "md":
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(out) + "\n"
    if fmt == "table":
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
        num = [df.dtypes[i].is_numeric() for i in range(len(head))]
        def line(cells: list[str]) -> str:
            return "  ".join(c.rjust(w) if n else c.ljust(w)
                             for c, w, n in zip(cells, widths, num, strict=True)).rstrip()
        out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
        out.append(f"({df.height} row{'s' if df.height != 1 else ''})")
        return "\n".join(out) + "\n"
    raise AnalysisError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")


def write_frame(df: pl.DataFrame, fmt: str, path: str | os.PathLike[str]) -> None:
    """Write a frame atomically in ``fmt`` (parquet is deterministic via _io.write_table)."""
    if fmt == "parquet":
        write_table(path, df.to_arrow())
        return
    with atomic_path(path) as tmp:
        tmp.write_text(render(df, fmt))


def saved_query_dirs() -> list[Path]:
    """Where saved queries live: ./analysis, then the repository's analysis/ next to the package."""
    here = Path(__file__).resolve().parents[3] / "analysis"
    dirs = [Path.cwd() / "analysis", here]
    seen: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [s.resolve() for s in seen]:
            seen.append(d)
    return seen


def saved_queries() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for d in reversed(saved_query_dirs()):
        for p in sorted(d.glob("*.sql")):
            out[p.stem] = p
    return dict(sorted(out.items()))


def resolve_query(text: str) -> str:
    """A saved query name (``top_hotspots``), a path to a .sql file, or SQL text as is."""
    if _NAME.match(text):
        found = saved_queries()
        if text in found:
            return found[text].read_text()
        raise AnalysisError(f"no saved query {text!r}; available: {', '.join(found) or 'none'} "
                            "(or pass SQL text in quotes)")
    if text.endswith(".sql") and Path(text).is_file():
        return Path(text).read_text()
    return text
