"""Write query results (the ``kbtrace._tables`` formats, and Parquet); resolve saved queries."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from kbtrace._io import atomic_path, write_table
from kbtrace._tables import TABLE_FORMATS, add_format, md_cell, render
from kbtrace.errors import AnalysisError, UsageError

__all__ = ["FORMATS", "TABLE_FORMATS", "render", "write_frame", "saved_query_dirs",
           "resolve_query", "saved_queries", "add_format", "md_cell"]

# polars only in annotations: the CLI imports this module to build its parser, and importing
# polars costs ~140 ms on every command (kbtrace --help 0.56 -> 0.33 s without it)
if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

#: ``kbtrace sql`` also writes Parquet (with ``-o``)
FORMATS = (*TABLE_FORMATS, "parquet")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def write_frame(df: pl.DataFrame, fmt: str, path: str | os.PathLike[str],
                inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
    """Write a frame atomically in ``fmt`` (parquet is deterministic via _io.write_table);
    ``path`` may not be one of ``inputs`` nor lie inside one (``_io.atomic_path``)."""
    if fmt == "parquet":
        write_table(path, df.to_arrow(), inputs)
        return
    with atomic_path(path, inputs) as tmp:
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


_HOW = "pass SQL text in quotes, a saved query name (e.g. top_hotspots) or a .sql file"


_PATHISH = re.compile(r"^[\w.~:/\\-]*[/\\][\w.~:/\\-]*$")


def _looks_like_path(text: str) -> bool:
    """One token ending in ``.sql``, or made of path characters with a ``/``: no SQL
    statement is (``SELECT(1/2)`` has parentheses)."""
    return not any(c.isspace() for c in text) and (
        text.lower().endswith(".sql") or bool(_PATHISH.match(text)))


def _read_query_file(path: Path) -> str:
    try:
        sql = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the SQL file ({exc}); {_HOW}") from None
    if not sql.strip():
        raise UsageError(f"{path}: the SQL file is empty; write a query in it, or {_HOW}")
    return sql


def resolve_query(text: str) -> str:
    """A saved query name (``top_hotspots``), a path to a .sql file, or SQL text as is.

    Empty text, and a path (one token ending in ``.sql`` or holding a ``/``) that names no
    file, are ``UsageError``s rather than SQL syntax errors."""
    query = text.strip()
    if not query:
        raise UsageError(f"the SQL query is empty; {_HOW}")
    if _NAME.match(query):
        found = saved_queries()
        if query in found:
            return _read_query_file(found[query])
        raise AnalysisError(f"no saved query {query!r}; available: {', '.join(found) or 'none'} "
                            "(or pass SQL text in quotes)")
    path = Path(query)
    if _looks_like_path(query):
        if path.is_file():
            return _read_query_file(path)
        raise UsageError(f"{query}: no such file; check the path of the .sql file, or pass "
                         "SQL text in quotes or a saved query name (e.g. top_hotspots)")
    if query.endswith(".sql") and path.is_file():     # a path with spaces
        return _read_query_file(path)
    return text
